//! The manifests-directory source: Kubernetes objects written as files,
//! served as if a cluster held them, and followed as the files change.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under the directory (recursively;
//! hidden entries such as `..data` and editor leftovers such as `web.yaml~`
//! or `#web.yaml#` skipped) is read at start and applied in one batch. Then a
//! file watcher (with a periodic rescan as a safety net, or polling when no
//! watcher can be had) triggers rescans: the directory is walked, only the
//! files whose metadata changed are read again, and the difference from the
//! previous state is sent to the store in one batch.
//!
//! Policy for bad input: a file with any problem (unreadable, too large, not
//! YAML, an invalid object) is logged with one line per problem (five at
//! most per read), naming the file, the document and the field, and then
//! applies nothing: its last good objects stay served until it reads cleanly
//! again. When two files define the same object, the first in path order is
//! served and a warning names both. Two Services claiming one clusterIP
//! (which Kubernetes refuses, but files allow) are the index's to report, as
//! for any source (`Changes::new_cluster_ip_conflicts`); it answers for that
//! IP with the first by namespace, then name.
//!
//! Logs, after the first load: one INFO line per file whose objects changed
//! (added, changed, removed, or renamed: a rename is one line however many
//! events and rescans it takes), one when a broken file reads cleanly again
//! ("fixed"), WARN for each problem and for the watcher's own errors.
//!
//! Bounds: files larger than [`ManifestsConfig::max_file_bytes`] (default
//! [`DEFAULT_MAX_FILE_BYTES`], 16 MiB) are refused; each file's YAML is read
//! within `serde-saphyr`'s default budget (1024 documents, 250 000 nodes);
//! at most [`MAX_FILES`] files and [`MAX_DEPTH`] directory levels are read.
//! The last good objects of every file are kept (to serve them while the
//! file is broken, and to compute deletions), so the objects are held twice:
//! here and in the index.

#![forbid(unsafe_code)]

// Public for the fuzz targets only.
#[doc(hidden)]
pub mod documents;
pub mod metrics;

pub use metrics::ManifestsMetrics;

use ballast_manifests::{is_ignored, is_manifest, Listing};
use ballast_store::{
    resource::{truncate, Resource},
    store::{Op, Store},
};
use documents::{label, ObjectId, Parsed};
use notify::{
    event::{AccessKind, AccessMode, ModifyKind, RenameMode},
    EventKind, RecommendedWatcher, RecursiveMode, Watcher,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    future::Future,
    hash::Hasher,
    io::{self, Read},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};
use tokio::{sync::mpsc, time::Instant};

/// Largest manifest file read by default (16 MiB).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// How long the directory must be quiet after a change before it is read,
/// by default (10 ms).
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(10);
/// Most manifest files read from one directory tree; the rest (in path
/// order) are ignored, with a warning.
pub const MAX_FILES: usize = ballast_manifests::DEFAULT_MAX_FILES;
/// Deepest directory level read below the manifests directory.
pub const MAX_DEPTH: usize = ballast_manifests::DEFAULT_MAX_DEPTH;

/// Longest wait for quiet after a change, however busy the directory.
const DEBOUNCE_CAP: Duration = Duration::from_millis(100);
/// Change signals buffered between the watcher's thread and the source; past
/// it they are dropped (a pending signal already asks for a rescan).
const EVENT_QUEUE: usize = 64;
/// Paths gathered for one targeted rescan; past it, the whole directory is walked.
const MAX_TARGETED_PATHS: usize = 256;
/// Full rescan (metadata only) in case the watcher missed an event.
const RESCAN_INTERVAL: Duration = Duration::from_secs(2);
/// Full rescan when no watcher could be created.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// A file changed this close to when it was read is read again on the next
/// rescan and compared by content: file times are coarse, and a second write
/// of the same size within one tick would leave its metadata unchanged.
const RACY_WINDOW: Duration = Duration::from_secs(2);
/// Entries read from one directory before it is cut short.
const MAX_DIR_ENTRIES: usize = 4 * MAX_FILES;
/// The walk's bounds (`ballast_manifests`, the rule every reader shares).
const WALK_LIMITS: ballast_manifests::Limits = ballast_manifests::Limits {
    max_files: MAX_FILES,
    max_depth: MAX_DEPTH,
    max_dir_entries: MAX_DIR_ENTRIES,
};
/// Longest problem line logged.
const MESSAGE_MAX: usize = 300;
/// Problem lines logged per file read; the rest are counted.
const PROBLEMS_PER_FILE: usize = 5;
/// The watcher's errors are logged at most once per this long (the rest
/// are counted in the next line); each one also asks for a full rescan.
const WATCH_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Where the manifests are and how they are read.
#[derive(Clone, Debug)]
pub struct ManifestsConfig {
    /// The directory read (recursively).
    pub dir: PathBuf,
    /// Files larger than this are refused with an error (their last good
    /// state stays served). Default [`DEFAULT_MAX_FILE_BYTES`], 16 MiB.
    pub max_file_bytes: u64,
    /// Quiet time awaited after a change before rescanning (the wait is
    /// capped at 100 ms however busy the directory is). Default
    /// [`DEFAULT_DEBOUNCE`], 10 ms.
    pub debounce: Duration,
}

impl ManifestsConfig {
    /// Reads `dir` with the default limits.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            debounce: DEFAULT_DEBOUNCE,
        }
    }
}

