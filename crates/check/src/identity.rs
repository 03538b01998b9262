//! Checks of the mesh's PKI: the trust anchors (the identity controller's
//! trust-roots ConfigMap) and the issuer (its issuer Secret) parse, are
//! valid now and for the warning period, and the issuer is signed by an
//! anchor. Names are read from the identity Deployment's volumes, falling
//! back to Linkerd's (which deploy/identity.yaml uses).

use crate::control_plane::IDENTITY;
use crate::report::{CheckResult, Finding, ObjectRef, Source};
use crate::snapshot::{array, text, Snapshot};
use crate::Config;
use base64::Engine as _;
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};
use x509_parser::prelude::{FromDer, X509Certificate};

const CATEGORY: &str = "identity";

pub const ANCHORS: &str = "trust anchors are valid";
pub const ISSUER: &str = "issuer certificate is valid and issued by a trust anchor";

/// Linkerd's trust roots ConfigMap, and its key.
pub const TRUST_ROOTS_CONFIGMAP: &str = "linkerd-identity-trust-roots";
pub const TRUST_ROOTS_KEY: &str = "ca-bundle.crt";
/// Linkerd's issuer Secret, and the keys its certificate may be under
/// (`kubernetes.io/tls`, then Linkerd's legacy name).
pub const ISSUER_SECRET: &str = "linkerd-identity-issuer";
pub const ISSUER_KEYS: [&str; 2] = ["tls.crt", "crt.pem"];

/// Where the identity controller reads its PKI from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PkiObjects {
    pub trust_roots_configmap: String,
    pub trust_roots_key: String,
    pub issuer_secret: String,
}

impl PkiObjects {
    /// From the identity Deployment (its volumes and `--trust-anchors`),
    /// else Linkerd's names.
    pub fn of(deployment: Option<&Value>) -> PkiObjects {
        let volumes = deployment.map_or(&[][..], |d| array(d, "/spec/template/spec/volumes"));
        let find = |pointer: &str, default: &str| {
            volumes
                .iter()
                .map(|v| text(v, pointer))
                .find(|n| !n.is_empty())
                .unwrap_or(default)
                .to_string()
        };
        let key = deployment
            .into_iter()
            .flat_map(|d| array(d, "/spec/template/spec/containers"))
            .flat_map(|c| crate::pods::flag_values(c, "--trust-anchors"))
            .find_map(|path| path.rsplit('/').next().filter(|k| !k.is_empty()))
            .unwrap_or(TRUST_ROOTS_KEY)
            .to_string();
        PkiObjects {
            trust_roots_configmap: find("/configMap/name", TRUST_ROOTS_CONFIGMAP),
            trust_roots_key: key,
            issuer_secret: find("/secret/secretName", ISSUER_SECRET),
        }
    }

    pub fn in_snapshot(snap: &Snapshot, config: &Config) -> PkiObjects {
        PkiObjects::of(snap.find("Deployment", &config.namespace, IDENTITY))
    }
}

/// One parsed certificate's facts.
struct Cert {
    der: Vec<u8>,
    subject: String,
    not_before: i64,
    not_after: i64,
    is_ca: bool,
}

