//! The one way every command finds its Kubernetes configuration: the
//! kubeconfig file given, else what kube infers (KUBECONFIG, ~/.kube/config,
//! the in-cluster service account). Errors are one line that gives the cause
//! once (kube's name the path, and chain multi-line YAML errors).

#![forbid(unsafe_code)]

use std::path::Path;

/// Why no configuration could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The given kubeconfig file is unreadable or unusable.
    #[error("cannot use the kubeconfig {path}: {reason}")]
    File { path: String, reason: String },
    /// None given, and none could be inferred.
    #[error("no Kubernetes configuration found ({reason})")]
    Infer { reason: String },
}

/// The configuration from `kubeconfig`, else the inferred one.
pub async fn load(kubeconfig: Option<&Path>) -> Result<kube::Config, ConfigError> {
    match kubeconfig {
        Some(path) => {
            let error = |e: kube::config::KubeconfigError| ConfigError::File {
                path: path.display().to_string(),
                reason: kubeconfig_reason(&e),
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(error)
        }
        None => kube::Config::infer().await.map_err(|e| {
            // The kubeconfig's error is the one a user can act on.
            let reason = match std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<kube::config::KubeconfigError>())
            {
                Some(kube::config::KubeconfigError::ReadConfig(io, path)) => {
                    format!("cannot read the kubeconfig {}: {io}", path.display())
                }
                Some(other) => format!("the kubeconfig is unusable: {}", kubeconfig_reason(other)),
                None => first_line(&e.to_string()),
            };
            ConfigError::Infer { reason }
        }),
    }
}

/// kube's kubeconfig errors without the path (the caller names it) and
/// past their first line.
fn kubeconfig_reason(error: &kube::config::KubeconfigError) -> String {
    match error {
        kube::config::KubeconfigError::ReadConfig(io, _) => io.to_string(),
        other => first_line(&other.to_string()),
    }
}

/// The first line of `text`, control characters shown as `?`.
pub fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default().trim_end();
    line.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_or_malformed_file_is_one_line_naming_the_path_once() {
        let dir = std::env::temp_dir().join(format!("ballast-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.yaml");
        let err = load(Some(&missing)).await.unwrap_err().to_string();
        assert_eq!(err.matches("missing.yaml").count(), 1, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");

        let malformed = dir.join("malformed.yaml");
        std::fs::write(&malformed, "clusters: [\n  - {name: \"a\"\n").unwrap();
        let err = load(Some(&malformed)).await.unwrap_err().to_string();
        assert_eq!(err.matches("malformed.yaml").count(), 1, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn first_lines_lose_control_characters() {
        assert_eq!(first_line("bad\u{1b}[31m value\nmore"), "bad?[31m value");
    }
}