/// Why the source cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ManifestsError {
    #[error(
        "cannot read the manifests directory {path}: {cause}; create it, or pass an existing, readable directory"
    )]
    Unreadable {
        path: String,
        /// Not the error's `source()`: its text is already in the message,
        /// and `{:#}` would print it twice.
        cause: io::Error,
    },
    #[error(
        "the manifests path {path} is not a directory; pass the directory that holds the *.yaml, *.yml and *.json files"
    )]
    NotADirectory { path: String },
    #[error("the manifests directory scan stopped unexpectedly ({0}); this is a bug: restart the controller and report it")]
    Stopped(String),
}

/// What one full read of a manifests directory found (see [`load`]).
#[derive(Debug, Default)]
pub struct Loaded {
    /// The objects that would be served: one per kind, namespace and name
    /// (the first file in path order wins), ordered by kind, then key.
    pub objects: Vec<Resource>,
    /// One line per problem, as logged: `FILE: document N at line L (Kind
    /// ns/name): field F: reason`.
    pub problems: Vec<String>,
    /// Manifest files found.
    pub files: usize,
    /// Files with a problem (they contribute nothing).
    pub invalid_files: usize,
}

/// Reads a manifests directory once, without a store: what [`run`] would
/// serve after its first load. Blocking (file IO); problems are also logged.
pub fn load(config: &ManifestsConfig) -> Result<Loaded, ManifestsError> {
    check_dir(&config.dir)?;
    let mut manifests = Manifests::new(config.clone());
    let scan = manifests.rescan(&ManifestsMetrics::default(), false);
    let objects = scan
        .ops
        .into_iter()
        .filter_map(|op| match op {
            Op::Apply(r) => Some(r),
            _ => None,
        })
        .collect();
    Ok(Loaded {
        objects,
        problems: scan.problems,
        files: manifests.files.len(),
        invalid_files: manifests.invalid_files(),
    })
}

/// Serves the manifests in `config.dir` into `store` until `shutdown`
/// resolves.
///
/// Loads every manifest file and applies them in one batch, marks the store
/// ready, then follows changes (edits, new files and directories, renames,
/// deletions), normally within tens of milliseconds and at worst within
/// about two seconds if the watcher misses an event. Fails only when the
/// directory cannot be read at start; later problems are logged and counted
/// in `metrics` (`reload_errors_total`, `manifest_files_invalid`,
/// `reloads_total`).
pub async fn run(
    config: ManifestsConfig,
    store: Arc<Store>,
    metrics: ManifestsMetrics,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ManifestsError> {
    check_dir(&config.dir)?;
    let dir = shown(&config.dir);
    let debounce = config.debounce;
    // Watch before the first read so no change falls between the two.
    let (tx, mut events) = mpsc::channel(EVENT_QUEUE);
    let mut watcher = DirWatch::start(&config.dir, tx);
    let period = if watcher.is_some() {
        RESCAN_INTERVAL
    } else {
        POLL_INTERVAL
    };
    let (mut manifests, scan) = rescan(
        Manifests::new(config),
        metrics.clone(),
        Pending {
            settled: false,
            paths: None,
        },
    )
    .await?;
    let objects = scan.ops.len();
    store.update(scan.ops);
    store.set_ready();
    tracing::info!(
        dir = %dir,
        files = manifests.files.len(),
        invalid_files = manifests.invalid_files(),
        objects,
        "Loaded manifests"
    );

    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = watcher.is_some();
    let mut retry: Option<Instant> = None;
    loop {
        let retry_at = retry;
        let mut pending = Pending {
            settled: false,
            paths: None,
        };
        tokio::select! {
            _ = &mut shutdown => break,
            event = events.recv(), if watching => {
                let Some(first) = event else {
                    watching = false;
                    continue;
                };
                tokio::select! {
                    _ = &mut shutdown => break,
                    p = quiet(&mut events, first, debounce) => pending = p,
                }
            }
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {}
        }
        let started = Instant::now();
        let full = pending.paths.is_none();
        let (next, scan) = rescan(manifests, metrics.clone(), pending).await?;
        metrics.manifest_rescans_total.inc();
        manifests = next;
        if full {
            tick.reset();
        }
        retry = scan.retry_after.map(|d| Instant::now() + d);
        if let Some(w) = watcher.as_mut() {
            if w.renew(scan.root_replaced) {
                // Changes made before the new watch began: look once more.
                retry = Some(Instant::now());
            }
        }
        if !scan.ops.is_empty() {
            tracing::debug!(dir = %dir, changes = scan.ops.len(), full, took = ?started.elapsed(), "Manifests changed");
            store.update(scan.ops);
        }
    }
    drop(watcher);
    tracing::debug!(dir = %dir, "Stopped following manifests");
    Ok(())
}

/// Runs one rescan on the blocking pool (it reads and parses files).
async fn rescan(
    mut manifests: Manifests,
    metrics: ManifestsMetrics,
    pending: Pending,
) -> Result<(Manifests, Scan), ManifestsError> {
    tokio::task::spawn_blocking(move || {
        let targeted = pending
            .paths
            .as_ref()
            .and_then(|paths| manifests.rescan_paths(paths, &metrics, pending.settled));
        let scan = match targeted {
            Some(scan) => scan,
            None => manifests.rescan(&metrics, pending.settled),
        };
        (manifests, scan)
    })
    .await
    .map_err(|e| ManifestsError::Stopped(e.to_string()))
}

/// Waits until writes are done: at once when every pending event says a
/// write completed (a file closed after writing, renamed into place, or
/// removed); otherwise until no change has been signalled for `debounce`,
/// or 100 ms in all. Returns whether the changes are known to be complete.
async fn quiet(events: &mut mpsc::Receiver<Signal>, first: Signal, debounce: Duration) -> Pending {
    let mut pending = Pending::default();
    pending.add(first);
    while let Ok(signal) = events.try_recv() {
        pending.add(signal);
    }
    if pending.settled {
        return pending;
    }
    let cap = Instant::now() + DEBOUNCE_CAP;
    loop {
        let until = (Instant::now() + debounce).min(cap);
        match tokio::time::timeout_at(until, events.recv()).await {
            Ok(Some(signal)) => {
                pending.add(signal);
                if Instant::now() >= cap {
                    break;
                }
            }
            _ => break,
        }
    }
    pending.settled = false;
    pending
}

/// What the watcher reported: whether the writes completed, and the paths.
/// No path means "something changed": rescan everything.
struct Signal {
    complete: bool,
    paths: Vec<PathBuf>,
}

/// Signals gathered before one rescan.
struct Pending {
    settled: bool,
    /// The paths to look at, or `None` for the whole directory.
    paths: Option<BTreeSet<PathBuf>>,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            settled: true,
            paths: Some(BTreeSet::new()),
        }
    }
}