fn parse_pem(bytes: &[u8]) -> Result<Vec<Cert>, String> {
    let mut certs = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(bytes) {
        let pem = pem.map_err(|e| format!("not PEM: {e}"))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        let (_, c) = X509Certificate::from_der(&pem.contents)
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        certs.push(Cert {
            subject: c.subject().to_string(),
            not_before: c.validity().not_before.timestamp(),
            not_after: c.validity().not_after.timestamp(),
            is_ca: c.is_ca(),
            der: pem.contents.clone(),
        });
    }
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A certificate time as an HTTP date (`Tue, 14 Nov 2023 22:13:20 GMT`);
/// times before 1970 read as 1970.
pub fn date(secs: i64) -> String {
    let secs = u64::try_from(secs).unwrap_or(0);
    httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// Validity findings for one certificate: not yet valid or expired fail,
/// expiring within the warning period warns.
fn validity(what: &str, c: &Cert, now: i64, config: &Config, obj: &ObjectRef) -> Option<Finding> {
    let warn_secs = i64::try_from(config.expiry_warning.as_secs()).unwrap_or(i64::MAX);
    if now < c.not_before {
        return Some(Finding::fail(
            format!(
                "{what} {} is not valid before {}",
                c.subject,
                date(c.not_before)
            ),
            vec![obj.clone()],
        ));
    }
    if now > c.not_after {
        return Some(Finding::fail(
            format!("{what} {} expired on {}", c.subject, date(c.not_after)),
            vec![obj.clone()],
        ));
    }
    if c.not_after - now < warn_secs {
        return Some(Finding::warn(
            format!(
                "{what} {} will expire on {} (in {} days; warning at {} days)",
                c.subject,
                date(c.not_after),
                (c.not_after - now) / 86_400,
                warn_secs / 86_400
            ),
            vec![obj.clone()],
        ));
    }
    None
}

/// A missing object: a failure on a cluster; in a manifests directory
/// (Secrets are rarely kept there) a warning that it was not checked.
fn missing(source: Source, obj: ObjectRef) -> Finding {
    match source {
        Source::Cluster => Finding::fail(format!("{obj} does not exist"), vec![obj]),
        Source::Manifests => Finding::warn(
            format!("{obj} is not in the manifests: not checked"),
            vec![obj],
        ),
    }
}

/// The trust anchors: what they are, or the finding that stops the checks.
fn anchors(
    snap: &Snapshot,
    config: &Config,
    pki: &PkiObjects,
) -> Result<(Vec<Cert>, ObjectRef), Finding> {
    let ns = config.namespace.as_str();
    let obj = ObjectRef::new("ConfigMap", Some(ns), &pki.trust_roots_configmap);
    let Some(cm) = snap.find("ConfigMap", ns, &pki.trust_roots_configmap) else {
        return Err(missing(snap.source, obj));
    };
    let key = pki.trust_roots_key.as_str();
    let pem = cm
        .get("data")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
        .map(|s| s.as_bytes().to_vec())
        .or_else(|| {
            let b64 = cm.get("binaryData")?.get(key)?.as_str()?;
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .ok()
        });
    let Some(pem) = pem else {
        return Err(Finding::fail(format!("{obj} has no key {key}"), vec![obj]));
    };
    match parse_pem(&pem) {
        Ok(certs) => Ok((certs, obj)),
        Err(e) => Err(Finding::fail(format!("{obj} key {key} {e}"), vec![obj])),
    }
}

pub fn trust_anchors(snap: &Snapshot, now: SystemTime, config: &Config) -> CheckResult {
    let pki = PkiObjects::in_snapshot(snap, config);
    let now = unix(now);
    let findings = match anchors(snap, config, &pki) {
        Err(f) => vec![f],
        Ok((certs, obj)) => certs
            .iter()
            .flat_map(|c| {
                let not_ca = (!c.is_ca).then(|| {
                    Finding::fail(
                        format!("trust anchor {} is not a CA certificate", c.subject),
                        vec![obj.clone()],
                    )
                });
                not_ca
                    .into_iter()
                    .chain(validity("trust anchor", c, now, config, &obj))
            })
            .collect(),
    };
    CheckResult::ran(CATEGORY, ANCHORS, findings)
}

pub fn issuer(snap: &Snapshot, now: SystemTime, config: &Config) -> CheckResult {
    let pki = PkiObjects::in_snapshot(snap, config);
    let ns = config.namespace.as_str();
    let obj = ObjectRef::new("Secret", Some(ns), &pki.issuer_secret);
    let Some(secret) = snap.find("Secret", ns, &pki.issuer_secret) else {
        return CheckResult::ran(CATEGORY, ISSUER, vec![missing(snap.source, obj)]);
    };
    // `data` is base64; `stringData` (manifests) is text.
    let pem = ISSUER_KEYS.iter().find_map(|key| {
        let data = secret
            .get("data")
            .and_then(|d| d.get(*key))
            .and_then(Value::as_str);
        match data {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .ok(),
            None => secret
                .get("stringData")
                .and_then(|d| d.get(*key))
                .and_then(Value::as_str)
                .map(|s| s.as_bytes().to_vec()),
        }
    });
    let fail =
        |m: String| CheckResult::ran(CATEGORY, ISSUER, vec![Finding::fail(m, vec![obj.clone()])]);
    let Some(pem) = pem else {
        return fail(format!(
            "{obj} has no {} (base64 in data, or stringData)",
            ISSUER_KEYS.join(" or ")
        ));
    };
    let issuer = match parse_pem(&pem) {
        Ok(mut certs) => certs.remove(0),
        Err(e) => return fail(format!("{obj} certificate {e}")),
    };
    let now = unix(now);
    let mut findings: Vec<Finding> = validity("issuer", &issuer, now, config, &obj)
        .into_iter()
        .collect();
    if !issuer.is_ca {
        findings.push(Finding::fail(
            format!(
                "issuer {} is not a CA certificate: it cannot sign proxies' certificates",
                issuer.subject
            ),
            vec![obj.clone()],
        ));
    }
    match anchors(snap, config, &pki) {
        Err(_) => findings.push(Finding::fail(
            format!("issuer {} cannot be verified: the trust anchors are missing or unreadable (see above)", issuer.subject),
            vec![obj.clone()],
        )),
        Ok((anchors, anchors_obj)) => {
            if !signed_by_any(&issuer, &anchors) {
                findings.push(Finding::fail(
                    format!(
                        "issuer {} is not signed by any trust anchor in {anchors_obj}: proxies will reject every certificate it issues",
                        issuer.subject
                    ),
                    vec![obj.clone(), anchors_obj],
                ));
            }
        }
    }
    CheckResult::ran(CATEGORY, ISSUER, findings)
}

fn signed_by_any(cert: &Cert, anchors: &[Cert]) -> bool {
    let Ok((_, c)) = X509Certificate::from_der(&cert.der) else {
        return false;
    };
    anchors.iter().any(|a| {
        let Ok((_, a)) = X509Certificate::from_der(&a.der) else {
            return false;
        };
        c.issuer() == a.subject() && c.verify_signature(Some(a.public_key())).is_ok()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::Status;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use serde_json::json;
    use std::time::Duration;

    pub const DAY: u64 = 86_400;

    /// A CA certificate valid from `from` to `until` (seconds since the
    /// epoch), self-signed or signed by `by`.
    pub fn ca(
        cn: &str,
        from: u64,
        until: u64,
        by: Option<&(CertificateParams, KeyPair)>,
    ) -> (String, (CertificateParams, KeyPair)) {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        params.not_before = epoch + Duration::from_secs(from);
        params.not_after = epoch + Duration::from_secs(until);
        let key = KeyPair::generate().expect("key");
        let cert = match by {
            None => params.self_signed(&key),
            Some((p, k)) => params.signed_by(&key, &Issuer::from_params(p, k)),
        }
        .expect("certificate");
        (cert.pem(), (params, key))
    }

    pub fn trust_roots(pem: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": TRUST_ROOTS_CONFIGMAP, "namespace": "ballast"},
               "data": {TRUST_ROOTS_KEY: pem}})
    }

    pub fn issuer_secret(pem: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": ISSUER_SECRET, "namespace": "ballast"},
               "data": {"tls.crt": base64::engine::general_purpose::STANDARD.encode(pem)}})
    }

    const NOW: u64 = 1_900_000_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW)
    }

    fn snap(objects: Vec<Value>) -> Snapshot {
        Snapshot::new(Source::Cluster, objects)
    }

    fn names(c: &CheckResult) -> Vec<Vec<String>> {
        c.findings
            .iter()
            .map(|f| f.objects.iter().map(|o| o.to_string()).collect())
            .collect()
    }

    /// An anchor for ten years and an issuer for a year, around NOW.
    fn good() -> (String, String) {
        let (anchor_pem, anchor) = ca(
            "root.linkerd.cluster.local",
            NOW - DAY,
            NOW + 3650 * DAY,
            None,
        );
        let (issuer_pem, _) = ca(
            "identity.linkerd.cluster.local",
            NOW - DAY,
            NOW + 365 * DAY,
            Some(&anchor),
        );
        (anchor_pem, issuer_pem)
    }

    #[test]
    fn a_valid_anchor_and_issuer_pass() {
        let (a, i) = good();
        let s = snap(vec![trust_roots(&a), issuer_secret(&i)]);
        let cfg = Config::default();
        assert_eq!(trust_anchors(&s, now(), &cfg).status, Status::Ok);
        let c = issuer(&s, now(), &cfg);
        assert_eq!(c.status, Status::Ok, "{:?}", c.findings);
    }

    #[test]
    fn an_issuer_expiring_within_the_warning_period_warns() {
        let (anchor_pem, anchor) = ca("root", NOW - DAY, NOW + 3650 * DAY, None);
        let (issuer_pem, _) = ca("issuer", NOW - DAY, NOW + 10 * DAY, Some(&anchor));
        let s = snap(vec![trust_roots(&anchor_pem), issuer_secret(&issuer_pem)]);
        let c = issuer(&s, now(), &Config::default());
        assert_eq!(c.status, Status::Warn);
        assert_eq!(names(&c), [["secret ballast/linkerd-identity-issuer"]]);
        assert!(
            c.findings[0].message.contains("in 10 days"),
            "{}",
            c.findings[0].message
        );
        let shorter = Config {
            expiry_warning: Duration::from_secs(5 * DAY),
            ..Config::default()
        };
        assert_eq!(issuer(&s, now(), &shorter).status, Status::Ok);
        // Past its end, it fails.
        let later = now() + Duration::from_secs(11 * DAY);
        assert_eq!(issuer(&s, later, &Config::default()).status, Status::Fail);
    }

    #[test]
    fn an_issuer_from_another_anchor_fails_naming_both_objects() {
        let (anchor_pem, _) = ca("root", NOW - DAY, NOW + 3650 * DAY, None);
        let (_, other) = ca("root", NOW - DAY, NOW + 3650 * DAY, None);
        let (issuer_pem, _) = ca("issuer", NOW - DAY, NOW + 365 * DAY, Some(&other));
        let c = issuer(
            &snap(vec![trust_roots(&anchor_pem), issuer_secret(&issuer_pem)]),
            now(),
            &Config::default(),
        );
        assert_eq!(c.status, Status::Fail);
        assert_eq!(
            names(&c),
            [[
                "secret ballast/linkerd-identity-issuer",
                "configmap ballast/linkerd-identity-trust-roots"
            ]]
        );
    }

    #[test]
    fn expired_missing_or_garbled_anchors_fail() {
        let (old, _) = ca("old-root", NOW - 400 * DAY, NOW - DAY, None);
        let c = trust_anchors(&snap(vec![trust_roots(&old)]), now(), &Config::default());
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.findings[0].message.contains("expired"),
            "{}",
            c.findings[0].message
        );
        let c = trust_anchors(
            &snap(vec![trust_roots("garbage")]),
            now(),
            &Config::default(),
        );
        assert!(
            c.findings[0].message.contains("no PEM certificate"),
            "{}",
            c.findings[0].message
        );
        let c = trust_anchors(&snap(vec![]), now(), &Config::default());
        assert_eq!(
            names(&c),
            [["configmap ballast/linkerd-identity-trust-roots"]]
        );
        assert_eq!(c.status, Status::Fail);
        let m = Snapshot::new(Source::Manifests, vec![]);
        assert_eq!(
            trust_anchors(&m, now(), &Config::default()).status,
            Status::Warn
        );
    }

    #[test]
    fn names_come_from_the_identity_deployment() {
        let d = json!({"spec": {"template": {"spec": {
            "containers": [{"name": "identity", "args": ["identity", "--trust-anchors=/x/roots/bundle.pem"]}],
            "volumes": [{"name": "issuer", "secret": {"secretName": "my-issuer"}},
                        {"name": "roots", "configMap": {"name": "my-roots"}}]}}}});
        assert_eq!(
            PkiObjects::of(Some(&d)),
            PkiObjects {
                trust_roots_configmap: "my-roots".into(),
                trust_roots_key: "bundle.pem".into(),
                issuer_secret: "my-issuer".into()
            }
        );
        assert_eq!(PkiObjects::of(None).issuer_secret, ISSUER_SECRET);
        assert_eq!(date(1_700_000_000), "Tue, 14 Nov 2023 22:13:20 GMT");
    }
}
