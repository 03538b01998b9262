//! What the controller last said, kept in a file that outlives the proxy's
//! container (an `emptyDir` injection adds), so a proxy restarted while the
//! controller is away starts from it instead of from nothing.
//!
//! The [`Book`] holds the last message of every watch (inbound and
//! outbound policies, profiles) and every target's endpoint set, each with
//! when the controller last said or confirmed it; it is bounded per kind by
//! `--max-targets` and in age by `--stale-endpoints-grace`. A writer task
//! writes it whole (temporary file, fsync, rename) at most once per
//! `--snapshot-interval`, within `--snapshot-max-bytes` (inbound policies
//! first). An inbound policy is written before it takes effect (at most one
//! write per [`URGENT_SPACING`]): a snapshot never holds a policy wider than
//! the one in force, and a failed write removes the file (as does a write
//! not done within [`DURABLE_WAIT`]: the policy then takes effect anyway).
//!
//! On start, a watch whose key the book holds waits `--snapshot-wait` for
//! the controller, then serves the book's message as if the controller had
//! sent it (counted in `discovery_snapshot_served_total`, shown in
//! `discovery_snapshot_serving` and on `/ready`); the controller's first
//! message replaces it.

mod file;

pub use file::Kind;

use super::EndpointSet;
use crate::metrics::Metrics;
use bytes::Bytes;
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, Weak,
    },
    time::{Duration, SystemTime},
};
use tokio::sync::{watch, Notify};

/// The least time between two writes when an inbound policy waits on them.
pub const URGENT_SPACING: Duration = Duration::from_millis(100);

/// The longest an inbound policy waits for its write before it takes effect
/// anyway (and the file is removed).
pub const DURABLE_WAIT: Duration = Duration::from_secs(1);

/// Where and how the snapshot is kept.
#[derive(Clone, Debug)]
pub struct SnapshotConfig {
    pub path: PathBuf,
    /// Routine changes are written at most this often.
    pub interval: Duration,
    /// How long a watch waits for the controller before serving the book.
    pub wait: Duration,
    /// The file's bound; entries past it are left out (counted).
    pub max_bytes: usize,
    /// Entries older than this are neither written nor served.
    pub grace: Duration,
    /// Entries kept per kind.
    pub max_entries: usize,
    /// Whose snapshot this is (`PortSpec.workload`); another's is refused.
    pub workload: String,
}

/// What an entry holds until it is written.
#[derive(Clone, Debug)]
pub enum Held {
    /// A message as the controller sent it.
    Encoded(Bytes),
    /// A target's endpoint set, encoded when written.
    Endpoints(Arc<EndpointSet>),
}

#[derive(Debug)]
struct Recorded {
    held: Held,
    heard: SystemTime,
    /// Said by the controller to this process (not only read from the file).
    confirmed: bool,
    /// The watch that keeps it current; while it lives and the controller
    /// is connected, the entry is current.
    alive: Weak<()>,
}

type Key = (Kind, Arc<str>);

/// The book's entries, with how many there are of each kind (the bound is
/// checked per record without a scan).
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Key, Recorded>,
    per_kind: [usize; Kind::ALL.len()],
}

impl Entries {
    fn insert(&mut self, key: Key, r: Recorded) {
        let kind = key.0;
        if self.map.insert(key, r).is_none() {
            self.per_kind[kind.index()] += 1;
        }
    }

    fn remove(&mut self, key: &Key) {
        if self.map.remove(key).is_some() {
            self.per_kind[key.0.index()] -= 1;
        }
    }

    /// Keeps the entries `keep` says to keep.
    fn retain(&mut self, mut keep: impl FnMut(&mut Recorded) -> bool) {
        let per_kind = &mut self.per_kind;
        self.map.retain(|(kind, _), r| {
            let kept = keep(r);
            if !kept {
                per_kind[kind.index()] -= 1;
            }
            kept
        });
    }
}