impl Pending {
    fn add(&mut self, signal: Signal) {
        self.settled &= signal.complete;
        if signal.paths.is_empty() {
            self.paths = None;
        }
        if let Some(paths) = &mut self.paths {
            paths.extend(signal.paths);
            if paths.len() > MAX_TARGETED_PATHS {
                self.paths = None;
            }
        }
    }
}

/// A recursive watcher on the manifests directory that signals "something
/// changed" on a channel of capacity 1 (a signal already pending is enough),
/// and is set up again when the directory itself is replaced.
struct DirWatch {
    watcher: RecommendedWatcher,
    dir: PathBuf,
    /// Set by the watcher's thread when the directory itself goes away.
    lost: Arc<AtomicBool>,
    /// The directory could not be watched again yet.
    pending: bool,
}

impl DirWatch {
    /// `None`, logged, when the platform will not watch the directory.
    fn start(dir: &Path, tx: mpsc::Sender<Signal>) -> Option<Self> {
        let lost = Arc::new(AtomicBool::new(false));
        let handler = {
            let lost = lost.clone();
            let dir = dir.to_path_buf();
            let mut errors = WatchErrors::default();
            move |event: notify::Result<notify::Event>| {
                let mut complete = false;
                let mut paths = Vec::new();
                if let Err(e) = &event {
                    errors.warn(&dir, e);
                }
                if let Ok(event) = &event {
                    paths.clone_from(&event.paths);
                    if !event.paths.is_empty()
                        && event.paths.iter().all(|p| *p != dir && is_irrelevant(p))
                    {
                        return;
                    }
                    // The first half of a rename is not complete: its other
                    // half follows at once, and one rescan seeing both logs
                    // one rename rather than a removal and an addition.
                    complete = matches!(
                        event.kind,
                        EventKind::Access(AccessKind::Close(AccessMode::Write))
                            | EventKind::Modify(ModifyKind::Name(
                                RenameMode::To
                                    | RenameMode::Both
                                    | RenameMode::Any
                                    | RenameMode::Other
                            ))
                            | EventKind::Remove(_)
                    );
                    match event.kind {
                        // Opening or reading a file (as a rescan does) changes nothing.
                        EventKind::Access(access)
                            if access != AccessKind::Close(AccessMode::Write) =>
                        {
                            return
                        }
                        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
                            if event.paths.contains(&dir) =>
                        {
                            lost.store(true, Ordering::Release);
                        }
                        _ => {}
                    }
                }
                // Errors (e.g. a lost event queue) are signals too, with no
                // path: they ask for a full rescan. So does a full queue.
                if tx.try_send(Signal { complete, paths }).is_err() {
                    let _ = tx.try_send(Signal {
                        complete: false,
                        paths: Vec::new(),
                    });
                }
            }
        };
        let watcher = notify::recommended_watcher(handler).and_then(|mut w| {
            w.watch(dir, RecursiveMode::Recursive)?;
            Ok(w)
        });
        match watcher {
            Ok(watcher) => Some(Self {
                watcher,
                dir: dir.to_path_buf(),
                lost,
                pending: false,
            }),
            Err(e) => {
                let mut reason = e.to_string();
                truncate(&mut reason, 200);
                tracing::warn!(
                    dir = %shown(dir),
                    "Cannot watch the manifests directory for changes ({reason}); polling it every {} ms \
                     instead (raise fs.inotify.max_user_watches or max_user_instances to restore watching)",
                    POLL_INTERVAL.as_millis()
                );
                None
            }
        }
    }

