//! Proving a service account from a token. On Kubernetes, a TokenReview with
//! Linkerd's audience (`identity.l5d.io`). On the manifests source, the token
//! must equal a service-account token Secret's in the directory.

use base64::Engine;
use serde_json::Value;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};
use tokio::{sync::Mutex, time::Instant};

/// Linkerd's TokenReview audience.
pub const AUDIENCE: &str = "identity.l5d.io";

/// The service account a token proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The token is not valid (FailedPrecondition, as Linkerd).
    #[error("authentication token could not be authenticated")]
    NotAuthenticated,
    /// The token is valid but not a service account's (InvalidArgument).
    #[error("{0}")]
    Invalid(String),
    /// The check itself failed (Internal).
    #[error("error validating token: {0}")]
    Unavailable(String),
}

pub enum TokenValidator {
    Kubernetes(kube::Client),
    Manifests(ManifestTokens),
}

impl TokenValidator {
    /// One rule for every token, stored or presented: surrounding ASCII
    /// whitespace is not part of it (a JWT holds none; a token file written
    /// by hand ends in a newline, and Linkerd's proxy sends its file as read).
    pub async fn validate(&self, token: &[u8]) -> Result<ServiceAccount, TokenError> {
        let token = token.trim_ascii();
        match self {
            Self::Kubernetes(client) => token_review(client, token).await,
            Self::Manifests(m) => m.validate(token).await,
        }
    }
}

/// `system:serviceaccount:NS:SA`, with DNS-label parts.
pub fn parse_username(username: &str) -> Result<ServiceAccount, TokenError> {
    let parts: Vec<&str> = username.split(':').collect();
    let [system, kind, ns, sa] = parts.as_slice() else {
        return Err(TokenError::Invalid(format!(
            "Username must be in form system:TYPE:NS:SA: {}",
            short(username)
        )));
    };
    if *system != "system" || *kind != "serviceaccount" {
        return Err(TokenError::Invalid(format!(
            "Username must be in form system:serviceaccount:NS:SA: {}",
            short(username)
        )));
    }
    for part in [ns, sa] {
        if !is_label(part) {
            return Err(TokenError::Invalid(format!("Not a label: {}", short(part))));
        }
    }
    Ok(ServiceAccount {
        namespace: ns.to_string(),
        name: sa.to_string(),
    })
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn short(s: &str) -> String {
    s.chars().take(128).collect()
}

async fn token_review(client: &kube::Client, token: &[u8]) -> Result<ServiceAccount, TokenError> {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    let token =
        std::str::from_utf8(token).map_err(|_| TokenError::Invalid("token is not UTF-8".into()))?;
    let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
    let review = |audiences: Option<Vec<String>>| TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences,
        },
        ..Default::default()
    };
    let post = kube::api::PostParams::default();
    let mut rsp = api
        .create(&post, &review(Some(vec![AUDIENCE.to_owned()])))
        .await
        .map_err(|e| TokenError::Unavailable(short(&e.to_string())))?;
    // Tokens minted before projected audiences: Linkerd retries without.
    let audience_error = rsp
        .status
        .as_ref()
        .and_then(|s| s.error.as_deref())
        .is_some_and(|e| e.contains("token audiences"));
    if audience_error {
        rsp = api
            .create(&post, &review(None))
            .await
            .map_err(|e| TokenError::Unavailable(short(&e.to_string())))?;
    }
    let status = rsp.status.unwrap_or_default();
    if let Some(e) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return Err(TokenError::Invalid(short(e)));
    }
    if status.authenticated != Some(true) {
        return Err(TokenError::NotAuthenticated);
    }
    let username = status
        .user
        .and_then(|u| u.username)
        .ok_or_else(|| TokenError::Invalid("the token review names no user".into()))?;
    parse_username(&username)
}

/// Bounds of the manifests token scan (the files are those the destination
/// controller reads, by `ballast_manifests`' rule and default bounds).
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
const MAX_TOKENS: usize = 100_000;
/// A token not found triggers a rescan at most this often.
const RESCAN_AFTER: Duration = Duration::from_secs(1);

/// Service-account token Secrets of a manifests directory, by token digest.
pub struct ManifestTokens {
    dir: PathBuf,
    state: Mutex<Scanned>,
}

#[derive(Default)]
struct Scanned {
    tokens: HashMap<[u8; 32], ServiceAccount>,
    /// Each file's tokens as last read, with what its metadata said then:
    /// a rescan reads again only the files that changed.
    files: Files,
    at: Option<Instant>,
}