/// A message the book holds for a watch opening now.
#[derive(Clone, Debug)]
pub struct Restored {
    pub message: Bytes,
    pub age: Duration,
}

/// The last word on every watch, and the file it is kept in.
#[derive(Debug)]
pub struct Book {
    config: SnapshotConfig,
    entries: Mutex<Entries>,
    /// Bumped by every record; a write covers the generation it read.
    generation: AtomicU64,
    dirty: Notify,
    urgent: AtomicBool,
    written: watch::Sender<u64>,
    /// When the file read at start was written.
    loaded_written: Option<SystemTime>,
    /// Held by the blocking thread that writes the file (not by the task
    /// that waits on it, which may be aborted): one write at a time, and
    /// none over a newer one (the generation the file covers).
    file: Arc<Mutex<u64>>,
    metrics: Arc<Metrics>,
}

impl Book {
    /// The book, starting from the file at `config.path` when it holds a
    /// usable snapshot. A missing file is a first start; any other problem
    /// is one warning and an empty book.
    pub fn load(config: SnapshotConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        let now = SystemTime::now();
        let snapshot = &metrics.discovery.snapshot;
        let mut entries = Entries::default();
        let mut loaded_written = None;
        match read(&config) {
            Ok(None) => tracing::info!(path = %config.path.display(), "no snapshot yet"),
            Ok(Some((written, read, len))) => {
                snapshot.bytes.set(i64::try_from(len).unwrap_or(i64::MAX));
                let total = read.len();
                let mut fresh: Vec<file::Entry> = read
                    .into_iter()
                    .filter(|e| age(now, e.heard) <= config.grace)
                    .collect();
                // The newest first, so the bound keeps them.
                fresh.sort_by_key(|e| std::cmp::Reverse(e.heard));
                let mut per_kind: HashMap<Kind, usize> = HashMap::new();
                for e in fresh {
                    let n = per_kind.entry(e.kind).or_default();
                    if *n >= config.max_entries {
                        continue;
                    }
                    *n += 1;
                    entries.insert(
                        (e.kind, Arc::from(e.key)),
                        Recorded {
                            held: Held::Encoded(e.message),
                            heard: e.heard,
                            confirmed: false,
                            alive: Weak::new(),
                        },
                    );
                }
                tracing::info!(
                    path = %config.path.display(),
                    written_seconds_ago = age(now, written).as_secs(),
                    entries = entries.map.len(),
                    past_the_grace = total - entries.map.len(),
                    "read the snapshot"
                );
                loaded_written = Some(written);
            }
            Err(refused) => {
                snapshot
                    .ignored_total
                    .get_or_create(&ReasonLabels {
                        reason: refused.label(),
                    })
                    .inc();
                tracing::warn!(path = %config.path.display(), reason = %refused, "the snapshot is ignored");
            }
        }
        snapshot
            .restored_entries
            .set(i64::try_from(entries.map.len()).unwrap_or(i64::MAX));
        Arc::new(Self {
            config,
            entries: Mutex::new(entries),
            generation: AtomicU64::new(0),
            dirty: Notify::new(),
            urgent: AtomicBool::new(false),
            written: watch::channel(0).0,
            loaded_written,
            file: Arc::default(),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a watch waits for the controller before serving the book.
    pub fn wait(&self) -> Duration {
        self.config.wait
    }

    /// The book's message for a watch of `kind` on `key`, if it holds one
    /// within the grace. Endpoint sets heard by this process are kept by
    /// `LastKnown`; only those read from the file come from here.
    pub fn restored(&self, kind: Kind, key: &str) -> Option<Restored> {
        let now = SystemTime::now();
        let entries = self.lock();
        let r = entries.map.get(&(kind, Arc::from(key)))?;
        let Held::Encoded(message) = &r.held else {
            return None;
        };
        let age = age(now, r.heard);
        (age <= self.config.grace).then(|| Restored {
            message: message.clone(),
            age,
        })
    }

    /// The controller said `held` for `key`; `alive` lives as long as the
    /// watch that keeps it current. Returns the record's generation.
    pub fn record(&self, kind: Kind, key: &Arc<str>, held: Held, alive: &Arc<()>) -> u64 {
        let now = SystemTime::now();
        {
            let mut entries = self.lock();
            let k = (kind, key.clone());
            if !entries.map.contains_key(&k)
                && entries.per_kind[kind.index()] >= self.config.max_entries
            {
                let oldest = entries
                    .map
                    .iter()
                    .filter(|((k, _), _)| *k == kind)
                    .min_by_key(|(_, r)| r.heard)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
            entries.insert(
                k,
                Recorded {
                    held,
                    heard: now,
                    confirmed: true,
                    alive: Arc::downgrade(alive),
                },
            );
        }
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.dirty.notify_one();
        generation
    }

    /// As [`Book::record`], and returns once a write has covered it (or
    /// failed, which removes the file): what is in force is never narrower
    /// than what the file says.
    pub async fn record_durably(&self, kind: Kind, key: &Arc<str>, held: Held, alive: &Arc<()>) {
        let generation = self.record(kind, key, held, alive);
        self.urgent.store(true, Ordering::Release);
        self.dirty.notify_one();
        let mut written = self.written.subscribe();
        // The writer lives as long as the book's owner; if it is gone, the
        // proxy is stopping.
        let covered = written.wait_for(|w| *w >= generation);
        if tokio::time::timeout(DURABLE_WAIT, covered).await.is_err() {
            // A stuck disk must not hold back a policy (it may revoke
            // access); the file, which may now be wider, goes instead.
            tracing::warn!(path = %self.config.path.display(), "the snapshot was not written within 1s; removing it and applying the inbound policy");
            let path = self.config.path.clone();
            drop(tokio::task::spawn_blocking(move || {
                std::fs::remove_file(path)
            }));
        }
    }

    /// A watch of `kind` now serves the book's answer: counted, and shown
    /// while the returned guard lives.
    pub fn serving(self: &Arc<Self>, kind: Kind, age: Duration) -> Serving {
        let snapshot = &self.metrics.discovery.snapshot;
        snapshot
            .served_total
            .get_or_create(&KindLabels { kind: kind.label() })
            .inc();
        snapshot.serving.inc();
        tracing::info!(
            kind = kind.label(),
            age_seconds = age.as_secs(),
            "the controller has not answered; serving the snapshot's answer"
        );
        Serving(self.metrics.clone())
    }

    /// A line for `/ready` while watches are served from the snapshot.
    pub fn readiness_detail(&self) -> Option<String> {
        let serving = self.metrics.discovery.snapshot.serving.get();
        if serving <= 0 {
            return None;
        }
        let written = self
            .loaded_written
            .map(|w| {
                format!(
                    " (written {}s before this proxy started)",
                    age(SystemTime::now(), w).as_secs()
                )
            })
            .unwrap_or_default();
        Some(format!(
            "serving {serving} watches from the snapshot{written}: the destination controller has not answered them"
        ))
    }

    /// Writes the file now (at shutdown).
    pub async fn flush(self: &Arc<Self>, connected: bool) {
        self.write(connected).await;
    }

    /// Writes the book when it changes, at most once per interval (or per
    /// [`URGENT_SPACING`] when an inbound policy waits), until the returned
    /// task is aborted.
    pub fn spawn_writer(
        self: &Arc<Self>,
        connected: impl Fn() -> bool + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let book = self.clone();
        tokio::spawn(async move {
            let mut last: Option<tokio::time::Instant> = None;
            loop {
                book.dirty.notified().await;
                loop {
                    let spacing = if book.urgent.load(Ordering::Acquire) {
                        URGENT_SPACING
                    } else {
                        book.config.interval
                    };
                    let Some(at) = last.map(|l| l + spacing) else {
                        break;
                    };
                    if tokio::time::Instant::now() >= at {
                        break;
                    }
                    // An urgent record shortens a routine wait.
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => break,
                        () = book.dirty.notified() => {}
                    }
                }
                book.urgent.store(false, Ordering::Release);
                last = Some(tokio::time::Instant::now());
                book.write(connected()).await;
            }
        })
    }

    /// Writes the book whole; wakes those waiting on what it covers.
    async fn write(self: &Arc<Self>, connected: bool) {
        let generation = self.generation.load(Ordering::Acquire);
        let now = SystemTime::now();
        let taken = self.take(connected, now);
        let (workload, max_bytes) = (self.config.workload.clone(), self.config.max_bytes);
        let (path, file) = (self.config.path.clone(), self.file.clone());
        // Encoding thousands of endpoint sets takes milliseconds: off the
        // runtime's threads, with the file's write.
        let result = tokio::task::spawn_blocking(move || {
            let (body, left_out) = body(taken, workload, max_bytes, now);
            let bytes = file::encode(&body);
            let mut covered = file.lock().unwrap_or_else(|e| e.into_inner());
            if generation < *covered {
                return Ok((bytes.len(), left_out));
            }
            let written = write_atomically(&path, &bytes);
            match &written {
                Ok(()) => *covered = generation,
                // An older file could hold a wider inbound policy than the
                // one now in force: none is better.
                Err(_) => {
                    let _ = std::fs::remove_file(&path);
                }
            }
            written.map(|()| (bytes.len(), left_out))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let snapshot = &self.metrics.discovery.snapshot;
        match result {
            Ok((len, left_out)) => {
                snapshot.left_out_total.inc_by(left_out);
                snapshot
                    .writes_total
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                snapshot.bytes.set(i64::try_from(len).unwrap_or(i64::MAX));
            }
            Err(error) => {
                snapshot
                    .writes_total
                    .get_or_create(&ResultLabels { result: "error" })
                    .inc();
                tracing::warn!(path = %self.config.path.display(), %error, "cannot write the snapshot; removed it");
            }
        }
        self.written.send_if_modified(|w| {
            let newer = generation > *w;
            if newer {
                *w = generation;
            }
            newer
        });
    }

    /// What the file will hold: entries within the grace (the rest
    /// forgotten), entries in use refreshed while the controller is
    /// connected. Cheap: handles, not copies.
    fn take(&self, connected: bool, now: SystemTime) -> Vec<Taken> {
        let mut entries = self.lock();
        entries.retain(|r| {
            if connected && r.confirmed && r.alive.strong_count() > 0 {
                r.heard = now;
            }
            age(now, r.heard) <= self.config.grace
        });
        entries
            .map
            .iter()
            .map(|((kind, key), r)| (*kind, key.clone(), r.heard, r.held.clone()))
            .collect()
    }
}

/// An entry on its way to the file.
type Taken = (Kind, Arc<str>, SystemTime, Held);

/// The file's body: by kind in [`Kind::ALL`]'s order, the newest first,
/// while they fit in `max_bytes`. Returns it and how many entries did not fit.
fn body(
    mut taken: Vec<Taken>,
    workload: String,
    max_bytes: usize,
    now: SystemTime,
) -> (file::Body, u64) {
    taken.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
    let mut body = file::Body {
        workload,
        written_unix_ms: file::unix_ms(now),
        entries: Vec::new(),
    };
    let mut size = file::file_len(prost::Message::encoded_len(&body));
    let mut left_out = 0u64;
    for (kind, key, heard, held) in taken {
        let message = match held {
            Held::Encoded(b) => b,
            Held::Endpoints(set) => match super::resolve::set_update(&set) {
                Some(update) => Bytes::from(prost::Message::encode_to_vec(&update)),
                None => continue,
            },
        };
        let entry = file::WireEntry {
            kind: kind as u32,
            key: key.to_string(),
            heard_unix_ms: file::unix_ms(heard),
            message,
        };
        let len = prost::encoding::message::encoded_len(3, &entry);
        if size + len > max_bytes {
            left_out += 1;
            continue;
        }
        size += len;
        body.entries.push(entry);
    }
    (body, left_out)
}

fn age(now: SystemTime, then: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or(Duration::ZERO)
}

/// A snapshot read back: when it was written, its entries, its size.
type Read = (SystemTime, Vec<file::Entry>, usize);

/// The snapshot at `config.path`: `None` when there is none.
fn read(config: &SnapshotConfig) -> Result<Option<Read>, file::Refused> {
    let meta = match std::fs::metadata(&config.path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(file::Refused::Corrupt(format!("unreadable: {e}"))),
    };
    if meta.len() > config.max_bytes as u64 {
        return Err(file::Refused::TooLarge(meta.len()));
    }
    let bytes = std::fs::read(&config.path)
        .map_err(|e| file::Refused::Corrupt(format!("unreadable: {e}")))?;
    file::decode(&bytes, &config.workload)
        .map(|(written, entries)| Some((written, entries, bytes.len())))
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new
/// one whole: a temporary file beside it, synced, renamed over it.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The rename itself survives a crash once its directory is synced.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Counts a watch in `discovery_snapshot_serving` until the controller
/// answers it (or it closes).
#[derive(Debug)]
pub struct Serving(Arc<Metrics>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.discovery.snapshot.serving.dec();
    }
}

/// Serves the book's answer to a watch the controller leaves silent: after
/// the wait, if `pending()` still holds, `serve` gets the message (and
/// returns whether it could use it); the guard it leaves in `slot` is taken
/// by the watch's first message from the controller. Never returns.
pub(crate) async fn serve_after_wait(
    book: Option<(Arc<Book>, Restored)>,
    kind: Kind,
    slot: &Mutex<Option<Serving>>,
    pending: impl Fn() -> bool,
    serve: impl FnOnce(Bytes) -> bool,
) -> std::convert::Infallible {
    if let Some((book, restored)) = book {
        tokio::time::sleep(book.wait()).await;
        if pending() && serve(restored.message) {
            let guard = book.serving(kind, restored.age + book.wait());
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        }
    }
    std::future::pending().await
}

/// The controller answered: the watch no longer serves the snapshot.
pub(crate) fn answered(slot: &Mutex<Option<Serving>>) {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take();
}

pub use metrics::{KindLabels, ReasonLabels, ResultLabels, SnapshotMetrics};

mod metrics {
    use prometheus_client::{
        encoding::EncodeLabelSet,
        metrics::{counter::Counter, family::Family, gauge::Gauge},
        registry::Registry,
    };

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct KindLabels {
        pub kind: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct ReasonLabels {
        pub reason: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    pub struct ResultLabels {
        pub result: &'static str,
    }

    /// The snapshot's metrics (`discovery_snapshot_*`).
    #[derive(Debug, Default)]
    pub struct SnapshotMetrics {
        pub served_total: Family<KindLabels, Counter>,
        pub serving: Gauge,
        pub restored_entries: Gauge,
        pub writes_total: Family<ResultLabels, Counter>,
        pub bytes: Gauge,
        pub left_out_total: Counter,
        pub ignored_total: Family<ReasonLabels, Counter>,
    }

    impl SnapshotMetrics {
        pub fn register(&self, r: &mut Registry) {
            r.register(
                "discovery_snapshot_served",
                "Watches that started from the snapshot because the destination controller did not answer within --snapshot-wait, by kind",
                self.served_total.clone(),
            );
            r.register(
                "discovery_snapshot_serving",
                "Watches served from the snapshot that the destination controller has not answered yet",
                self.serving.clone(),
            );
            r.register(
                "discovery_snapshot_restored_entries",
                "Entries read from the snapshot at start (within --stale-endpoints-grace)",
                self.restored_entries.clone(),
            );
            r.register(
                "discovery_snapshot_writes",
                "Snapshot writes, by result",
                self.writes_total.clone(),
            );
            r.register(
                "discovery_snapshot_bytes",
                "Size of the snapshot last written",
                self.bytes.clone(),
            );
            r.register(
                "discovery_snapshot_left_out",
                "Entries left out of a snapshot write by --snapshot-max-bytes",
                self.left_out_total.clone(),
            );
            r.register(
                "discovery_snapshot_ignored",
                "Snapshot files not used at start, by reason (truncated, corrupt, version, foreign, too_large)",
                self.ignored_total.clone(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    /// A directory of the test's own, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("ballast-snapshot-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("temp dir");
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const WORKLOAD: &str = r#"{"ns":"shop","pod":"web-0"}"#;

    fn config(dir: &Dir) -> SnapshotConfig {
        SnapshotConfig {
            path: dir.0.join("proxy.snapshot"),
            interval: Duration::from_secs(5),
            wait: Duration::from_millis(250),
            max_bytes: 1 << 20,
            grace: Duration::from_secs(3600),
            max_entries: 100,
            workload: WORKLOAD.into(),
        }
    }

    fn book(config: SnapshotConfig) -> (Arc<Book>, Arc<Metrics>) {
        let metrics = Metrics::register(&mut Registry::default());
        (Book::load(config, metrics.clone()), metrics)
    }

    fn message(n: u8) -> Held {
        Held::Encoded(Bytes::from(vec![n; 16]))
    }

    fn writes(metrics: &Metrics, result: &'static str) -> u64 {
        metrics
            .discovery
            .snapshot
            .writes_total
            .get_or_create(&ResultLabels { result })
            .get()
    }

    /// Lets the writer run until `done` holds (virtual time moves on while
    /// the runtime waits on the file system).
    async fn until(done: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the condition never held");
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_recorded_is_read_back_by_the_next_start() {
        let dir = Dir::new("read-back");
        let (first, metrics) = book(config(&dir));
        let writer = first.spawn_writer(|| true);
        let alive = Arc::new(());
        let port: Arc<str> = Arc::from("8080");
        first.record(Kind::Inbound, &port, message(1), &alive);
        until(|| writes(&metrics, "ok") == 1).await;
        writer.abort();

        let (second, metrics) = book(config(&dir));
        assert_eq!(metrics.discovery.snapshot.restored_entries.get(), 1);
        let restored = second.restored(Kind::Inbound, "8080").expect("restored");
        assert_eq!(restored.message, Bytes::from(vec![1u8; 16]));
        assert!(second.restored(Kind::Outbound, "8080").is_none(), "by kind");
        assert!(second.restored(Kind::Inbound, "9090").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn routine_changes_are_written_at_most_once_per_interval() {
        let dir = Dir::new("rate");
        let (book, metrics) = book(config(&dir));
        let writer = book.spawn_writer(|| true);
        let alive = Arc::new(());
        let started = tokio::time::Instant::now();
        for i in 0..200u32 {
            let key: Arc<str> = Arc::from(format!("10.0.0.{}:80", i % 50));
            book.record(Kind::Profile, &key, message(i as u8), &alive);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let elapsed = started.elapsed();
        let most = elapsed.as_secs() / 5 + 1;
        let written = writes(&metrics, "ok");
        assert!(written >= 2, "changes were written: {written}");
        assert!(
            written <= most,
            "{written} writes in {elapsed:?}, at most {most}"
        );
        writer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_inbound_policy_is_written_before_it_takes_effect() {
        let dir = Dir::new("durable");
        let (book, metrics) = book(config(&dir));
        let writer = book.spawn_writer(|| true);
        let alive = Arc::new(());
        // A routine write just happened: the next one would wait 5 s.
        book.record(Kind::Profile, &Arc::from("10.0.0.1:80"), message(0), &alive);
        until(|| writes(&metrics, "ok") == 1).await;
        let started = tokio::time::Instant::now();
        book.record_durably(Kind::Inbound, &Arc::from("8080"), message(2), &alive)
            .await;
        assert!(started.elapsed() < Duration::from_secs(1), "urgent");
        let on_disk = read(&config(&dir)).expect("readable").expect("written");
        assert!(on_disk
            .1
            .iter()
            .any(|e| e.kind == Kind::Inbound && e.message == vec![2u8; 16]));
        writer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_removes_the_file_and_frees_the_waiters() {
        let dir = Dir::new("failed");
        let c = config(&dir);
        let (book, metrics) = book(c.clone());
        let writer = book.spawn_writer(|| true);
        let alive = Arc::new(());
        let port: Arc<str> = Arc::from("8080");
        book.record_durably(Kind::Inbound, &port, message(1), &alive)
            .await;
        assert!(c.path.exists());
        // The temporary file's place is taken: the next write cannot be made.
        let mut tmp = c.path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::create_dir(&tmp).expect("in the way");
        book.record_durably(Kind::Inbound, &port, message(2), &alive)
            .await;
        assert_eq!(writes(&metrics, "error"), 1);
        assert!(!c.path.exists(), "the older policy is not left behind");
        writer.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_inbound_policy_waits_a_second_at_most_for_a_stuck_writer() {
        let dir = Dir::new("stuck");
        let c = config(&dir);
        std::fs::write(&c.path, b"an older snapshot").expect("write");
        let (book, _) = book(c.clone());
        // No writer task: nothing will ever be written.
        let started = tokio::time::Instant::now();
        book.record_durably(Kind::Inbound, &Arc::from("8080"), message(1), &Arc::new(()))
            .await;
        assert_eq!(started.elapsed(), DURABLE_WAIT);
        until(|| !c.path.exists()).await;
    }

    #[test]
    fn each_kind_keeps_at_most_its_bound_the_least_recently_heard_going_first() {
        let dir = Dir::new("per-kind");
        let mut c = config(&dir);
        c.max_entries = 2;
        let (book, _) = book(c);
        let alive = Arc::new(());
        book.record(Kind::Inbound, &Arc::from("8080"), message(0), &alive);
        for i in 0..3u8 {
            let key: Arc<str> = Arc::from(format!("10.0.0.{i}:80"));
            book.record(Kind::Profile, &key, message(i), &alive);
            std::thread::sleep(Duration::from_millis(2));
        }
        let entries = book.lock();
        assert_eq!(entries.per_kind[Kind::Profile.index()], 2);
        assert_eq!(entries.per_kind[Kind::Inbound.index()], 1);
        assert!(!entries
            .map
            .contains_key(&(Kind::Profile, Arc::from("10.0.0.0:80"))));
        assert_eq!(entries.map.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_keeps_inbound_policies_first_and_the_newest() {
        let dir = Dir::new("bound");
        let mut c = config(&dir);
        c.max_bytes = 400;
        let (book, metrics) = book(c.clone());
        let alive = Arc::new(());
        for i in 0..20u8 {
            let key: Arc<str> = Arc::from(format!("10.0.0.{i}:80"));
            book.record(Kind::Profile, &key, message(i), &alive);
        }
        book.record(Kind::Inbound, &Arc::from("8080"), message(99), &alive);
        book.flush(true).await;
        let (_, entries, _) = read(&c).expect("readable").expect("written");
        assert_eq!(entries[0].kind, Kind::Inbound, "{entries:?}");
        assert!(entries.len() < 21);
        assert_eq!(
            metrics.discovery.snapshot.left_out_total.get(),
            21 - entries.len() as u64
        );
        assert!(std::fs::metadata(&c.path).expect("file").len() <= 400);
    }

    #[tokio::test(start_paused = true)]
    async fn old_foreign_and_damaged_snapshots_serve_nothing() {
        let dir = Dir::new("refused");
        let c = config(&dir);
        let now = SystemTime::now();
        let entry = |key: &str, age: Duration| file::WireEntry {
            kind: Kind::Endpoints as u32,
            key: key.into(),
            heard_unix_ms: file::unix_ms(now - age),
            message: Bytes::from_static(b"x"),
        };
        let body = |workload: &str| file::Body {
            workload: workload.into(),
            written_unix_ms: file::unix_ms(now),
            entries: vec![
                entry("fresh:80", Duration::from_secs(60)),
                entry("old:80", Duration::from_secs(3601)),
            ],
        };
        std::fs::write(&c.path, file::encode(&body(WORKLOAD))).expect("write");
        let (b, _) = book(c.clone());
        assert!(b.restored(Kind::Endpoints, "fresh:80").is_some());
        assert!(
            b.restored(Kind::Endpoints, "old:80").is_none(),
            "past the grace"
        );

        let ignored = |m: &Metrics, reason| {
            m.discovery
                .snapshot
                .ignored_total
                .get_or_create(&ReasonLabels { reason })
                .get()
        };
        std::fs::write(
            &c.path,
            file::encode(&body(r#"{"ns":"shop","pod":"db-0"}"#)),
        )
        .expect("write");
        let (b, m) = book(c.clone());
        assert!(b.restored(Kind::Endpoints, "fresh:80").is_none());
        assert_eq!(ignored(&m, "foreign"), 1);

        let whole = file::encode(&body(WORKLOAD));
        std::fs::write(&c.path, &whole[..whole.len() - 3]).expect("write");
        let (b, m) = book(c.clone());
        assert!(b.restored(Kind::Endpoints, "fresh:80").is_none());
        assert_eq!(ignored(&m, "truncated"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_controller_gets_the_book_served_after_the_wait_and_not_before() {
        let dir = Dir::new("wait");
        let c = config(&dir);
        let (b, metrics) = book(c.clone());
        let restored = Restored {
            message: Bytes::from_static(b"answer"),
            age: Duration::from_secs(10),
        };
        let slot = Mutex::new(None);
        let (tx, rx) = watch::channel(None::<Bytes>);
        let serve = serve_after_wait(
            Some((b.clone(), restored.clone())),
            Kind::Profile,
            &slot,
            || tx.borrow().is_none(),
            |m| {
                tx.send_replace(Some(m));
                true
            },
        );
        tokio::pin!(serve);
        tokio::select! {
            never = &mut serve => match never {},
            () = tokio::time::sleep(Duration::from_millis(249)) => {}
        }
        assert!(rx.borrow().is_none(), "not before the wait");
        tokio::select! {
            never = &mut serve => match never {},
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
        assert_eq!(rx.borrow().as_deref(), Some(&b"answer"[..]));
        assert_eq!(metrics.discovery.snapshot.serving.get(), 1);
        assert!(b.readiness_detail().expect("said").contains("snapshot"));
        answered(&slot);
        assert_eq!(metrics.discovery.snapshot.serving.get(), 0);
        assert!(b.readiness_detail().is_none());

        // The controller answered within the wait: nothing served.
        let (tx, _rx) = watch::channel(Some(Bytes::from_static(b"controller")));
        let serve = serve_after_wait(
            Some((b.clone(), restored)),
            Kind::Profile,
            &slot,
            || tx.borrow().is_none(),
            |m| {
                tx.send_replace(Some(m));
                true
            },
        );
        tokio::pin!(serve);
        tokio::select! {
            never = &mut serve => match never {},
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        assert_eq!(tx.borrow().as_deref(), Some(&b"controller"[..]));
        assert_eq!(metrics.discovery.snapshot.serving.get(), 0);
    }
}
