//! What `ballast upgrade` re-renders from: the configuration and key material
//! of an installed control plane, read back from its objects (JSON as the
//! API server returns them). Pure: the CLI fetches the objects.

use crate::{
    manifests::{
        self, DESTINATION, INJECTOR, INJECTOR_TLS_SECRET, ISSUER_SECRET, TRUST_ROOTS_CONFIG_MAP,
    },
    pki::{IdentityPki, WebhookTls},
    DestinationSize, FailurePolicy, InstallConfig, KeyMaterial, HA_REPLICAS,
};
use base64::Engine;
use serde_json::Value;

/// Why an installed control plane cannot be re-rendered.
#[derive(Debug, thiserror::Error)]
pub enum InstalledError {
    #[error("{0} is not installed in namespace {1} (run `ballast install` first)")]
    Missing(String, String),
    #[error("{what} has no {field}")]
    Field { what: String, field: String },
}

/// The objects `read` needs, as fetched from the cluster.
pub struct InstalledObjects<'a> {
    pub namespace: &'a str,
    pub deployments: &'a [Value],
    pub trust_roots: Option<&'a Value>,
    pub issuer: Option<&'a Value>,
    pub injector_tls: Option<&'a Value>,
    pub webhook_configuration: Option<&'a Value>,
}

/// The value of `--flag=VALUE` in a container's args.
fn flag<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    let prefix = format!("{flag}=");
    container["args"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&prefix))
}

fn first_container<'a>(deployments: &'a [Value], name: &str) -> Option<&'a Value> {
    deployments
        .iter()
        .find(|d| d["metadata"]["name"] == name)?
        .pointer("/spec/template/spec/containers/0")
}

fn data(object: &Value, key: &str, what: &str, base64: bool) -> Result<String, InstalledError> {
    let missing = || InstalledError::Field {
        what: what.to_string(),
        field: key.to_string(),
    };
    let text = object["data"][key].as_str().ok_or_else(missing)?;
    if !base64 {
        return Ok(text.to_string());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| missing())?;
    String::from_utf8(bytes).map_err(|_| missing())
}