    /// Watches the directory again if it was removed, renamed or replaced
    /// (the old watch went with it). True when a new watch was set up.
    fn renew(&mut self, replaced: bool) -> bool {
        let lost = self.lost.swap(false, Ordering::AcqRel);
        if !(lost || replaced || self.pending) {
            return false;
        }
        let _ = self.watcher.unwatch(&self.dir);
        match self.watcher.watch(&self.dir, RecursiveMode::Recursive) {
            Ok(()) => {
                if self.pending {
                    tracing::info!(dir = %shown(&self.dir), "Watching the manifests directory again");
                }
                self.pending = false;
                true
            }
            Err(e) => {
                // Most likely not back yet; the periodic rescan goes on and
                // the next one tries again.
                tracing::debug!(dir = %shown(&self.dir), error = %e, "Cannot watch the manifests directory yet");
                self.pending = true;
                false
            }
        }
    }
}

/// Whether `dir` can serve as the manifests directory (it exists, is a
/// directory and can be listed): what [`run`] checks first.
pub fn check_dir(dir: &Path) -> Result<(), ManifestsError> {
    let unreadable = |cause| ManifestsError::Unreadable {
        path: shown(dir),
        cause,
    };
    let meta = fs::metadata(dir).map_err(unreadable)?;
    if !meta.is_dir() {
        return Err(ManifestsError::NotADirectory { path: shown(dir) });
    }
    fs::read_dir(dir).map_err(unreadable)?;
    Ok(())
}

/// A path for a message: bounded, without control characters.
fn shown(path: &Path) -> String {
    let mut s: String = path
        .display()
        .to_string()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    truncate(&mut s, 160);
    s
}

/// The directory's state as last read.
struct Manifests {
    config: ManifestsConfig,
    files: BTreeMap<Arc<Path>, FileState>,
    /// Which files define each object; the first (in path order) is served.
    definers: HashMap<ObjectId, Definers>,
    scanned: bool,
    /// The directory's device and inode, to notice it being replaced.
    root_id: Option<(u64, u64)>,
    /// Warnings already given, so a lasting condition is logged once.
    root_unreadable: bool,
    truncated: bool,
    unreadable_dirs: BTreeSet<PathBuf>,
}

struct FileState {
    stat: Stat,
    /// Hash of the content last read, if it could be read.
    content: Option<u64>,
    read_at: SystemTime,
    /// The last good objects (empty if the file never read cleanly).
    objects: BTreeMap<ObjectId, Resource>,
    /// The last read had a problem.
    invalid: bool,
}

impl FileState {
    /// Could the file have changed since it was read without its metadata
    /// showing it?
    fn racy(&self) -> bool {
        match self.stat.changed {
            Some(changed) => self
                .read_at
                .duration_since(changed)
                .map_or(true, |age| age < RACY_WINDOW),
            None => true,
        }
    }
}

/// What a rescan found.
#[derive(Default)]
struct Scan {
    ops: Vec<Op>,
    problems: Vec<String>,
    /// Files were changing as the scan looked: look again after this long.
    retry_after: Option<Duration>,
    /// The directory itself was replaced (or came back): watch it anew.
    root_replaced: bool,
}

enum Change {
    Removed,
    Loaded(FileState),
    /// The read failed: keep the objects, remember the metadata.
    Failed {
        stat: Stat,
        content: Option<u64>,
        read_at: SystemTime,
    },
    /// Same content as before (metadata changed only).
    Same {
        stat: Stat,
        read_at: SystemTime,
    },
}

impl Manifests {
    fn new(config: ManifestsConfig) -> Self {
        Self {
            config,
            files: BTreeMap::new(),
            definers: HashMap::new(),
            scanned: false,
            root_id: None,
            root_unreadable: false,
            truncated: false,
            unreadable_dirs: BTreeSet::new(),
        }
    }

    fn invalid_files(&self) -> usize {
        self.files.values().filter(|f| f.invalid).count()
    }

    /// Walks the directory, reads what changed, and returns the ops that
    /// bring the store from the previous state to the new one.
    /// `settled`: the watcher saw every write complete, so files need not be
    /// left to settle.
    fn rescan(&mut self, metrics: &ManifestsMetrics, settled: bool) -> Scan {
        let mut scan = Scan::default();
        let listing = match ballast_manifests::walk(&self.config.dir, &WALK_LIMITS) {
            Ok(listing) => listing,
            Err(e) => {
                if !self.root_unreadable {
                    self.root_unreadable = true;
                    tracing::warn!(
                        dir = %shown(&self.config.dir),
                        "Cannot read the manifests directory ({e}); keeping the objects already loaded \
                         until it can be read again (restore the directory or its permissions)"
                    );
                }
                return scan;
            }
        };
        if std::mem::take(&mut self.root_unreadable) {
            tracing::info!(dir = %shown(&self.config.dir), "The manifests directory is readable again");
            scan.root_replaced = true;
        }
        if self.root_id.is_some() && self.root_id != listing.root_id {
            scan.root_replaced = true;
        }
        self.root_id = listing.root_id;
        self.warn_limits(&listing);

        let now = SystemTime::now();
        let mut changes: Vec<(Arc<Path>, Change)> = Vec::new();
        for path in self.files.keys() {
            let under_unreadable = listing.unreadable.iter().any(|(d, _)| path.starts_with(d));
            if !listing.files.contains_key(path) && !under_unreadable {
                changes.push((path.clone(), Change::Removed));
            }
        }
        for (path, meta) in &listing.files {
            let stat = Stat::of(meta);
            self.check_file(path, stat, now, settled, metrics, &mut scan, &mut changes);
        }
        self.apply(changes, &mut scan);
        metrics
            .manifest_files_invalid
            .set(self.invalid_files() as i64);
        self.scanned = true;
        scan
    }

