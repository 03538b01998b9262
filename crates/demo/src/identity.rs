//! The demo's mesh identity: a trust anchor and issuer made for the run by
//! `ballast identity generate`, a service-account token per workload (a
//! token Secret in the cluster's manifests, which `ballast identity` checks,
//! and the same token in a file the workload's proxy sends), and the names
//! the certificates carry.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::Command;

/// The control plane's namespace, part of every identity name. Every
/// process of the demo is given it explicitly so their names agree.
pub const CONTROL_NS: &str = "linkerd";
/// The last part of every identity name.
pub const TRUST_DOMAIN: &str = "cluster.local";

/// Viz's service account and namespace: the one identity the proxies let
/// tap them.
pub const VIZ_SERVICE_ACCOUNT: &str = "ballast-viz";
pub const VIZ_NAMESPACE: &str = "ballast";

/// How long `ballast identity generate` may take.
const GENERATE_DEADLINE: Duration = Duration::from_secs(30);
/// Random bytes in each service-account token.
const TOKEN_BYTES: usize = 16;

/// `SA.NS.serviceaccount.identity.CONTROL_NS.TRUST_DOMAIN`, Linkerd's form.
pub fn name(service_account: &str, namespace: &str) -> String {
    format!("{service_account}.{namespace}.serviceaccount.identity.{CONTROL_NS}.{TRUST_DOMAIN}")
}

/// Trust anchor and issuer files written for the run.
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Runs `ballast identity generate --out DIR`.
    pub async fn generate(ballast: &Path, dir: &Path) -> anyhow::Result<Pki> {
        let run = Command::new(ballast)
            .args(["identity", "generate", "--out"])
            .arg(dir)
            .args(["--controller-namespace", CONTROL_NS])
            .args(["--trust-domain", TRUST_DOMAIN])
            .env("BALLAST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(GENERATE_DEADLINE, run)
            .await
            .with_context(|| {
                format!("ballast identity generate did not finish within {GENERATE_DEADLINE:?}")
            })?
            .with_context(|| format!("cannot run {} identity generate", ballast.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "ballast identity generate failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The trust anchors bundle every proxy verifies peers against.
    pub fn anchors(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The issuer's certificate and key, as `ballast identity` reads them.
    pub fn issuer_dir(&self) -> PathBuf {
        self.dir.join("issuer")
    }
}

/// A workload's service account and its token.
#[derive(Clone, Debug)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
    pub token: String,
    /// Where the token is written for the workload's proxy to send.
    pub token_file: PathBuf,
}

impl ServiceAccount {
    /// A fresh random token for `namespace/name`, written to
    /// `dir/NAMESPACE.NAME.token`.
    pub fn create(dir: &Path, namespace: &str, name: &str) -> anyhow::Result<ServiceAccount> {
        let token = random_token()?;
        let token_file = dir.join(format!("{namespace}.{name}.token"));
        std::fs::write(&token_file, &token)
            .with_context(|| format!("cannot write {}", token_file.display()))?;
        Ok(ServiceAccount {
            namespace: namespace.to_string(),
            name: name.to_string(),
            token,
            token_file,
        })
    }

    /// Its identity name.
    pub fn identity(&self) -> String {
        name(&self.name, &self.namespace)
    }

    /// The token Secret `ballast identity --manifests` accepts it by.
    pub fn secret_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Secret\n\
             type: kubernetes.io/service-account-token\n\
             metadata:\n  name: {sa}-token\n  namespace: {ns}\n  annotations:\n    kubernetes.io/service-account.name: {sa}\n\
             stringData:\n  token: {token}\n",
            sa = self.name,
            ns = self.namespace,
            token = self.token,
        )
    }
}

/// Hex of random bytes from the kernel: a token nobody else on the machine
/// can guess for the run.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("cannot read /dev/urandom for a service-account token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_linkerds() {
        assert_eq!(
            name("web", "demo"),
            "web.demo.serviceaccount.identity.linkerd.cluster.local"
        );
    }

    #[test]
    fn tokens_are_written_and_named_in_their_secret() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = ServiceAccount::create(dir.path(), "demo", "load").expect("load");
        let b = ServiceAccount::create(dir.path(), "demo", "web").expect("web");
        assert_eq!(a.token.len(), 2 * TOKEN_BYTES);
        assert_ne!(a.token, b.token);
        assert_eq!(
            std::fs::read_to_string(&a.token_file).expect("token file"),
            a.token
        );
        let secret = a.secret_yaml();
        for needle in [
            "kind: Secret\n",
            "type: kubernetes.io/service-account-token\n",
            "namespace: demo\n",
            "kubernetes.io/service-account.name: load\n",
            &format!("token: {}\n", a.token),
        ] {
            assert!(secret.contains(needle), "{needle:?} in\n{secret}");
        }
        assert_eq!(
            a.identity(),
            "load.demo.serviceaccount.identity.linkerd.cluster.local"
        );
    }
}
