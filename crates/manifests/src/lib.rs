//! Which files a manifests directory holds, and what a manifest file's text
//! holds ([`documents`]): the one walk and the one reader every reader of
//! manifests uses (the controller's manifests source, `ballast check
//! --manifests`, `ballast inject` on a directory, the identity
//! controller's token Secrets), so that they all see the same files.
//!
//! The rule:
//! - a manifest is a regular file ending in `.yaml`, `.yml` or `.json`, in
//!   any case;
//! - hidden entries (`.git`, Kubernetes' `..data`) and editor leftovers
//!   (`#x#`, `x~`, `.swp`, `.swx`, `.tmp`) are skipped, files and
//!   directories alike;
//! - subdirectories are walked, following symbolic links (a ConfigMap
//!   volume is made of them, and `kubectl apply -f` follows them), each
//!   directory once (a link loop ends there), at most
//!   [`Limits::max_depth`] levels below the root;
//! - at most [`Limits::max_files`] files and [`Limits::max_dir_entries`]
//!   entries per directory are listed; past a bound the listing says so;
//! - files come in path order.

#![forbid(unsafe_code)]

pub mod documents;

use std::{
    collections::{BTreeMap, HashSet},
    fs, io,
    path::{Path, PathBuf},
    sync::Arc,
};

/// Manifest files listed at most, by default.
pub const DEFAULT_MAX_FILES: usize = 10_000;
/// Directory levels below the root walked at most, by default.
pub const DEFAULT_MAX_DEPTH: usize = 16;

/// The bounds of one walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Manifest files listed at most.
    pub max_files: usize,
    /// Directory levels below the root walked at most (0: the root only).
    pub max_depth: usize,
    /// Entries read from one directory at most (manifests or not).
    pub max_dir_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_files: DEFAULT_MAX_FILES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_dir_entries: 4 * DEFAULT_MAX_FILES,
        }
    }
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct Listing {
    /// Manifest files, in path order, with their metadata.
    pub files: BTreeMap<Arc<Path>, fs::Metadata>,
    /// Subdirectories that could not be read, and why.
    pub unreadable: Vec<(PathBuf, io::Error)>,
    /// More files, or more entries in a directory, than the limits allow:
    /// some were not listed.
    pub too_many: bool,
    /// Directories deeper than the limit were not walked.
    pub too_deep: bool,
    /// Device and inode of the root (unix; `None` elsewhere or when its
    /// metadata could not be read).
    pub root_id: Option<(u64, u64)>,
}

impl Listing {
    /// Whether some files may be missing from the listing.
    pub fn truncated(&self) -> bool {
        self.too_many || self.too_deep
    }
}

/// Lists the manifest files under `root`. Fails only if `root` itself
/// cannot be read.
pub fn walk(root: &Path, limits: &Limits) -> io::Result<Listing> {
    let mut walk = Walk {
        limits,
        listing: Listing::default(),
        visited: HashSet::new(),
    };
    if let Ok(meta) = fs::metadata(root) {
        let id = file_id(&meta);
        walk.visited.insert(id);
        walk.listing.root_id = id;
    }
    walk.dir(root, 0)?;
    Ok(walk.listing)
}

/// Whether a file or directory name is skipped: hidden entries (`.git`,
/// `..data`, `.web.yaml.swp`) and editor leftovers.
pub fn is_ignored(name: &str) -> bool {
    name.starts_with('.')
        || name.starts_with('#')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
        || name.ends_with(".tmp")
}

/// Whether a path names a manifest by its extension (any case).
pub fn is_manifest(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        e.eq_ignore_ascii_case("yaml")
            || e.eq_ignore_ascii_case("yml")
            || e.eq_ignore_ascii_case("json")
    })
}

/// Device and inode of a file (unix): what tells a file replaced by a
/// rename, or a directory seen twice through links.
pub fn file_id(meta: &fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

struct Walk<'a> {
    limits: &'a Limits,
    listing: Listing,
    /// Directories entered, to stop at symbolic link loops.
    visited: HashSet<Option<(u64, u64)>>,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path, depth: usize) -> io::Result<()> {
        let mut entries = Vec::new();
        for entry in fs::read_dir(dir)? {
            // An entry that vanished while listing is simply not there.
            let Ok(entry) = entry else { continue };
            if entries.len() >= self.limits.max_dir_entries {
                self.listing.too_many = true;
                break;
            }
            entries.push(entry.path());
        }
        entries.sort();
        for path in entries {
            let Some(name) = path.file_name() else {
                continue;
            };
            if is_ignored(&name.to_string_lossy()) {
                continue;
            }
            // Follows symbolic links; a dangling one, or one removed
            // meanwhile, is skipped.
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                if depth + 1 > self.limits.max_depth {
                    self.listing.too_deep = true;
                    continue;
                }
                let id = file_id(&meta);
                if id.is_some() && !self.visited.insert(id) {
                    continue;
                }
                if let Err(e) = self.dir(&path, depth + 1) {
                    self.listing.unreadable.push((path, e));
                }
            } else if meta.is_file() && is_manifest(&path) {
                if self.listing.files.len() >= self.limits.max_files {
                    self.listing.too_many = true;
                    return Ok(());
                }
                self.listing.files.insert(Arc::from(path), meta);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(listing: &Listing, root: &Path) -> Vec<String> {
        listing
            .files
            .keys()
            .map(|p| {
                p.strip_prefix(root)
                    .expect("under root")
                    .display()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn lists_manifests_by_one_rule() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for f in [
            "b.yaml",
            "a.YML",
            "c.Json",
            "notes.txt",
            "x.yaml~",
            "#x.yaml#",
            ".hidden.yaml",
            "y.yaml.swp",
            "z.tmp",
            "sub/d.yaml",
            "sub/deeper/e.yml",
            ".git/f.yaml",
        ] {
            let p = root.join(f);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(&p, "{}").expect("write");
        }
        fs::create_dir(root.join("dir.yaml")).expect("a directory named like a manifest");
        let listing = walk(root, &Limits::default()).expect("walk");
        assert_eq!(
            names(&listing, root),
            [
                "a.YML",
                "b.yaml",
                "c.Json",
                "sub/d.yaml",
                "sub/deeper/e.yml"
            ]
        );
        assert!(!listing.truncated());
        assert!(listing.root_id.is_some());

        let shallow = Limits {
            max_depth: 0,
            ..Limits::default()
        };
        let listing = walk(root, &shallow).expect("walk");
        assert_eq!(names(&listing, root), ["a.YML", "b.yaml", "c.Json"]);
        assert!(listing.too_deep && !listing.too_many);

        let few = Limits {
            max_files: 2,
            ..Limits::default()
        };
        let listing = walk(root, &few).expect("walk");
        assert_eq!(listing.files.len(), 2);
        assert!(listing.too_many);
    }

    #[cfg(unix)]
    #[test]
    fn follows_links_once_and_fails_only_on_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::create_dir(root.join("real")).expect("mkdir");
        fs::write(root.join("real/a.yaml"), "{}").expect("write");
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).expect("link");
        std::os::unix::fs::symlink(root, root.join("real/loop")).expect("loop");
        std::os::unix::fs::symlink(root.join("gone.yaml"), root.join("dangling.yaml"))
            .expect("dangling");
        let listing = walk(root, &Limits::default()).expect("walk");
        // The directory is walked once, through whichever name sorts first.
        assert_eq!(names(&listing, root), ["link/a.yaml"]);
        assert!(walk(&root.join("missing"), &Limits::default()).is_err());
    }
}