    /// Reads one file if it changed, and records what to do with it.
    #[allow(clippy::too_many_arguments)]
    fn check_file(
        &self,
        path: &Arc<Path>,
        stat: Stat,
        now: SystemTime,
        settled: bool,
        metrics: &ManifestsMetrics,
        scan: &mut Scan,
        changes: &mut Vec<(Arc<Path>, Change)>,
    ) {
        let old = self.files.get(path);
        if old.is_some_and(|old| old.stat == stat && !old.racy()) {
            return;
        }
        if self.scanned && !settled {
            if let Some(wait) = settling(stat.changed, now, self.config.debounce) {
                // Still being written: keep the old state, look again soon.
                scan.retry_after = Some(scan.retry_after.map_or(wait, |w| w.min(wait)));
                return;
            }
        }
        let read_at = SystemTime::now();
        let text = match read_text(path, self.config.max_file_bytes) {
            Ok(text) => text,
            Err(ReadError::Gone) => {
                if old.is_some() {
                    changes.push((path.clone(), Change::Removed));
                }
                return;
            }
            Err(e) => {
                if self.scanned {
                    metrics.reloads_total.inc();
                }
                metrics.reload_errors_total.inc();
                let had_objects = old.is_some_and(|o| !o.objects.is_empty());
                report(path, [e.to_string()].into_iter(), had_objects, scan);
                changes.push((
                    path.clone(),
                    Change::Failed {
                        stat,
                        content: None,
                        read_at,
                    },
                ));
                return;
            }
        };
        let content = hash(&text);
        if old.is_some_and(|old| old.content == Some(content)) {
            changes.push((path.clone(), Change::Same { stat, read_at }));
            return;
        }
        if self.scanned {
            metrics.reloads_total.inc();
        }
        let parsed = documents::parse(&text);
        drop(text);
        let change = self.judge(path, parsed, stat, content, read_at, metrics, scan);
        changes.push((path.clone(), change));
    }

    /// Looks only at `paths` (what the watcher named), skipping the walk of
    /// the whole directory. `None` when that is not enough: a directory
    /// changed, a path is outside or too deep, or a file would pass a limit.
    fn rescan_paths(
        &mut self,
        paths: &BTreeSet<PathBuf>,
        metrics: &ManifestsMetrics,
        settled: bool,
    ) -> Option<Scan> {
        if !self.scanned {
            return None;
        }
        let root = self.config.dir.clone();
        let now = SystemTime::now();
        let mut scan = Scan::default();
        let mut changes: Vec<(Arc<Path>, Change)> = Vec::new();
        for path in paths {
            let rel = path.strip_prefix(&root).ok()?;
            if rel.components().count() > MAX_DEPTH + 1 {
                return None;
            }
            let known = self
                .files
                .get_key_value(path.as_path())
                .map(|(k, _)| k.clone());
            match fs::metadata(path) {
                Ok(meta) if meta.is_file() => {
                    let name = path.file_name()?.to_string_lossy();
                    if is_ignored(&name) || !is_manifest(path) {
                        continue;
                    }
                    let key = match known {
                        Some(key) => key,
                        None if self.files.len() >= MAX_FILES => return None,
                        None => Arc::from(path.as_path()),
                    };
                    self.check_file(
                        &key,
                        Stat::of(&meta),
                        now,
                        settled,
                        metrics,
                        &mut scan,
                        &mut changes,
                    );
                }
                Ok(_) => return None,
                Err(e) if e.kind() == io::ErrorKind::NotFound => match known {
                    Some(key) => changes.push((key, Change::Removed)),
                    // Gone, and no file under it known: nothing to do.
                    None if !has_key_under(&self.files, path) => {}
                    None => return None,
                },
                Err(_) => return None,
            }
        }
        self.apply(changes, &mut scan);
        metrics
            .manifest_files_invalid
            .set(self.invalid_files() as i64);
        Some(scan)
    }