type Files = HashMap<PathBuf, FileTokens>;

#[derive(Clone)]
struct FileTokens {
    modified: Option<std::time::SystemTime>,
    len: u64,
    tokens: Vec<([u8; 32], ServiceAccount)>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl ManifestTokens {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            state: Mutex::new(Scanned::default()),
        }
    }

    /// Whether any token is known (for start-up logs).
    pub async fn count(&self) -> usize {
        let mut s = self.state.lock().await;
        self.rescan(&mut s).await;
        s.tokens.len()
    }

    async fn rescan(&self, s: &mut Scanned) {
        let dir = self.dir.clone();
        let previous = std::mem::take(&mut s.files);
        if let Ok((files, tokens)) = tokio::task::spawn_blocking(move || scan(&dir, previous)).await
        {
            s.files = files;
            s.tokens = tokens;
        }
        s.at = Some(Instant::now());
    }

    /// A token found is checked against a scan at most [`RESCAN_AFTER`] old,
    /// so a deleted Secret stops working within it; scans happen only when a
    /// request comes, at most once per interval.
    pub async fn validate(&self, token: &[u8]) -> Result<ServiceAccount, TokenError> {
        let key = digest(token);
        let mut s = self.state.lock().await;
        if s.at.is_none_or(|at| at.elapsed() >= RESCAN_AFTER) {
            self.rescan(&mut s).await;
        }
        s.tokens
            .get(&key)
            .cloned()
            .ok_or(TokenError::NotAuthenticated)
    }
}

/// Reads the manifests under `dir` that are new or changed since
/// `previous` (by modification time and length); unreadable or malformed
/// files are skipped (the destination controller reports them). Returns
/// every file's tokens and all of them by digest.
fn scan(dir: &Path, mut previous: Files) -> (Files, HashMap<[u8; 32], ServiceAccount>) {
    let paths: Vec<PathBuf> = ballast_manifests::walk(dir, &ballast_manifests::Limits::default())
        .map(|listing| listing.files.into_keys().map(|p| p.to_path_buf()).collect())
        .unwrap_or_default();
    let mut files = Files::with_capacity(paths.len());
    let mut tokens = HashMap::new();
    for path in paths {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.len() > MAX_FILE_BYTES {
            continue;
        }
        let modified = meta.modified().ok();
        let read = match previous.remove(&path) {
            Some(known) if known.modified == modified && known.len == meta.len() => known,
            _ => {
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                FileTokens {
                    modified,
                    len: meta.len(),
                    tokens: secrets_in(&text)
                        .into_iter()
                        .map(|(token, sa)| (digest(&token), sa))
                        .collect(),
                }
            }
        };
        for (key, sa) in &read.tokens {
            if tokens.len() >= MAX_TOKENS {
                tracing::warn!(dir = %dir.display(), "over {MAX_TOKENS} service-account tokens; the rest are ignored");
                return (files, tokens);
            }
            tokens.insert(*key, sa.clone());
        }
        files.insert(path, read);
    }
    (files, tokens)
}

/// The service-account token Secrets of one manifest file's text, read as
/// the controller's manifests source reads manifests (a file that is not
/// YAML or JSON holds none).
pub fn secrets_in(text: &str) -> Vec<(Vec<u8>, ServiceAccount)> {
    ballast_manifests::documents::read(text)
        .objects
        .iter()
        .filter_map(|o| secret(&o.fields))
        .collect()
}

fn secret(doc: &serde_json::Map<String, Value>) -> Option<(Vec<u8>, ServiceAccount)> {
    if doc.get("kind")?.as_str()? != "Secret"
        || doc.get("type")?.as_str()? != "kubernetes.io/service-account-token"
    {
        return None;
    }
    let meta = doc.get("metadata")?;
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let name = meta
        .get("annotations")?
        .get("kubernetes.io/service-account.name")?
        .as_str()?;
    let token = match doc
        .get("data")
        .and_then(|d| d.get("token"))
        .and_then(Value::as_str)
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .ok()?,
        None => doc
            .get("stringData")?
            .get("token")?
            .as_str()?
            .as_bytes()
            .to_vec(),
    };
    let token = token.trim_ascii().to_vec();
    if token.is_empty() || !is_label(namespace) || !is_label(name) {
        return None;
    }
    Some((
        token,
        ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
    ))
}

