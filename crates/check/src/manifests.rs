//! The snapshot from a manifests directory: every manifest file under it
//! (by `ballast_manifests`' rule, the one the controller reads by: `.yaml`,
//! `.yml` and `.json` in any case, hidden and editor files skipped, links
//! followed), each a stream of YAML documents or JSON read by
//! `ballast_manifests::documents` as the controller reads it: `List`s (and
//! typed lists such as `PodList`) expanded, documents that are not typed
//! objects left out.
//!
//! Bounds: at most [`ManifestOptions::max_files`] files of at most
//! [`ManifestOptions::max_file_bytes`] each, [`MAX_DEPTH`] directories deep,
//! and [`ManifestOptions::max_objects`] objects in all; more is an error
//! naming the flag or file.

use crate::report::Source;
use crate::snapshot::Snapshot;
use serde_json::Value;
use std::path::PathBuf;

/// Default cap on the files read.
pub const DEFAULT_MAX_FILES: usize = ballast_manifests::DEFAULT_MAX_FILES;
/// Default cap on one file's size (the destination's manifests source reads
/// files of up to 16 MiB too).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 << 20;
/// Subdirectories deeper than this are not read.
pub const MAX_DEPTH: usize = ballast_manifests::DEFAULT_MAX_DEPTH;

#[derive(Clone, Debug)]
pub struct ManifestOptions {
    pub dir: PathBuf,
    /// Default [`DEFAULT_MAX_FILES`].
    pub max_files: usize,
    /// Default [`DEFAULT_MAX_FILE_BYTES`].
    pub max_file_bytes: u64,
    /// Default [`crate::cluster::DEFAULT_MAX_OBJECTS`].
    pub max_objects: usize,
}

impl ManifestOptions {
    pub fn new(dir: PathBuf) -> ManifestOptions {
        ManifestOptions {
            dir,
            max_files: DEFAULT_MAX_FILES,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_objects: crate::cluster::DEFAULT_MAX_OBJECTS,
        }
    }
}

/// Why the directory could not be read. One line each, the cause once.
#[derive(Debug, thiserror::Error)]
pub enum ManifestsError {
    #[error("cannot read the manifests directory {path}: {reason}")]
    Dir { path: String, reason: String },
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{path}: {reason}")]
    Syntax { path: String, reason: String },
    #[error("{path} is larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
    #[error("the manifests directory holds more than {max} files")]
    TooManyFiles { max: usize },
    #[error("the manifests hold more than {max} objects (stopped at {path}); raise --max-objects")]
    TooManyObjects { max: usize, path: String },
}

/// The manifest files under `dir`, sorted.
fn files(opts: &ManifestOptions) -> Result<Vec<PathBuf>, ManifestsError> {
    let limits = ballast_manifests::Limits {
        max_files: opts.max_files,
        max_depth: MAX_DEPTH,
        max_dir_entries: opts.max_files.saturating_mul(4),
    };
    let listing = ballast_manifests::walk(&opts.dir, &limits).map_err(|e| ManifestsError::Dir {
        path: opts.dir.display().to_string(),
        reason: e.to_string(),
    })?;
    if let Some((dir, e)) = listing.unreadable.first() {
        return Err(ManifestsError::File {
            path: dir.display().to_string(),
            reason: e.to_string(),
        });
    }
    if listing.too_many {
        return Err(ManifestsError::TooManyFiles {
            max: opts.max_files,
        });
    }
    Ok(listing.files.into_keys().map(|p| p.to_path_buf()).collect())
}

/// Reads every manifest under the directory.
pub fn gather(opts: &ManifestOptions) -> Result<Snapshot, ManifestsError> {
    let mut objects = Vec::new();
    for path in files(opts)? {
        let shown = path.display().to_string();
        let size = std::fs::metadata(&path)
            .map_err(|e| ManifestsError::File {
                path: shown.clone(),
                reason: e.to_string(),
            })?
            .len();
        if size > opts.max_file_bytes {
            return Err(ManifestsError::TooLarge {
                path: shown,
                max: opts.max_file_bytes,
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ManifestsError::File {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        // The controller's reader: what it would not load (not an object,
        // no type) is not in the snapshot either.
        let read = ballast_manifests::documents::read(&text);
        if let Some(problem) = read.syntax {
            return Err(ManifestsError::Syntax {
                path: shown,
                reason: problem.to_string(),
            });
        }
        objects.extend(read.objects.into_iter().map(|o| Value::Object(o.fields)));
        if objects.len() > opts.max_objects {
            return Err(ManifestsError::TooManyObjects {
                max: opts.max_objects,
                path: shown,
            });
        }
    }
    Ok(Snapshot::new(Source::Manifests, objects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_json_are_read_and_junk_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ballast\n---\n---\napiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: p, namespace: shop}\n",
        )
        .expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(
            dir.path().join("sub/b.json"),
            r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "shop"}}"#,
        )
        .expect("write");
        std::fs::write(
            dir.path().join("c.yaml"),
            "just a string\n---\nkind: Service\nmetadata: {name: untyped, namespace: shop}\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("notes.txt"), "not a manifest: [").expect("write");
        std::fs::write(dir.path().join(".hidden.yaml"), "[").expect("write");
        let snap = gather(&ManifestOptions::new(dir.path().to_path_buf())).expect("gathers");
        assert_eq!(snap.source, Source::Manifests);
        assert!(snap.find("Namespace", "", "ballast").is_some());
        assert!(
            snap.find("Pod", "shop", "p").is_some(),
            "{:?}",
            snap.objects
        );
        assert!(snap.find("Service", "shop", "s").is_some());
        assert!(
            snap.find("Service", "shop", "untyped").is_none(),
            "an object without apiVersion is not read, as the controller does not read it"
        );
        assert_eq!(snap.objects.len(), 3, "{:?}", snap.objects);

        let mut few = ManifestOptions::new(dir.path().to_path_buf());
        few.max_objects = 2;
        assert!(matches!(
            gather(&few),
            Err(ManifestsError::TooManyObjects { .. })
        ));

        std::fs::write(dir.path().join("bad.yaml"), "a: [\n").expect("write");
        let e = gather(&ManifestOptions::new(dir.path().to_path_buf())).expect_err("bad file");
        let text = e.to_string();
        assert!(
            text.contains("bad.yaml: ") && text.contains("not valid YAML or JSON"),
            "{text}"
        );

        let e = gather(&ManifestOptions::new(dir.path().join("nope"))).expect_err("missing");
        let text = e.to_string();
        assert!(
            text.starts_with("cannot read the manifests directory"),
            "{text}"
        );
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
    }
}