    /// Turns a parsed file into a change: all of it, or (on any problem)
    /// nothing but the new metadata.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        path: &Arc<Path>,
        parsed: Parsed,
        stat: Stat,
        content: u64,
        read_at: SystemTime,
        metrics: &ManifestsMetrics,
        scan: &mut Scan,
    ) -> Change {
        let file = shown(path);
        for dup in &parsed.duplicates {
            tracing::warn!(
                "{file}: {} is defined twice ({} and {}); the first is served, remove the other",
                label(&dup.id),
                dup.first,
                dup.again
            );
        }
        if !parsed.problems.is_empty() {
            metrics.reload_errors_total.inc();
            let had_objects = self.files.get(path).is_some_and(|o| !o.objects.is_empty());
            report(
                path,
                parsed.problems.iter().map(|p| p.to_string()),
                had_objects,
                scan,
            );
            return Change::Failed {
                stat,
                content: Some(content),
                read_at,
            };
        }
        if parsed.skipped > 0 {
            tracing::debug!(
                file = %file,
                skipped = parsed.skipped,
                "Skipped objects of kinds the index does not use"
            );
        }
        Change::Loaded(FileState {
            stat,
            content: Some(content),
            read_at,
            objects: parsed.objects,
            invalid: false,
        })
    }

    /// Records the changes and returns, in `scan.ops`, what the store must
    /// do: for every object a changed file defined or defines, compare what
    /// was served with what is served now.
    fn apply(&mut self, changes: Vec<(Arc<Path>, Change)>, scan: &mut Scan) {
        let mut affected: BTreeSet<ObjectId> = BTreeSet::new();
        for (path, change) in &changes {
            if let Change::Removed | Change::Loaded(_) = change {
                if let Some(old) = self.files.get(path) {
                    affected.extend(old.objects.keys().cloned());
                }
            }
            if let Change::Loaded(new) = change {
                affected.extend(new.objects.keys().cloned());
            }
        }
        let before: Vec<(ObjectId, Option<Resource>)> = affected
            .into_iter()
            .map(|id| {
                let served = self.served(&id).cloned();
                (id, served)
            })
            .collect();

        let mut events = FileEvents::default();
        for (path, change) in changes {
            match change {
                Change::Removed => {
                    if let Some(old) = self.files.remove(&path) {
                        self.disown(&path, old.objects.keys());
                        events.removed(&path, old.objects);
                    }
                }
                Change::Loaded(new) => {
                    let old = self.files.remove(&path);
                    if let Some(old) = &old {
                        self.disown(&path, old.objects.keys());
                    }
                    events.loaded(&path, old.as_ref(), &new);
                    for id in new.objects.keys() {
                        let definers = self.definers.entry(id.clone()).or_default();
                        definers.insert(&path);
                        if definers.len() > 1 {
                            warn_duplicate(id, definers, &path);
                        }
                    }
                    self.files.insert(path, new);
                }
                Change::Failed {
                    stat,
                    content,
                    read_at,
                } => match self.files.get_mut(&path) {
                    Some(file) => {
                        file.stat = stat;
                        file.content = content;
                        file.read_at = read_at;
                        file.invalid = true;
                    }
                    None => {
                        self.files.insert(
                            path,
                            FileState {
                                stat,
                                content,
                                read_at,
                                objects: BTreeMap::new(),
                                invalid: true,
                            },
                        );
                    }
                },
                Change::Same { stat, read_at } => {
                    if let Some(file) = self.files.get_mut(&path) {
                        file.stat = stat;
                        file.read_at = read_at;
                    }
                }
            }
        }

        for (id, was) in before {
            match (was, self.served(&id)) {
                (Some(_), None) => scan.ops.push(Op::Delete(id.0, id.1)),
                (was, Some(now)) if was.as_ref() != Some(now) => {
                    scan.ops.push(Op::Apply(now.clone()))
                }
                _ => {}
            }
        }
        // The first load is summed up in one line by the caller.
        if self.scanned {
            events.log();
        }
    }

    /// The definition served for `id`: the first file's.
    fn served(&self, id: &ObjectId) -> Option<&Resource> {
        let path = self.definers.get(id)?.first()?;
        self.files.get(path)?.objects.get(id)
    }

    fn disown<'a>(&mut self, path: &Arc<Path>, ids: impl Iterator<Item = &'a ObjectId>) {
        for id in ids {
            if let Some(definers) = self.definers.get_mut(id) {
                definers.remove(path);
                if definers.is_empty() {
                    self.definers.remove(id);
                }
            }
        }
    }

    fn warn_limits(&mut self, listing: &Listing) {
        if listing.truncated() && !self.truncated {
            tracing::warn!(
                dir = %shown(&self.config.dir),
                "The manifests directory holds more than {MAX_FILES} manifest files, directories more than \
                 {MAX_DIR_ENTRIES} entries, or directories nested deeper than {MAX_DEPTH} levels; the rest \
                 is ignored. Point the controller at a smaller directory"
            );
        }
        self.truncated = listing.truncated();
        let now: BTreeSet<PathBuf> = listing.unreadable.iter().map(|(d, _)| d.clone()).collect();
        for dir in now.difference(&self.unreadable_dirs) {
            tracing::warn!(
                dir = %shown(dir),
                "Cannot read a directory under the manifests directory; the objects already loaded from it \
                 are kept. Fix its permissions"
            );
        }
        self.unreadable_dirs = now;
    }
}

/// The files that define one object, in path order. Nearly always one: a
/// sorted vector costs one small allocation where a set would cost a node.
#[derive(Default)]
struct Definers(Vec<Arc<Path>>);

impl Definers {
    fn insert(&mut self, path: &Arc<Path>) {
        if let Err(at) = self.0.binary_search(path) {
            self.0.insert(at, path.clone());
        }
    }

    fn remove(&mut self, path: &Arc<Path>) {
        if let Ok(at) = self.0.binary_search(path) {
            self.0.remove(at);
        }
    }

    fn first(&self) -> Option<&Arc<Path>> {
        self.0.first()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<Path>> {
        self.0.iter()
    }
}

/// What one rescan did to each file, logged one line per file whose
/// objects changed. A file removed and another loaded with the very same
/// objects in one rescan is a rename (onto a new name, or over another
/// file): one line.
#[derive(Default)]
struct FileEvents {
    removed: Vec<(Arc<Path>, BTreeMap<ObjectId, Resource>)>,
    loaded: Vec<LoadedFile>,
}

/// A file read cleanly, and what that changed.
struct LoadedFile {
    path: Arc<Path>,
    objects: BTreeMap<ObjectId, Resource>,
    what: LoadedKind,
}

enum LoadedKind {
    /// A new file.
    Added,
    /// Changed in place: objects added or updated, objects removed.
    Changed { updated: usize, removed: usize },
    /// Was broken, reads cleanly now.
    Fixed,
}

impl FileEvents {
    fn removed(&mut self, path: &Arc<Path>, objects: BTreeMap<ObjectId, Resource>) {
        if !objects.is_empty() {
            self.removed.push((path.clone(), objects));
        }
    }