/// A Kubernetes client from `kubeconfig`, else the usual places (KUBECONFIG,
/// ~/.kube/config, the in-cluster service account).
pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, String> {
    let config = ballast_kubeconfig::load(kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_follow_linkerds_form() {
        assert_eq!(
            parse_username("system:serviceaccount:shop:web").unwrap(),
            ServiceAccount {
                namespace: "shop".into(),
                name: "web".into()
            }
        );
        for bad in [
            "system:serviceaccount:shop",
            "user:serviceaccount:a:b",
            "system:node:a:b",
            "system:serviceaccount:Shop:web",
            "system:serviceaccount:a:b:c",
        ] {
            assert!(
                matches!(parse_username(bad), Err(TokenError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn finds_token_secrets_in_manifests() {
        let text = r#"
apiVersion: v1
kind: Secret
type: kubernetes.io/service-account-token
metadata:
  name: web-token
  namespace: shop
  annotations:
    kubernetes.io/service-account.name: web
data:
  token: c2VjcmV0LXdlYg==
---
apiVersion: v1
kind: Secret
type: Opaque
metadata: {name: other, namespace: shop}
data: {token: c2VjcmV0LXdlYg==}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Secret
  type: kubernetes.io/service-account-token
  metadata:
    name: db-token
    annotations: {kubernetes.io/service-account.name: db}
  stringData: {token: secret-db}
---
apiVersion: v1
kind: SecretList
items:
- type: kubernetes.io/service-account-token
  metadata:
    name: api-token
    namespace: shop
    annotations: {kubernetes.io/service-account.name: api}
  stringData: {token: secret-api}
"#;
        let found = secrets_in(text);
        assert_eq!(
            found,
            vec![
                (
                    b"secret-web".to_vec(),
                    ServiceAccount {
                        namespace: "shop".into(),
                        name: "web".into()
                    }
                ),
                (
                    b"secret-db".to_vec(),
                    ServiceAccount {
                        namespace: "default".into(),
                        name: "db".into()
                    }
                ),
                // A typed list's items take its type, as the API's do.
                (
                    b"secret-api".to_vec(),
                    ServiceAccount {
                        namespace: "shop".into(),
                        name: "api".into()
                    }
                ),
            ]
        );
        assert!(secrets_in("{{{ not yaml").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_secret_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.yaml");
        let secret = |token: &str| {
            format!("apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  namespace: shop\n  annotations: {{kubernetes.io/service-account.name: web}}\nstringData: {{token: {token}}}\n")
        };
        std::fs::write(&path, secret("old")).unwrap();
        let tokens = ManifestTokens::new(dir.path().to_owned());
        assert!(tokens.validate(b"old").await.is_ok());
        std::fs::write(&path, secret("rotated")).unwrap();
        tokio::time::advance(RESCAN_AFTER).await;
        assert_eq!(tokens.validate(b"rotated").await.unwrap().name, "web");
        assert!(matches!(
            tokens.validate(b"old").await,
            Err(TokenError::NotAuthenticated)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_presented_with_a_newline_matches_the_one_stored_without() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("sa.yaml"),
            "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  namespace: shop\n  annotations: {kubernetes.io/service-account.name: web}\nstringData: {token: \"tok\\n\"}\n",
        )
        .unwrap();
        let tokens = TokenValidator::Manifests(ManifestTokens::new(dir.path().to_owned()));
        for presented in [&b"tok"[..], b"tok\n", b" tok\r\n"] {
            assert_eq!(
                tokens.validate(presented).await.unwrap().name,
                "web",
                "{presented:?}"
            );
        }
        assert!(matches!(
            tokens.validate(b"to k").await,
            Err(TokenError::NotAuthenticated)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_secret_stops_validating() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.yaml");
        std::fs::write(&path, "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  namespace: shop\n  annotations: {kubernetes.io/service-account.name: web}\nstringData: {token: tok}\n").unwrap();
        let tokens = ManifestTokens::new(dir.path().to_owned());
        assert_eq!(tokens.validate(b"tok").await.unwrap().name, "web");
        assert!(matches!(
            tokens.validate(b"nope").await,
            Err(TokenError::NotAuthenticated)
        ));
        std::fs::remove_file(&path).unwrap();
        // Within the interval the last scan stands; after it, a rescan.
        assert!(tokens.validate(b"tok").await.is_ok());
        tokio::time::advance(RESCAN_AFTER).await;
        assert!(matches!(
            tokens.validate(b"tok").await,
            Err(TokenError::NotAuthenticated)
        ));
    }
}