/// The configuration and key material the installed objects were rendered
/// from: upgrading keeps the trust anchors, the issuer and the webhook's
/// certificate, and every setting install took a flag for.
pub fn read(
    objects: &InstalledObjects<'_>,
) -> Result<(InstallConfig, KeyMaterial), InstalledError> {
    let ns = objects.namespace;
    let missing = |what: &str| InstalledError::Missing(what.to_string(), ns.to_string());
    let destination = first_container(objects.deployments, DESTINATION)
        .ok_or_else(|| missing(&format!("Deployment {DESTINATION}")))?;
    let injector = first_container(objects.deployments, INJECTOR);
    let defaults = InstallConfig::default();
    let replicas = objects
        .deployments
        .iter()
        .find(|d| d["metadata"]["name"] == DESTINATION)
        .and_then(|d| d["spec"]["replicas"].as_u64());
    let webhook = objects
        .webhook_configuration
        .and_then(|w| w.pointer("/webhooks/0"));
    let config = InstallConfig {
        namespace: ns.to_string(),
        controller_image: destination["image"]
            .as_str()
            .unwrap_or(&defaults.controller_image)
            .to_string(),
        proxy_image: injector
            .and_then(|c| flag(c, "--proxy-image"))
            .unwrap_or(&defaults.proxy_image)
            .to_string(),
        init_image: injector
            .and_then(|c| flag(c, "--init-image"))
            .unwrap_or(&defaults.init_image)
            .to_string(),
        image_pull_policy: destination["imagePullPolicy"]
            .as_str()
            .unwrap_or(&defaults.image_pull_policy)
            .to_string(),
        cluster_domain: flag(destination, "--cluster-domain")
            .unwrap_or(&defaults.cluster_domain)
            .to_string(),
        trust_domain: flag(destination, "--identity-trust-domain")
            .unwrap_or(&defaults.trust_domain)
            .to_string(),
        log_level: destination["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == "BALLAST_LOG"))
            .and_then(|e| e["value"].as_str())
            .unwrap_or(&defaults.log_level)
            .to_string(),
        ha: replicas == Some(u64::from(HA_REPLICAS)),
        webhook_failure_policy: match webhook.and_then(|w| w["failurePolicy"].as_str()) {
            Some("Fail") => FailurePolicy::Fail,
            _ => FailurePolicy::Ignore,
        },
        webhook_timeout_seconds: webhook
            .and_then(|w| w["timeoutSeconds"].as_u64())
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(defaults.webhook_timeout_seconds),
        // Whether CRDs were applied is not recorded; `upgrade` prints none
        // unless asked (they are the same for every version so far).
        crds: false,
        // Any allocator setting with huge pages counts (an older install's
        // had no `narenas`): an upgrade then renders today's.
        controller_huge_pages: destination["env"].as_array().is_some_and(|env| {
            let (name, _) = crate::HEAP_HUGE_PAGES_ENV;
            env.iter().any(|e| {
                e["name"] == name
                    && e["value"]
                        .as_str()
                        .is_some_and(|v| v.split(',').any(|o| o == "thp:always"))
            })
        }),
        destination: {
            let resources = &destination["resources"];
            // A quantity is a string in the API; a bare number in YAML
            // (`cpu: 1`) reads as one too.
            let or = |v: &Value, default: &str| match v {
                Value::String(q) => q.clone(),
                Value::Number(n) => n.to_string(),
                _ => default.to_string(),
            };
            let size = DestinationSize::default();
            DestinationSize {
                cpu_request: or(&resources["requests"]["cpu"], &size.cpu_request),
                memory_request: or(&resources["requests"]["memory"], &size.memory_request),
                memory_limit: or(&resources["limits"]["memory"], &size.memory_limit),
                max_streams: flag(destination, "--max-streams").and_then(|n| n.parse().ok()),
            }
        },
    };
    let roots_what = format!("ConfigMap {ns}/{TRUST_ROOTS_CONFIG_MAP}");
    let issuer_what = format!("Secret {ns}/{ISSUER_SECRET}");
    let tls_what = format!("Secret {ns}/{INJECTOR_TLS_SECRET}");
    let trust_roots = objects.trust_roots.ok_or_else(|| missing(&roots_what))?;
    let issuer = objects.issuer.ok_or_else(|| missing(&issuer_what))?;
    let injector_tls = objects.injector_tls.ok_or_else(|| missing(&tls_what))?;
    let ca_bundle = webhook
        .and_then(|w| w["clientConfig"]["caBundle"].as_str())
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            missing(&format!(
                "MutatingWebhookConfiguration {}'s caBundle",
                manifests::WEBHOOK_CONFIGURATION
            ))
        })?;
    let material = KeyMaterial {
        identity: IdentityPki {
            trust_anchors_pem: data(trust_roots, "ca-bundle.crt", &roots_what, false)?,
            issuer_cert_pem: data(issuer, "tls.crt", &issuer_what, true)?,
            issuer_key_pem: data(issuer, "tls.key", &issuer_what, true)?,
        },
        webhook: WebhookTls {
            ca_pem: ca_bundle,
            cert_pem: data(injector_tls, "tls.crt", &tls_what, true)?,
            key_pem: data(injector_tls, "tls.key", &tls_what, true)?,
        },
    };
    Ok((config, material))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back what an install printed (in namespace `mesh`).
    fn read_yaml(text: &str) -> Result<(InstallConfig, KeyMaterial), InstalledError> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("parses");
        let find = |kind: &str, name: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        };
        let deployments: Vec<Value> = docs
            .iter()
            .filter(|d| d["kind"] == "Deployment")
            .cloned()
            .collect();
        read(&InstalledObjects {
            namespace: "mesh",
            deployments: &deployments,
            trust_roots: find("ConfigMap", TRUST_ROOTS_CONFIG_MAP),
            issuer: find("Secret", ISSUER_SECRET),
            injector_tls: find("Secret", INJECTOR_TLS_SECRET),
            webhook_configuration: find(
                "MutatingWebhookConfiguration",
                manifests::WEBHOOK_CONFIGURATION,
            ),
        })
    }

    /// What `install` renders reads back as the configuration and key
    /// material it was rendered from.
    #[test]
    fn install_output_reads_back_as_its_configuration_and_key_material() {
        let config = InstallConfig {
            namespace: "mesh".into(),
            controller_image: "reg/ballast:v1".into(),
            proxy_image: "reg/ballast-proxy:v1".into(),
            cluster_domain: "corp.local".into(),
            trust_domain: "example.org".into(),
            log_level: "debug".into(),
            ha: true,
            webhook_failure_policy: FailurePolicy::Fail,
            webhook_timeout_seconds: 7,
            crds: false,
            // Not the default, as every field above.
            controller_huge_pages: false,
            destination: DestinationSize {
                cpu_request: "2".into(),
                memory_request: "512Mi".into(),
                memory_limit: "1Gi".into(),
                max_streams: Some(50_000),
            },
            ..InstallConfig::default()
        };
        let material = KeyMaterial {
            identity: IdentityPki::generate(&config.trust_domain).expect("pki"),
            webhook: WebhookTls::generate(
                INJECTOR,
                &config.namespace,
                &config.cluster_domain,
                crate::pki::WEBHOOK_CERT_LIFETIME,
            )
            .expect("webhook tls"),
        };
        let (read_config, read_material) =
            read_yaml(&crate::install_yaml(&config, &material)).expect("reads back");
        assert_eq!(format!("{read_config:?}"), format!("{config:?}"));
        assert_eq!(format!("{read_material:?}"), format!("{material:?}"));

        // Huge pages, as rendered today and as an older install asked for
        // them (without `narenas`): both read back as on.
        let (_, today) = crate::HEAP_HUGE_PAGES_ENV;
        for value in [today, "thp:always,metadata_thp:always"] {
            let huge = InstallConfig {
                controller_huge_pages: true,
                ..config.clone()
            };
            let text = crate::install_yaml(&huge, &material).replace(today, value);
            assert!(text.contains(value));
            let (read_huge, _) = read_yaml(&text).expect("reads back");
            assert!(read_huge.controller_huge_pages, "{value}");
        }
        // Nothing installed: said, naming what is missing.
        let e = read(&InstalledObjects {
            namespace: "mesh",
            deployments: &[],
            trust_roots: None,
            issuer: None,
            injector_tls: None,
            webhook_configuration: None,
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("Deployment ballast-destination"),
            "{e}"
        );
    }
}