    fn loaded(&mut self, path: &Arc<Path>, old: Option<&FileState>, new: &FileState) {
        let what = match old {
            None if new.objects.is_empty() => return,
            None => LoadedKind::Added,
            Some(old) if old.invalid => LoadedKind::Fixed,
            Some(old) => {
                let updated = new
                    .objects
                    .iter()
                    .filter(|(id, r)| old.objects.get(*id) != Some(*r))
                    .count();
                let removed = old
                    .objects
                    .keys()
                    .filter(|id| !new.objects.contains_key(*id))
                    .count();
                if updated + removed == 0 {
                    return;
                }
                LoadedKind::Changed { updated, removed }
            }
        };
        self.loaded.push(LoadedFile {
            path: path.clone(),
            objects: new.objects.clone(),
            what,
        });
    }

    fn log(mut self) {
        for (from, objects) in std::mem::take(&mut self.removed) {
            let Some(at) = self.loaded.iter().position(|l| l.objects == objects) else {
                tracing::info!(
                    "{}: removed ({} no longer defined by it)",
                    shown(&from),
                    count(objects.len())
                );
                continue;
            };
            let to = self.loaded.remove(at);
            match to.what {
                LoadedKind::Added => {
                    tracing::info!(
                        "{}: renamed to {} (same objects)",
                        shown(&from),
                        shown(&to.path)
                    )
                }
                LoadedKind::Changed { updated, removed } => tracing::info!(
                    "{}: renamed over {} ({} added or updated, {removed} removed)",
                    shown(&from),
                    shown(&to.path),
                    count(updated)
                ),
                LoadedKind::Fixed => tracing::info!(
                    "{}: renamed over {}, which was broken ({} served)",
                    shown(&from),
                    shown(&to.path),
                    count(to.objects.len())
                ),
            }
        }
        for loaded in self.loaded {
            let file = shown(&loaded.path);
            match loaded.what {
                LoadedKind::Added => {
                    tracing::info!("{file}: added ({})", count(loaded.objects.len()))
                }
                LoadedKind::Changed { updated, removed } => tracing::info!(
                    "{file}: changed ({} added or updated, {removed} removed)",
                    count(updated)
                ),
                LoadedKind::Fixed => tracing::info!(
                    "{file}: fixed; it reads cleanly again ({} served)",
                    count(loaded.objects.len())
                ),
            }
        }
    }
}

/// `1 object`, `2 objects`.
fn count(objects: usize) -> String {
    match objects {
        1 => "1 object".to_string(),
        n => format!("{n} objects"),
    }
}

/// The watcher's errors (a lost event queue, a watch limit reached, a watch
/// that cannot be removed): each one asks for a full rescan, and is logged
/// at WARN at most once per [`WATCH_ERROR_LOG_INTERVAL`].
#[derive(Default)]
struct WatchErrors {
    last: Option<std::time::Instant>,
    unlogged: u64,
}

impl WatchErrors {
    fn warn(&mut self, dir: &Path, error: &notify::Error) {
        let Some(earlier) = self.admit(std::time::Instant::now()) else {
            return;
        };
        let mut reason = error.to_string();
        truncate(&mut reason, 200);
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        tracing::warn!(
            dir = %shown(dir),
            "The manifests directory's watcher failed ({reason}; {earlier} more since the last such line); \
             rescanning the whole directory"
        );
    }

    /// Whether an error at `now` is logged: `Some(errors not logged since
    /// the last line)`, or `None` (counted) within the interval.
    fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < WATCH_ERROR_LOG_INTERVAL)
        {
            self.unlogged += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod watch_error_tests {
    use super::{WatchErrors, WATCH_ERROR_LOG_INTERVAL};
    use std::time::{Duration, Instant};

    #[test]
    fn watcher_errors_are_logged_once_per_interval_with_a_count_of_the_rest() {
        let t0 = Instant::now();
        let mut errors = WatchErrors::default();
        assert_eq!(errors.admit(t0), Some(0));
        assert_eq!(errors.admit(t0 + Duration::from_secs(1)), None);
        assert_eq!(errors.admit(t0 + Duration::from_secs(9)), None);
        assert_eq!(errors.admit(t0 + WATCH_ERROR_LOG_INTERVAL), Some(2));
        assert_eq!(
            errors.admit(t0 + WATCH_ERROR_LOG_INTERVAL + Duration::from_secs(1)),
            None
        );
        assert_eq!(errors.admit(t0 + 3 * WATCH_ERROR_LOG_INTERVAL), Some(1));
    }
}

fn warn_duplicate(id: &ObjectId, definers: &Definers, path: &Arc<Path>) {
    let mut paths = definers.iter();
    let (Some(first), Some(second)) = (paths.next(), paths.next()) else {
        return;
    };
    let other = if first == path { second } else { first };
    tracing::warn!(
        "{} is defined in both {} and {}; serving the one in {} (first in path order). Remove one of them",
        label(id),
        shown(other),
        shown(path),
        shown(first)
    );
}

/// Logs a file's problems, one line each (a few at most), and keeps them.
fn report(path: &Path, problems: impl Iterator<Item = String>, had_objects: bool, scan: &mut Scan) {
    let file = shown(path);
    let consequence = if had_objects {
        "nothing from this file changes until it is fixed; its previous objects stay served"
    } else {
        "nothing from this file is served until it is fixed"
    };
    let mut count = 0;
    for problem in problems {
        count += 1;
        if count > PROBLEMS_PER_FILE {
            continue;
        }
        // Parser messages may quote the file; keep the line one line.
        let mut line: String = format!("{file}: {problem}")
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        truncate(&mut line, MESSAGE_MAX);
        tracing::warn!("{line} ({consequence})");
        scan.problems.push(line);
    }
    if count > PROBLEMS_PER_FILE {
        let line = format!(
            "{file}: {} more problems not shown",
            count - PROBLEMS_PER_FILE
        );
        tracing::warn!("{line}");
        scan.problems.push(line);
    }
}

/// How long to wait before reading a file changed less than `window` ago
/// (it may still be being written). A change time in the future does not
/// count: clocks move.
fn settling(changed: Option<SystemTime>, now: SystemTime, window: Duration) -> Option<Duration> {
    let age = now.duration_since(changed?).ok()?;
    (age < window).then(|| window - age)
}

fn hash(text: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(text.as_bytes());
    h.finish()
}

/// A file's metadata: what tells, without reading it, that it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    len: u64,
    modified: Option<SystemTime>,
    /// The inode change time where there is one (set by the kernel's clock,
    /// whatever the file's mtime says), else the modification time.
    changed: Option<SystemTime>,
    /// Device and inode: a file replaced by a rename is a new file.
    id: (u64, u64),
}

impl Stat {
    fn of(meta: &fs::Metadata) -> Self {
        let modified = meta.modified().ok();
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let changed = u64::try_from(meta.ctime()).ok().map(|secs| {
                SystemTime::UNIX_EPOCH
                    + Duration::new(secs, u32::try_from(meta.ctime_nsec()).unwrap_or(0))
            });
            Self {
                len: meta.len(),
                modified,
                changed,
                id: (meta.dev(), meta.ino()),
            }
        }
        #[cfg(not(unix))]
        {
            Self {
                len: meta.len(),
                modified,
                changed: modified,
                id: (0, 0),
            }
        }
    }
}

enum ReadError {
    /// Removed since it was listed.
    Gone,
    TooLarge {
        len: u64,
        max: u64,
    },
    NotUtf8 {
        offset: usize,
    },
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Gone => f.write_str("removed while being read"),
            ReadError::TooLarge { len, max } => write!(
                f,
                "the file is larger than the limit ({len} bytes, at most {max} read); split it into smaller \
                 files or raise the manifests max file size"
            ),
            ReadError::NotUtf8 { offset } => write!(
                f,
                "not UTF-8 text (invalid byte at offset {offset}); save the file as UTF-8"
            ),
            ReadError::Io(e) => write!(f, "cannot read the file ({e}); check its permissions"),
        }
    }
}

/// Reads a whole file, refusing one larger than `max` bytes (it is checked
/// before reading and while reading, in case it grows).
fn read_text(path: &Path, max: u64) -> Result<String, ReadError> {
    let io_error = |e: io::Error| match e.kind() {
        io::ErrorKind::NotFound => ReadError::Gone,
        _ => ReadError::Io(e),
    };
    let file = fs::File::open(path).map_err(io_error)?;
    let len = file.metadata().map_err(io_error)?.len();
    if len > max {
        return Err(ReadError::TooLarge { len, max });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge {
            len: bytes.len() as u64,
            max,
        });
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Events about files the source never reads (editor and temp files, other
/// extensions) need no rescan: writing `x.yaml.tmp~` before renaming it to
/// `x.yaml` must not delay the rescan the rename asks for.
fn is_irrelevant(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    (is_ignored(name) || (path.extension().is_some() && !is_manifest(path))) && !path.is_dir()
}

/// Whether a key lies under `dir`. Paths order by component, so the ones
/// under `dir` come right after it: one lookup, not a visit of every file
/// (a renamed-away temporary file asks this on every write).
fn has_key_under<V>(files: &BTreeMap<Arc<Path>, V>, dir: &Path) -> bool {
    files
        .range::<Path, _>((std::ops::Bound::Excluded(dir), std::ops::Bound::Unbounded))
        .next()
        .is_some_and(|(k, _)| k.starts_with(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_under_a_directory_is_found_by_one_lookup() {
        let files: BTreeMap<Arc<Path>, ()> =
            ["/m/a/x.yaml", "/m/a0.yaml", "/m/b/c/y.yaml", "/m/z.yaml"]
                .into_iter()
                .map(|p| (Arc::from(Path::new(p)), ()))
                .collect();
        for (dir, under) in [
            ("/m/a", true),
            ("/m/b", true),
            ("/m/b/c", true),
            ("/m", true),
            ("/m/a0", false),
            ("/m/a/x", false),
            ("/m/c", false),
            ("/m/z.yaml", false),
            ("/n", false),
        ] {
            assert_eq!(has_key_under(&files, Path::new(dir)), under, "{dir}");
            let by_visit = files
                .keys()
                .any(|k| k.starts_with(dir) && **k != *Path::new(dir));
            assert_eq!(by_visit, under, "{dir}: as a visit of every key says");
        }
    }
}
