//! Prometheus text exposition (0.0.4) and OpenMetrics to the few series the
//! mesh view reads, over bytes, bounded.
//!
//! Kept: `response_total`, `response_latency_ms_bucket`, `tcp_open_total`,
//! `tcp_open_connections`, `outbound_{http,grpc}_route_request_statuses_total`
//! and `outbound_{http,grpc}_route_request_duration_seconds_bucket`; every
//! other line is looked at only as far as its name. A kept sample is reduced
//! to what the rollups need (direction, destination, classification, TLS,
//! route) with its label strings interned, so a page of thousands of lines
//! becomes a few hundred small records.
//!
//! Histograms are kept as per-bucket counts (`le` cumulative counts turned
//! into the count of each bucket, with its bounds), each its own monotonic
//! counter: most buckets stay zero, and zeros are not kept.
//!
//! Hostile input: a line longer than [`Limits::max_line_bytes`] or that does
//! not parse is skipped and counted ([`Page::skipped_lines`]); a page with no
//! sample line at all but garbage is an error; more than
//! [`Limits::max_series`] samples kept is an error (a page cut at an
//! arbitrary series would make the next page's deltas lie). Never a panic;
//! bytes that are not UTF-8 in a label value are replaced (U+FFFD).
//!
//! [`samples`] reads every sample line of any family by the same grammar,
//! unreduced: for the tests (and tools) that read one value by name and
//! labels.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::api::ResourceRef;

/// Bounds of one parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most samples kept from one page (each histogram bucket with a count
    /// is one); more is an error. Default 50,000: a proxy talking to a
    /// thousand endpoints keeps about 30,000.
    pub max_series: usize,
    /// Longest line read; a longer line is skipped. Default 64 KiB (a proxy's
    /// longest lines are under 1 KiB).
    pub max_line_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_series: 50_000,
            max_line_bytes: 64 * 1024,
        }
    }
}

/// Most labels read on one line; a line with more is skipped.
const MAX_LABELS: usize = 64;

/// Traffic direction at the proxy that exported the sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    Inbound,
    Outbound,
}

/// Which side of the proxy a TCP connection is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    Src,
    Dst,
}

/// Workload kinds of the `dst_*` labels, in the order one is preferred when
/// several are set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    Job,
    ReplicaSet,
}

impl WorkloadKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Deployment => "deployment",
            Self::StatefulSet => "statefulset",
            Self::DaemonSet => "daemonset",
            Self::Job => "job",
            Self::ReplicaSet => "replicaset",
        }
    }

    const LABELS: [(&'static [u8], WorkloadKind); 5] = [
        (b"dst_deployment", Self::Deployment),
        (b"dst_statefulset", Self::StatefulSet),
        (b"dst_daemonset", Self::DaemonSet),
        (b"dst_k8s_job", Self::Job),
        (b"dst_replicaset", Self::ReplicaSet),
    ];
}

/// A destination as Linkerd's `authority` and `dst_*` labels name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Dst {
    pub authority: Arc<str>,
    pub namespace: Arc<str>,
    pub service: Arc<str>,
    pub pod: Arc<str>,
    pub workload: Option<(WorkloadKind, Arc<str>)>,
}

/// A connection's TLS as the `tls` label (and its companions) says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tls {
    /// `tls="true"`.
    pub mtls: bool,
    /// With `mtls`, the peer's identity (`server_id` or `client_id`, may be
    /// empty); else why not: `no_identity: REASON`, `disabled`, `opaque`.
    pub detail: Arc<str>,
}

/// An outbound route of a parent, as the `parent_*` and `route_*` labels
/// name them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Route {
    pub grpc: bool,
    pub parent_kind: Arc<str>,
    pub parent_namespace: Arc<str>,
    pub parent_name: Arc<str>,
    pub parent_port: Option<u16>,
    pub route_kind: Arc<str>,
    pub route_namespace: Arc<str>,
    pub route_name: Arc<str>,
}

/// What a kept sample counts. `dst`, `tls` and `route` index the page's
/// tables; bucket bounds are milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum What {
    /// `response_total`: one classification of responses.
    Response {
        dir: Direction,
        dst: u32,
        success: bool,
    },
    /// One bucket of `response_latency_ms`.
    Latency {
        dir: Direction,
        dst: u32,
        lo: f32,
        hi: f32,
    },
    /// `tcp_open_total` (a counter).
    TcpOpened {
        dir: Direction,
        peer: Peer,
        dst: u32,
        tls: u32,
    },
    /// `tcp_open_connections` (a gauge).
    TcpOpen {
        dir: Direction,
        peer: Peer,
        dst: u32,
        tls: u32,
    },
    /// `outbound_*_route_request_statuses_total`.
    RouteStatus { route: u32, success: bool },
    /// One bucket of `outbound_*_route_request_duration_seconds`.
    RouteLatency { route: u32, lo: f32, hi: f32 },
}

impl What {
    /// Gauges are read as they are; everything else is a counter.
    pub(crate) fn is_gauge(&self) -> bool {
        matches!(self, Self::TcpOpen { .. })
    }
}

/// One kept sample: `id` names the series (stable from page to page of the
/// same exporter), `value` is never zero, negative or NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Sample {
    pub id: u64,
    pub value: f64,
    pub what: What,
    /// A histogram bucket's series (its id but for `le`) and its `le`
    /// (f64 bits): what `id` hashes, for a reader that keeps buckets by
    /// series.
    pub bucket: Option<(u64, u64)>,
}

/// The series of interest of one page, compact. Samples are sorted by id,
/// one per id.
#[derive(Clone, Debug, Default)]
pub struct Page {
    pub(crate) dsts: Vec<Dst>,
    pub(crate) tls: Vec<Tls>,
    pub(crate) routes: Vec<Route>,
    pub(crate) samples: Vec<Sample>,
    skipped_lines: u32,
    first_skip: Option<String>,
    up: Option<bool>,
}

impl Page {
    /// Samples kept.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Lines skipped: longer than the bound, or malformed.
    pub fn skipped_lines(&self) -> u32 {
        self.skipped_lines
    }

    /// Why the first skipped line was skipped (`line N: reason`).
    pub fn first_skip(&self) -> Option<&str> {
        self.first_skip.as_deref()
    }

    /// From a federation page: whether Prometheus' last scrape of the pod's
    /// proxy succeeded (its `up` series; any target up counts); `None`
    /// when the page had no `up` for the pod.
    pub fn prometheus_up(&self) -> Option<bool> {
        self.up
    }

    /// Bytes this page holds on the heap (an estimate).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.samples.capacity() * size_of::<Sample>()
            + self.dsts.capacity() * size_of::<Dst>()
            + self.tls.capacity() * size_of::<Tls>()
            + self.routes.capacity() * size_of::<Route>()
    }
}

/// Why a page could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("more than {limit} samples of interest (--max-series bound)")]
    TooManySeries { limit: usize },
    #[error("not a metrics page: line {line}: {reason}")]
    NotExposition { line: usize, reason: &'static str },
}

/// Parses one proxy's page. Inbound series to `admin_port` (the proxy's
/// own admin port, when known) are dropped: Linkerd's proxy counts the
/// scrapes of its `/metrics` as inbound traffic.
pub fn parse(text: &[u8], limits: &Limits, admin_port: Option<u16>) -> Result<Page, ParseError> {
    let mut parser = PageParser::new(*limits, admin_port);
    parser.feed(text);
    parser.finish()
}

/// [`parse`] over a page that arrives in pieces (a response body, frame by
/// frame): the same page, the same errors, without the page's bytes ever
/// held whole. Besides what it keeps it holds at most one line, and a line
/// longer than [`Limits::max_line_bytes`] not even that (it is skipped).
pub struct PageParser {
    limits: Limits,
    strings: Strings,
    builder: Builder,
    scanner: Scanner,
    /// The start of a line cut by the end of a piece.
    partial: Vec<u8>,
    /// The line being read is past the bound: its bytes are dropped.
    overlong: bool,
    error: Option<ParseError>,
}

impl PageParser {
    pub fn new(limits: Limits, admin_port: Option<u16>) -> Self {
        Self {
            limits,
            strings: Strings::default(),
            builder: Builder {
                admin_port,
                ..Builder::default()
            },
            scanner: Scanner::default(),
            partial: Vec::new(),
            overlong: false,
            error: None,
        }
    }

    /// Reads the next piece of the page. After an error (or the
    /// OpenMetrics `# EOF`), the rest is not looked at.
    pub fn feed(&mut self, mut piece: &[u8]) {
        while !self.done() {
            let Some(end) = piece.iter().position(|b| *b == b'\n') else {
                self.keep_partial(piece);
                return;
            };
            if self.partial.is_empty() && !self.overlong {
                self.line(&piece[..end]);
            } else {
                self.keep_partial(&piece[..end]);
                let line = std::mem::take(&mut self.partial);
                self.line(&line);
                self.partial = line;
                self.partial.clear();
                self.overlong = false;
            }
            piece = &piece[end + 1..];
        }
    }

    /// The page, once every piece was fed.
    pub fn finish(mut self) -> Result<Page, ParseError> {
        // The last line, when the page does not end with a newline.
        if !self.done() && (self.overlong || !self.partial.is_empty()) {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
        if let Some(e) = self.error {
            return Err(e);
        }
        let stats = self.scanner.finish()?;
        Ok(self.builder.finish(stats))
    }

    fn done(&self) -> bool {
        self.error.is_some() || self.scanner.eof
    }

    fn keep_partial(&mut self, bytes: &[u8]) {
        if self.overlong {
            return;
        }
        if self.partial.len() + bytes.len() > self.limits.max_line_bytes {
            self.overlong = true;
            self.partial = Vec::new();
            return;
        }
        self.partial.extend_from_slice(bytes);
    }

    fn line(&mut self, line: &[u8]) {
        let (builder, strings, limits) = (&mut self.builder, &mut self.strings, &self.limits);
        let result = if self.overlong {
            self.scanner.skip("line too long");
            Ok(())
        } else {
            self.scanner.line(line, limits, &Family::of, &mut |parsed| {
                builder.add(strings, parsed);
                over_limit(builder.kept, limits)
            })
        };
        if let Err(e) = result {
            self.error = Some(e);
        }
    }
}

/// Prometheus /federate output: series split by their `namespace` and `pod` labels.
///
/// Series without both labels are dropped. The bounds apply to the whole
/// answer, not per pod. Sorted by pod. `admin_port` says a pod's admin port
/// by namespace and name, as for [`parse`].
pub fn parse_federated(
    text: &[u8],
    limits: &Limits,
    admin_port: &dyn Fn(&str, &str) -> Option<u16>,
) -> Result<Vec<(ResourceRef, Page)>, ParseError> {
    let mut strings = Strings::default();
    let mut pods: HashMap<(Arc<str>, Arc<str>), Builder> = HashMap::new();
    let mut kept = 0usize;
    let stats = scan(text, limits, Family::of, |parsed| {
        let (Some(ns), Some(pod)) = (parsed.get(b"namespace"), parsed.get(b"pod")) else {
            return Ok(());
        };
        if ns.is_empty() || pod.is_empty() {
            return Ok(());
        }
        let key = (strings.get(&ns), strings.get(&pod));
        let builder = pods.entry(key).or_insert_with_key(|(ns, pod)| Builder {
            admin_port: admin_port(ns, pod),
            ..Builder::default()
        });
        if parsed.family == Family::Up {
            builder.up = Some(builder.up == Some(true) || parsed.value > 0.0);
            return Ok(());
        }
        let before = builder.kept;
        builder.add(&mut strings, parsed);
        kept += builder.kept - before;
        over_limit(kept, limits)
    })?;
    let mut out: Vec<(ResourceRef, Page)> = pods
        .into_iter()
        .map(|((ns, pod), b)| {
            let r = ResourceRef {
                kind: "pod".into(),
                namespace: ns.to_string(),
                name: pod.to_string(),
            };
            (r, b.finish(ScanStats::default()))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some((_, first)) = out.first_mut() {
        // The skips belong to the answer, not to a pod; the first pod
        // carries them so that they are seen.
        first.skipped_lines = stats.skipped;
        first.first_skip = stats.first_skip;
    }
    Ok(out)
}

/// One sample line of any family, as written: for readers of a value by
/// name and labels (tests, tools), not for the mesh view.
#[derive(Clone, Debug, PartialEq)]
pub struct TextSample {
    /// The sample's name (`response_total`, `x_bucket`...).
    pub name: String,
    /// Its labels in the order written, values unescaped (bytes that are
    /// not UTF-8 replaced).
    pub labels: Vec<(String, String)>,
    /// As written: zero, negative, NaN and infinities included.
    pub value: f64,
}

impl TextSample {
    /// The value of label `name`, when the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample line of a page, by the grammar [`parse`] reads: the same
/// lines skipped (and counted nowhere), the same errors; more than
/// [`Limits::max_series`] samples is an error.
pub fn samples(text: &[u8], limits: &Limits) -> Result<Vec<TextSample>, ParseError> {
    let mut out = Vec::new();
    scan(
        text,
        limits,
        |_| Some(()),
        |parsed| {
            out.push(TextSample {
                name: String::from_utf8_lossy(parsed.name).into_owned(),
                labels: parsed
                    .labels
                    .iter()
                    .map(|(name, value)| {
                        (
                            String::from_utf8_lossy(name).into_owned(),
                            String::from_utf8_lossy(&value.bytes()).into_owned(),
                        )
                    })
                    .collect(),
                value: parsed.value,
            });
            over_limit(out.len(), limits)
        },
    )?;
    Ok(out)
}

fn over_limit(kept: usize, limits: &Limits) -> Result<(), ParseError> {
    if kept > limits.max_series {
        return Err(ParseError::TooManySeries {
            limit: limits.max_series,
        });
    }
    Ok(())
}

/// The families kept, by sample name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Response,
    LatencyBucket,
    TcpOpened,
    TcpOpen,
    RouteStatuses {
        grpc: bool,
    },
    RouteDurationBucket {
        grpc: bool,
    },
    /// Prometheus' own `up`, on a federation page only.
    Up,
}

impl Family {
    fn of(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"response_total" => Self::Response,
            b"up" => Self::Up,
            b"response_latency_ms_bucket" => Self::LatencyBucket,
            b"tcp_open_total" => Self::TcpOpened,
            b"tcp_open_connections" => Self::TcpOpen,
            b"outbound_http_route_request_statuses_total" => Self::RouteStatuses { grpc: false },
            b"outbound_grpc_route_request_statuses_total" => Self::RouteStatuses { grpc: true },
            b"outbound_http_route_request_duration_seconds_bucket" => {
                Self::RouteDurationBucket { grpc: false }
            }
            b"outbound_grpc_route_request_duration_seconds_bucket" => {
                Self::RouteDurationBucket { grpc: true }
            }
            _ => return None,
        })
    }
}

/// One sample line of a kept family, labels still raw.
struct Parsed<'a, K = Family> {
    family: K,
    name: &'a [u8],
    labels: &'a [(&'a [u8], RawValue<'a>)],
    value: f64,
}

/// A label value as written between the quotes, and whether it has escapes.
#[derive(Clone, Copy)]
struct RawValue<'a> {
    raw: &'a [u8],
    escaped: bool,
}

impl<'a> RawValue<'a> {
    fn bytes(&self) -> Cow<'a, [u8]> {
        if !self.escaped {
            return Cow::Borrowed(self.raw);
        }
        let mut out = Vec::with_capacity(self.raw.len());
        let mut it = self.raw.iter();
        while let Some(&b) = it.next() {
            if b != b'\\' {
                out.push(b);
                continue;
            }
            match it.next() {
                Some(b'n') => out.push(b'\n'),
                Some(&c) => out.push(c),
                None => out.push(b'\\'),
            }
        }
        Cow::Owned(out)
    }
}

impl<'a, K> Parsed<'a, K> {
    fn raw(&self, name: &[u8]) -> Option<RawValue<'a>> {
        self.labels
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// The label's value, unescaped; `None` when absent.
    fn get(&self, name: &[u8]) -> Option<Cow<'a, [u8]>> {
        self.raw(name).map(|v| v.bytes())
    }

    fn is(&self, name: &[u8], value: &[u8]) -> bool {
        self.raw(name).is_some_and(|v| !v.escaped && v.raw == value)
    }

    /// The series' identity: its name and every label but `le`, in any
    /// order (the sum of the pairs' hashes does not depend on it).
    fn series_id(&self) -> u64 {
        let mut id = hash_of(&(0u8, self.name));
        for (n, v) in self.labels {
            if *n != b"le" {
                id = id.wrapping_add(hash_of(&(1u8, n, v.raw)));
            }
        }
        id
    }
}

fn hash_of<T: Hash>(t: &T) -> u64 {
    // `DefaultHasher::new` has fixed keys: the same series gets the same
    // id from one page to the next.
    let mut h = std::hash::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

#[derive(Default)]
struct ScanStats {
    skipped: u32,
    first_skip: Option<String>,
}

/// Walks the lines, hands each sample line of a family `kept` names to
/// `each`.
fn scan<K, C, F>(
    text: &[u8],
    limits: &Limits,
    kept: C,
    mut each: F,
) -> Result<ScanStats, ParseError>
where
    C: Fn(&[u8]) -> Option<K>,
    F: FnMut(&Parsed<'_, K>) -> Result<(), ParseError>,
{
    let mut scanner = Scanner::default();
    for line in text.split(|b| *b == b'\n') {
        scanner.line(line, limits, &kept, &mut each)?;
        if scanner.eof {
            break;
        }
    }
    scanner.finish()
}

/// What the walk over a page's lines has seen so far.
#[derive(Default)]
struct Scanner {
    /// Lines so far.
    lines: usize,
    samples_seen: usize,
    first_bad: Option<(usize, &'static str)>,
    stats: ScanStats,
    /// The OpenMetrics `# EOF` was read: nothing after it counts.
    eof: bool,
}

impl Scanner {
    /// One line (without its newline).
    fn line<K, C, F>(
        &mut self,
        line: &[u8],
        limits: &Limits,
        kept: &C,
        each: &mut F,
    ) -> Result<(), ParseError>
    where
        C: Fn(&[u8]) -> Option<K>,
        F: FnMut(&Parsed<'_, K>) -> Result<(), ParseError>,
    {
        if self.eof {
            return Ok(());
        }
        if line.len() > limits.max_line_bytes {
            self.skip("line too long");
            return Ok(());
        }
        self.lines += 1;
        let line = trim(line);
        if line.is_empty() {
            return Ok(());
        }
        if line[0] == b'#' {
            if line == b"# EOF" {
                self.eof = true;
            }
            return Ok(());
        }
        let mut labels: Vec<(&[u8], RawValue<'_>)> = Vec::new();
        match parse_line(line, &mut labels, kept) {
            Ok(None) => self.samples_seen += 1,
            Ok(Some(parsed)) => {
                self.samples_seen += 1;
                each(&parsed)?;
            }
            Err(reason) => self.bad(reason),
        }
        Ok(())
    }

    /// A line skipped unread.
    fn skip(&mut self, reason: &'static str) {
        self.lines += 1;
        self.bad(reason);
    }

    fn bad(&mut self, reason: &'static str) {
        let line_no = self.lines;
        self.stats.skipped = self.stats.skipped.saturating_add(1);
        if self.stats.first_skip.is_none() {
            self.stats.first_skip = Some(format!("line {line_no}: {reason}"));
            self.first_bad = Some((line_no, reason));
        }
    }

    fn finish(self) -> Result<ScanStats, ParseError> {
        if self.samples_seen == 0 {
            if let Some((line, reason)) = self.first_bad {
                return Err(ParseError::NotExposition { line, reason });
            }
        }
        Ok(self.stats)
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// One sample line: `Ok(None)` for a well-formed name of a family not kept
/// (the rest of the line is not read), `Ok(Some)` for a kept one.
fn parse_line<'t: 'v, 'v, K>(
    line: &'t [u8],
    labels: &'v mut Vec<(&'t [u8], RawValue<'t>)>,
    kept: &impl Fn(&[u8]) -> Option<K>,
) -> Result<Option<Parsed<'v, K>>, &'static str> {
    let name_end = line
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name[0].is_ascii_digit() {
        return Err("no metric name");
    }
    let rest = &line[name_end..];
    match rest.first() {
        Some(b'{') | Some(b' ') | Some(b'\t') => {}
        _ => return Err("no value after the name"),
    }
    let Some(family) = kept(name) else {
        return Ok(None);
    };
    let mut i = 0;
    if rest.first() == Some(&b'{') {
        i = 1;
        loop {
            i = skip_spaces(rest, i);
            match rest.get(i) {
                Some(b'}') => {
                    i += 1;
                    break;
                }
                Some(_) => {}
                None => return Err("unterminated label set"),
            }
            let start = i;
            while rest
                .get(i)
                .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
            {
                i += 1;
            }
            let label = &rest[start..i];
            if label.is_empty() {
                return Err("bad label name");
            }
            i = skip_spaces(rest, i);
            if rest.get(i) != Some(&b'=') {
                return Err("label without '='");
            }
            i = skip_spaces(rest, i + 1);
            if rest.get(i) != Some(&b'"') {
                return Err("label value without quotes");
            }
            i += 1;
            let vstart = i;
            let mut escaped = false;
            loop {
                match rest.get(i) {
                    Some(b'"') => break,
                    Some(b'\\') => {
                        escaped = true;
                        i += 2;
                    }
                    Some(_) => i += 1,
                    None => return Err("unterminated label value"),
                }
            }
            let value = RawValue {
                raw: &rest[vstart..i],
                escaped,
            };
            i += 1;
            if labels.len() >= MAX_LABELS {
                return Err("too many labels");
            }
            labels.push((label, value));
            i = skip_spaces(rest, i);
            match rest.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err("expected ',' or '}' after a label"),
            }
        }
    }
    let after = &rest[i..];
    if !after.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return Err("no value");
    }
    let after = trim(after);
    let value_end = after
        .iter()
        .position(|b| *b == b' ' || *b == b'\t')
        .unwrap_or(after.len());
    let value = std::str::from_utf8(&after[..value_end])
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or("bad value")?;
    // A timestamp, an exemplar (`# {...} v`) may follow; neither is used.
    Ok(Some(Parsed {
        family,
        name,
        labels,
        value,
    }))
}

fn skip_spaces(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(|b| *b == b' ' || *b == b'\t') {
        i += 1;
    }
    i
}

/// Interned label strings of one parse.
#[derive(Default)]
struct Strings {
    set: HashSet<Arc<str>>,
}

impl Strings {
    fn get(&mut self, bytes: &[u8]) -> Arc<str> {
        let s = String::from_utf8_lossy(bytes);
        if let Some(found) = self.set.get(&*s) {
            return found.clone();
        }
        let arc: Arc<str> = Arc::from(&*s);
        self.set.insert(arc.clone());
        arc
    }

    fn label(&mut self, p: &Parsed<'_>, name: &[u8]) -> Arc<str> {
        match p.get(name) {
            Some(v) => self.get(&v),
            None => self.get(b""),
        }
    }
}

/// A histogram bucket as exported: cumulative.
struct RawBucket {
    series: u64,
    le: f64,
    count: f64,
    of: BucketOf,
}

#[derive(Clone, Copy)]
enum BucketOf {
    Latency { dir: Direction, dst: u32 },
    Route { route: u32 },
}

/// One page being built.
#[derive(Default)]
struct Builder {
    dsts: Vec<Dst>,
    dst_index: HashMap<Dst, u32>,
    tls: Vec<Tls>,
    tls_index: HashMap<Tls, u32>,
    routes: Vec<Route>,
    route_index: HashMap<Route, u32>,
    samples: Vec<Sample>,
    buckets: Vec<RawBucket>,
    kept: usize,
    up: Option<bool>,
    /// The exporting proxy's admin port, when known: inbound series to it
    /// are dropped.
    admin_port: Option<u16>,
}

fn intern<T: Clone + Eq + Hash>(table: &mut Vec<T>, index: &mut HashMap<T, u32>, t: T) -> u32 {
    if let Some(i) = index.get(&t) {
        return *i;
    }
    let i = table.len() as u32;
    table.push(t.clone());
    index.insert(t, i);
    i
}

impl Builder {
    /// Keeps the sample if it is of use.
    fn add(&mut self, strings: &mut Strings, p: &Parsed<'_>) {
        let value = p.value;
        // Counters and gauges of traffic are never negative; NaN and zero
        // count nothing. A histogram's empty buckets are kept: they carry
        // the lower bounds of the next.
        let bucket = matches!(
            p.family,
            Family::LatencyBucket | Family::RouteDurationBucket { .. }
        );
        if value.is_nan() || value.is_infinite() || value < 0.0 || (value == 0.0 && !bucket) {
            return;
        }
        let admin_port = self.admin_port;
        let dir = || {
            if p.is(b"direction", b"inbound") {
                // Linkerd's proxy counts requests to its own admin port (the
                // collector's scrapes, Prometheus') as inbound traffic: not
                // the workload's.
                let to_admin = admin_port.is_some_and(|port| {
                    p.raw(b"target_port")
                        .and_then(|v| std::str::from_utf8(v.raw).ok()?.parse::<u16>().ok())
                        == Some(port)
                });
                (!to_admin).then_some(Direction::Inbound)
            } else if p.is(b"direction", b"outbound") {
                Some(Direction::Outbound)
            } else {
                None
            }
        };
        let what = match p.family {
            // Prometheus' own series: read by `parse_federated`, never a
            // proxy's traffic.
            Family::Up => return,
            Family::Response => {
                let Some(dir) = dir() else { return };
                let dst = self.dst(strings, p);
                let success = match p.raw(b"classification") {
                    Some(c) => !c.escaped && c.raw == b"success",
                    None => classify(p),
                };
                What::Response { dir, dst, success }
            }
            Family::TcpOpened | Family::TcpOpen => {
                let Some(dir) = dir() else { return };
                let peer = if p.is(b"peer", b"src") {
                    Peer::Src
                } else if p.is(b"peer", b"dst") {
                    Peer::Dst
                } else {
                    return;
                };
                let dst = self.dst(strings, p);
                let tls = self.tls(strings, p);
                if p.family == Family::TcpOpen {
                    What::TcpOpen {
                        dir,
                        peer,
                        dst,
                        tls,
                    }
                } else {
                    What::TcpOpened {
                        dir,
                        peer,
                        dst,
                        tls,
                    }
                }
            }
            Family::RouteStatuses { grpc } => {
                let route = self.route(strings, p, grpc);
                let error = p.raw(b"error").is_some_and(|e| !e.raw.is_empty());
                let success = !error
                    && if grpc {
                        p.raw(b"grpc_status")
                            .is_none_or(|s| s.raw.is_empty() || s.raw == b"OK")
                    } else {
                        p.raw(b"http_status")
                            .is_none_or(|s| !(s.raw.len() == 3 && s.raw[0] == b'5'))
                    };
                What::RouteStatus { route, success }
            }
            Family::LatencyBucket | Family::RouteDurationBucket { .. } => {
                let Some(le) = p
                    .raw(b"le")
                    .and_then(|v| std::str::from_utf8(v.raw).ok()?.parse::<f64>().ok())
                    .filter(|le| !le.is_nan())
                else {
                    return;
                };
                let of = match p.family {
                    Family::RouteDurationBucket { grpc } => BucketOf::Route {
                        route: self.route(strings, p, grpc),
                    },
                    _ => {
                        let Some(dir) = dir() else { return };
                        BucketOf::Latency {
                            dir,
                            dst: self.dst(strings, p),
                        }
                    }
                };
                self.buckets.push(RawBucket {
                    series: p.series_id(),
                    le,
                    count: value,
                    of,
                });
                self.kept += 1;
                return;
            }
        };
        self.samples.push(Sample {
            id: p.series_id(),
            value,
            what,
            bucket: None,
        });
        self.kept += 1;
    }

    fn dst(&mut self, strings: &mut Strings, p: &Parsed<'_>) -> u32 {
        let workload = WorkloadKind::LABELS.iter().find_map(|(label, kind)| {
            let v = p.get(label)?;
            (!v.is_empty()).then(|| (*kind, strings.get(&v)))
        });
        let dst = Dst {
            authority: strings.label(p, b"authority"),
            namespace: strings.label(p, b"dst_namespace"),
            service: strings.label(p, b"dst_service"),
            pod: strings.label(p, b"dst_pod"),
            workload,
        };
        intern(&mut self.dsts, &mut self.dst_index, dst)
    }

    fn tls(&mut self, strings: &mut Strings, p: &Parsed<'_>) -> u32 {
        let tls = match p.get(b"tls").as_deref() {
            Some(b"true") => {
                let id = p.get(b"server_id").or_else(|| p.get(b"client_id"));
                Tls {
                    mtls: true,
                    detail: strings.get(id.as_deref().unwrap_or(b"")),
                }
            }
            Some(b"no_identity") => {
                let mut reason = b"no_identity: ".to_vec();
                reason.extend_from_slice(&p.get(b"no_tls_reason").unwrap_or_default());
                Tls {
                    mtls: false,
                    detail: strings.get(&reason),
                }
            }
            Some(other) => Tls {
                mtls: false,
                detail: strings.get(other),
            },
            None => Tls {
                mtls: false,
                detail: strings.get(b"unknown"),
            },
        };
        intern(&mut self.tls, &mut self.tls_index, tls)
    }

    fn route(&mut self, strings: &mut Strings, p: &Parsed<'_>, grpc: bool) -> u32 {
        let route = Route {
            grpc,
            parent_kind: strings.label(p, b"parent_kind"),
            parent_namespace: strings.label(p, b"parent_namespace"),
            parent_name: strings.label(p, b"parent_name"),
            parent_port: p
                .get(b"parent_port")
                .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()),
            route_kind: strings.label(p, b"route_kind"),
            route_namespace: strings.label(p, b"route_namespace"),
            route_name: strings.label(p, b"route_name"),
        };
        intern(&mut self.routes, &mut self.route_index, route)
    }

    fn finish(mut self, stats: ScanStats) -> Page {
        // Cumulative buckets to per-bucket counts, each with its bounds.
        let mut buckets = std::mem::take(&mut self.buckets);
        buckets.sort_by(|a, b| a.series.cmp(&b.series).then(a.le.total_cmp(&b.le)));
        let mut i = 0;
        while i < buckets.len() {
            let series = buckets[i].series;
            let (mut lo, mut below) = (0.0f64, 0.0f64);
            while i < buckets.len() && buckets[i].series == series {
                let b = &buckets[i];
                // Route durations are seconds; everything is kept in ms.
                let scale = match b.of {
                    BucketOf::Route { .. } => 1000.0,
                    BucketOf::Latency { .. } => 1.0,
                };
                let hi = b.le * scale;
                let count = b.count - below;
                if count > 0.0 {
                    let (lo32, hi32) = (lo as f32, hi as f32);
                    let what = match b.of {
                        BucketOf::Latency { dir, dst } => What::Latency {
                            dir,
                            dst,
                            lo: lo32,
                            hi: hi32,
                        },
                        BucketOf::Route { route } => What::RouteLatency {
                            route,
                            lo: lo32,
                            hi: hi32,
                        },
                    };
                    self.samples.push(Sample {
                        id: hash_of(&(series, b.le.to_bits())),
                        value: count,
                        what,
                        bucket: Some((series, b.le.to_bits())),
                    });
                }
                below = below.max(b.count);
                lo = hi.max(lo);
                i += 1;
            }
        }
        self.samples.sort_by_key(|s| s.id);
        self.samples.dedup_by_key(|s| s.id);
        self.samples.shrink_to_fit();
        self.dsts.shrink_to_fit();
        self.tls.shrink_to_fit();
        self.routes.shrink_to_fit();
        Page {
            dsts: self.dsts,
            tls: self.tls,
            routes: self.routes,
            samples: self.samples,
            skipped_lines: stats.skipped,
            first_skip: stats.first_skip,
            up: self.up,
        }
    }
}

/// Linkerd's classification when a `response_total` has none: 5xx or a
/// gRPC status other than OK is a failure.
fn classify(p: &Parsed<'_>) -> bool {
    let server_error = p
        .raw(b"status_code")
        .is_some_and(|s| s.raw.len() == 3 && s.raw[0] == b'5');
    let grpc_failed = p
        .raw(b"grpc_status_code")
        .is_some_and(|s| !s.raw.is_empty() && s.raw != b"0");
    !server_error && !grpc_failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &str) -> Page {
        parse(text.as_bytes(), &Limits::default(), None).expect("parses")
    }

    fn responses(p: &Page) -> Vec<(Direction, bool, f64)> {
        p.samples
            .iter()
            .filter_map(|s| match s.what {
                What::Response { dir, success, .. } => Some((dir, success, s.value)),
                _ => None,
            })
            .collect()
    }

    const OUT: &str = r#"direction="outbound",authority="web.demo.svc.cluster.local:80",dst_namespace="demo",dst_service="web",dst_pod="web-a",dst_deployment="web",dst_statefulset="",dst_daemonset="",dst_replicaset="",dst_k8s_job="",dst_serviceaccount="default",dst_pod_template_hash="""#;

    #[test]
    fn reads_linkerds_families_as_our_proxy_prints_them() {
        let text = format!(
            "# HELP response Responses.\n# TYPE response counter\n\
             response_total{{{OUT},classification=\"success\",status_code=\"200\",grpc_status_code=\"\"}} 7\n\
             response_total{{{OUT},classification=\"failure\",status_code=\"503\",grpc_status_code=\"\"}} 2\n\
             response_total{{direction=\"inbound\",authority=\"x\",classification=\"success\",status_code=\"200\"}} 5\n\
             request_total{{{OUT}}} 9\n\
             tcp_read_bytes_total{{{OUT},peer=\"dst\",tls=\"disabled\"}} 100\n\
             # EOF\n"
        );
        let p = page(&text);
        let mut r = responses(&p);
        r.sort_by(|a, b| a.2.total_cmp(&b.2));
        assert_eq!(
            r,
            vec![
                (Direction::Outbound, false, 2.0),
                (Direction::Inbound, true, 5.0),
                (Direction::Outbound, true, 7.0)
            ]
        );
        // Only response_total was kept; both outbound series share one dst.
        assert_eq!(p.len(), 3);
        let dst = p
            .dsts
            .iter()
            .find(|d| &*d.pod == "web-a")
            .expect("dst web-a");
        assert_eq!(&*dst.namespace, "demo");
        assert_eq!(&*dst.service, "web");
        assert_eq!(
            dst.workload.as_ref().map(|(k, n)| (k.as_str(), &**n)),
            Some(("deployment", "web"))
        );
        assert_eq!(p.skipped_lines(), 0);
    }

    #[test]
    fn histograms_become_per_bucket_counts_with_their_bounds() {
        let text = format!(
            "response_latency_ms_bucket{{le=\"1.0\",{OUT}}} 3\n\
             response_latency_ms_bucket{{le=\"2.0\",{OUT}}} 3\n\
             response_latency_ms_bucket{{le=\"10.0\",{OUT}}} 10\n\
             response_latency_ms_bucket{{le=\"+Inf\",{OUT}}} 11\n\
             response_latency_ms_count{{{OUT}}} 11\n\
             response_latency_ms_sum{{{OUT}}} 40.5\n\
             outbound_http_route_request_duration_seconds_bucket{{le=\"0.05\",parent_kind=\"Service\",parent_namespace=\"demo\",parent_name=\"web\",parent_port=\"80\",route_kind=\"default\",route_name=\"http\"}} 4\n\
             outbound_http_route_request_duration_seconds_bucket{{le=\"0.5\",parent_kind=\"Service\",parent_namespace=\"demo\",parent_name=\"web\",parent_port=\"80\",route_kind=\"default\",route_name=\"http\"}} 6\n"
        );
        let p = page(&text);
        let mut b: Vec<(f32, f32, f64)> = p
            .samples
            .iter()
            .filter_map(|s| match s.what {
                What::Latency { lo, hi, .. } | What::RouteLatency { lo, hi, .. } => {
                    Some((lo, hi, s.value))
                }
                _ => None,
            })
            .collect();
        b.sort_by(|x, y| x.1.total_cmp(&y.1).then(x.0.total_cmp(&y.0)));
        assert_eq!(
            b,
            vec![
                (0.0, 1.0, 3.0),
                (2.0, 10.0, 7.0),
                (0.0, 50.0, 4.0),
                (50.0, 500.0, 2.0),
                (10.0, f32::INFINITY, 1.0),
            ]
        );
        assert_eq!(p.routes.len(), 1);
        assert_eq!(p.routes[0].parent_port, Some(80));
    }

    #[test]
    fn the_text_formats_corners_are_read() {
        let cases: &[(&str, &str, Option<f64>)] = &[
            (
                "exponent",
                r#"response_total{direction="inbound"} 1.5e3"#,
                Some(1500.0),
            ),
            (
                "timestamp",
                r#"response_total{direction="inbound"} 4 1700000000000"#,
                Some(4.0),
            ),
            (
                "exemplar",
                r#"response_total{direction="inbound"} 4 # {trace_id="x"} 1"#,
                Some(4.0),
            ),
            (
                "tabs and spaces",
                "response_total{ direction = \"inbound\" , }\t8",
                Some(8.0),
            ),
            (
                "escapes",
                r#"response_total{authority="a\"b}\\c,\n",direction="inbound"} 3"#,
                Some(3.0),
            ),
            (
                "NaN is nothing",
                r#"response_total{direction="inbound"} NaN"#,
                None,
            ),
            (
                "+Inf is nothing",
                r#"response_total{direction="inbound"} +Inf"#,
                None,
            ),
            (
                "negative is nothing",
                r#"response_total{direction="inbound"} -3"#,
                None,
            ),
            (
                "zero is nothing",
                r#"response_total{direction="inbound"} 0"#,
                None,
            ),
            ("no direction", r#"response_total{authority="x"} 3"#, None),
            (
                "CRLF",
                "response_total{direction=\"inbound\"} 6\r",
                Some(6.0),
            ),
        ];
        for (name, line, want) in cases {
            let p = page(&format!("{line}\n"));
            let got = responses(&p).first().map(|r| r.2);
            assert_eq!(got, *want, "{name}: {line}");
            assert_eq!(p.skipped_lines(), 0, "{name}");
        }
        let p = page(r#"response_total{authority="a\"b}\\c,\n",direction="outbound"} 3"#);
        assert_eq!(&*p.dsts[0].authority, "a\"b}\\c,\n");
    }

    #[test]
    fn openmetrics_eof_ends_the_page_and_created_is_not_kept() {
        let p = page(
            "# TYPE response counter\n\
             response_total{direction=\"inbound\"} 2\n\
             response_created{direction=\"inbound\"} 1.7e9\n\
             # EOF\n\
             response_total{direction=\"outbound\"} 9\n\
             this is not a metric\n",
        );
        assert_eq!(responses(&p), vec![(Direction::Inbound, true, 2.0)]);
        assert_eq!(p.skipped_lines(), 0);
    }

    #[test]
    fn bad_lines_are_skipped_and_counted_never_a_panic() {
        let long = format!(
            "response_total{{direction=\"inbound\",authority=\"{}\"}} 1",
            "x".repeat(70 * 1024)
        );
        let bad: &[&[u8]] = &[
            long.as_bytes(),
            b"response_total{direction=\"inbound\",authority=\"unterminated} 1",
            b"response_total{direction=\"inbound\"",
            b"response_total{direction=inbound} 1",
            b"response_total{=\"x\"} 1",
            b"response_total{direction=\"inbound\"} one",
            b"response_total{direction=\"inbound\"}1",
            b"response_total",
            b"{direction=\"inbound\"} 1",
            b"9response_total 1",
            b"\xff\xfe garbage",
            b"response_total{direction=\"inbound\"} 1e999999999999",
        ];
        for line in bad {
            let mut text = b"response_total{direction=\"inbound\"} 5\n".to_vec();
            text.extend_from_slice(line);
            text.push(b'\n');
            let p = parse(&text, &Limits::default(), None).expect("the good line is read");
            let shown = String::from_utf8_lossy(&line[..line.len().min(60)]).to_string();
            assert_eq!(responses(&p).len(), 1, "{shown}");
            // `1e999999999999` parses as +Inf, which counts nothing but
            // is not malformed.
            if !line.ends_with(b"1e999999999999") {
                assert_eq!(p.skipped_lines(), 1, "{shown}");
                assert!(p.first_skip().is_some_and(|s| s.starts_with("line 2:")));
            }
        }
    }

    #[test]
    fn label_values_that_are_not_utf8_are_replaced() {
        let p = parse(
            b"response_total{direction=\"outbound\",dst_namespace=\"d\xffmo\"} 1\n",
            &Limits::default(),
            None,
        )
        .expect("parses");
        assert_eq!(&*p.dsts[0].namespace, "d\u{fffd}mo");
        let p = parse(
            b"response_total{direction=\"outbound\",dst_pod=\"\xc3\"} 1\n",
            &Limits::default(),
            None,
        )
        .expect("parses");
        assert_eq!(&*p.dsts[0].pod, "\u{fffd}");
    }

    /// The page (or error) of `text` fed in pieces of `size` bytes.
    fn fed(text: &[u8], size: usize, limits: &Limits) -> String {
        let mut parser = PageParser::new(*limits, Some(4191));
        for piece in text.chunks(size) {
            parser.feed(piece);
        }
        format!("{:?}", parser.finish())
    }

    #[test]
    fn a_page_fed_in_pieces_of_any_size_is_the_same_page() {
        let long = format!(
            "response_total{{direction=\"inbound\",authority=\"{}\"}} 1\n",
            "x".repeat(70 * 1024)
        );
        let pages: Vec<Vec<u8>> = vec![
            include_bytes!("../tests/data/l2p-web-a-t10.txt").to_vec(),
            include_bytes!("../tests/data/demo-proxy-t10.txt").to_vec(),
            // A long line in the middle, no newline at the end, CRLF lines.
            format!("response_total{{direction=\"inbound\"}} 5\n{long}9garbage\r\nresponse_total{{direction=\"outbound\"}} 7").into_bytes(),
            // Nothing after the OpenMetrics end is read.
            b"response_total{direction=\"inbound\"} 5\n# EOF\nresponse_total{direction=\"outbound\"} 7\n".to_vec(),
            b"<html><body>502 Bad Gateway</body></html>\n".to_vec(),
            Vec::new(),
        ];
        let limits = Limits::default();
        for text in &pages {
            let whole = format!("{:?}", parse(text, &limits, Some(4191)));
            for size in [1, 2, 3, 7, 100, 4096, 70 * 1024, 1 << 20] {
                assert_eq!(fed(text, size, &limits), whole, "pieces of {size}");
            }
        }
        // The long line is skipped and counted whatever the pieces.
        let p = parse(&pages[2], &limits, None).expect("parses");
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p.skipped_lines(), 2);
        assert_eq!(p.first_skip(), Some("line 2: line too long"));
        // Too many series is the same error, and nothing past it is kept.
        let tight = Limits {
            max_series: 10,
            ..Limits::default()
        };
        let whole = format!("{:?}", parse(&pages[0], &tight, Some(4191)));
        assert!(whole.contains("TooManySeries"), "{whole}");
        assert_eq!(fed(&pages[0], 333, &tight), whole);
    }

    #[test]
    fn a_parser_holds_at_most_one_line_of_the_page() {
        let mut parser = PageParser::new(Limits::default(), None);
        let line = b"response_total{direction=\"inbound\"} 5\n";
        for _ in 0..1000 {
            parser.feed(line);
        }
        // Whole lines are read in place, never copied.
        assert_eq!(parser.partial.capacity(), 0);
        parser.feed(&line[..10]);
        assert_eq!(parser.partial.len(), 10);
        // A line past the bound is dropped as it comes.
        parser.feed(&vec![b'x'; 70 * 1024]);
        assert!(parser.overlong);
        assert_eq!(parser.partial.capacity(), 0);
        parser.feed(b"\n");
        parser.feed(line);
        let p = parser.finish().expect("parses");
        assert_eq!(p.len(), 1);
        assert_eq!(p.skipped_lines(), 1);
        assert_eq!(p.first_skip(), Some("line 1001: line too long"));
    }

    #[test]
    fn garbage_is_an_error_and_an_empty_page_is_not() {
        assert!(matches!(
            parse(
                b"<html><body>502 Bad Gateway</body></html>\n",
                &Limits::default(),
                None
            ),
            Err(ParseError::NotExposition { line: 1, .. })
        ));
        assert!(matches!(
            parse(&[0u8, 159, 146, 150, 10, 255], &Limits::default(), None),
            Err(ParseError::NotExposition { .. })
        ));
        let p = parse(b"", &Limits::default(), None).expect("empty is fine");
        assert!(p.is_empty());
        let p = parse(b"# HELP x y\n# TYPE x counter\n", &Limits::default(), None).expect("ok");
        assert!(p.is_empty());
    }

    #[test]
    fn a_million_series_is_an_error_at_the_bound_not_a_million_records() {
        let mut text = Vec::with_capacity(60 << 20);
        for i in 0..1_000_000u32 {
            text.extend_from_slice(
                format!("response_total{{direction=\"inbound\",status_code=\"{i}\"}} 1\n")
                    .as_bytes(),
            );
        }
        let limits = Limits::default();
        match parse(&text, &limits, None) {
            Err(ParseError::TooManySeries { limit }) => assert_eq!(limit, 50_000),
            other => panic!("expected TooManySeries, got {other:?}"),
        }
        // At the bound itself, fine.
        let small = Limits {
            max_series: 10,
            ..limits
        };
        let ten: Vec<u8> = text
            .split(|b| *b == b'\n')
            .take(10)
            .flat_map(|l| {
                let mut l = l.to_vec();
                l.push(b'\n');
                l
            })
            .collect();
        assert_eq!(parse(&ten, &small, None).expect("10 fit").len(), 10);
        let mut eleven = ten.clone();
        eleven.extend_from_slice(b"response_total{direction=\"inbound\",status_code=\"x\"} 1\n");
        assert!(parse(&eleven, &small, None).is_err());
    }

    #[test]
    fn a_series_twice_is_kept_once_and_ids_ignore_label_order() {
        let a = page("response_total{direction=\"inbound\",status_code=\"200\"} 1\nresponse_total{direction=\"inbound\",status_code=\"200\"} 1\n");
        assert_eq!(a.len(), 1);
        let b = page("response_total{status_code=\"200\",direction=\"inbound\"} 1\n");
        assert_eq!(a.samples[0].id, b.samples[0].id);
        let c = page("response_total{status_code=\"201\",direction=\"inbound\"} 1\n");
        assert_ne!(a.samples[0].id, c.samples[0].id);
    }

    #[test]
    fn route_statuses_are_classified_like_linkerds() {
        let route = r#"parent_kind="Service",parent_namespace="demo",parent_name="web",parent_port="80",route_kind="HTTPRoute",route_namespace="demo",route_name="r""#;
        let cases = [
            ("http", r#"http_status="200",error="""#, true),
            ("http", r#"http_status="404",error="""#, true),
            ("http", r#"http_status="503",error="""#, false),
            ("http", r#"http_status="",error="FAIL_FAST""#, false),
            ("grpc", r#"grpc_status="OK",error="""#, true),
            ("grpc", r#"grpc_status="UNAVAILABLE",error="""#, false),
            ("grpc", r#"grpc_status="",error="REQUEST_TIMEOUT""#, false),
        ];
        for (proto, labels, success) in cases {
            let text =
                format!("outbound_{proto}_route_request_statuses_total{{{route},{labels}}} 3\n");
            let p = page(&text);
            assert_eq!(
                p.samples[0].what,
                What::RouteStatus { route: 0, success },
                "{proto} {labels}"
            );
            assert_eq!(p.routes[0].grpc, proto == "grpc");
        }
    }

    #[test]
    fn tls_labels_say_mtls_and_why_not() {
        let cases = [
            (
                r#"tls="true",server_id="web.demo.serviceaccount.identity.linkerd.cluster.local""#,
                true,
                "web.demo.serviceaccount.identity.linkerd.cluster.local",
            ),
            (
                r#"tls="no_identity",no_tls_reason="not_provided_by_service_discovery""#,
                false,
                "no_identity: not_provided_by_service_discovery",
            ),
            (r#"tls="disabled""#, false, "disabled"),
            (r#"tls="opaque",sni="x""#, false, "opaque"),
        ];
        for (labels, mtls, detail) in cases {
            let p = page(&format!(
                "tcp_open_total{{peer=\"dst\",{OUT},{labels}}} 1\n"
            ));
            assert_eq!(p.tls.len(), 1);
            assert_eq!(
                (p.tls[0].mtls, &*p.tls[0].detail),
                (mtls, detail),
                "{labels}"
            );
        }
    }

    #[test]
    fn inbound_series_to_the_proxys_admin_port_are_not_traffic() {
        // As Linkerd's proxy exports them: the scrapes of its /metrics
        // counted as inbound requests and connections on port 4191.
        let text = "response_total{direction=\"inbound\",target_port=\"4191\",classification=\"success\"} 13\n\
            response_total{direction=\"inbound\",target_port=\"8080\",classification=\"success\"} 200\n\
            response_latency_ms_bucket{direction=\"inbound\",target_port=\"4191\",le=\"1\"} 13\n\
            tcp_open_total{direction=\"inbound\",peer=\"src\",target_port=\"4191\",tls=\"no_identity\"} 1\n\
            response_total{direction=\"outbound\",target_port=\"4191\",classification=\"success\"} 2\n";
        let all = parse(text.as_bytes(), &Limits::default(), None).expect("parses");
        assert_eq!(all.len(), 5);
        let traffic = parse(text.as_bytes(), &Limits::default(), Some(4191)).expect("parses");
        assert_eq!(
            traffic.len(),
            2,
            "inbound to 8080 and outbound to 4191 stay"
        );
        let mut kept = responses(&traffic);
        // Samples come in series-id order: inbound first here.
        kept.sort_by_key(|(dir, ..)| *dir == Direction::Outbound);
        assert_eq!(
            kept,
            vec![
                (Direction::Inbound, true, 200.0),
                (Direction::Outbound, true, 2.0)
            ]
        );
        // From Prometheus, by each pod's own admin port.
        let federated = "response_total{direction=\"inbound\",namespace=\"demo\",pod=\"a\",target_port=\"4191\"} 3\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"b\",target_port=\"4191\"} 3\n";
        let ports = |_: &str, pod: &str| (pod == "a").then_some(4191);
        let pods =
            parse_federated(federated.as_bytes(), &Limits::default(), &ports).expect("parses");
        let lens: Vec<(&str, usize)> = pods
            .iter()
            .map(|(r, p)| (r.name.as_str(), p.len()))
            .collect();
        assert_eq!(lens, vec![("a", 0), ("b", 1)]);
    }

    #[test]
    fn federated_series_split_by_namespace_and_pod() {
        let text = "# TYPE response_total untyped\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"web-1\",instance=\"1.2.3.4:4191\"} 3 1700000000000\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"web-2\"} 4 1700000000000\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"web-1\",status_code=\"500\",classification=\"failure\"} 1 1700000000000\n\
            response_total{direction=\"inbound\",pod=\"nons\"} 9\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"\"} 9\n";
        let pods =
            parse_federated(text.as_bytes(), &Limits::default(), &|_, _| None).expect("parses");
        let names: Vec<(&str, usize)> = pods
            .iter()
            .map(|(r, p)| (r.name.as_str(), p.len()))
            .collect();
        assert_eq!(names, vec![("web-1", 2), ("web-2", 1)]);
        assert!(pods
            .iter()
            .all(|(r, _)| r.kind == "pod" && r.namespace == "demo"));
        let small = Limits {
            max_series: 2,
            ..Limits::default()
        };
        assert!(matches!(
            parse_federated(text.as_bytes(), &small, &|_, _| None),
            Err(ParseError::TooManySeries { .. })
        ));
    }

    #[test]
    fn federated_up_says_whether_prometheus_reaches_each_proxy() {
        let text = "response_total{direction=\"inbound\",namespace=\"demo\",pod=\"web-1\"} 3\n\
            up{job=\"linkerd-proxy\",namespace=\"demo\",pod=\"web-1\"} 1\n\
            up{job=\"linkerd-proxy\",namespace=\"demo\",pod=\"web-2\"} 0\n\
            up{job=\"linkerd-proxy\",namespace=\"demo\",pod=\"web-3\"} 0\n\
            up{job=\"linkerd-proxy\",namespace=\"demo\",pod=\"web-3\"} 1\n\
            response_total{direction=\"inbound\",namespace=\"demo\",pod=\"web-4\"} 3\n";
        let pods =
            parse_federated(text.as_bytes(), &Limits::default(), &|_, _| None).expect("parses");
        let ups: Vec<(&str, Option<bool>, usize)> = pods
            .iter()
            .map(|(r, p)| (r.name.as_str(), p.prometheus_up(), p.len()))
            .collect();
        assert_eq!(
            ups,
            vec![
                ("web-1", Some(true), 1),
                ("web-2", Some(false), 0),
                ("web-3", Some(true), 0),
                ("web-4", None, 1),
            ]
        );
        // A proxy's own page has no `up`, and one there is no traffic.
        let page = parse(b"up 1\n", &Limits::default(), None).expect("parses");
        assert_eq!((page.prometheus_up(), page.len()), (None, 0));
    }

    #[test]
    fn samples_reads_every_family_as_written() {
        let text = "# HELP process_cpu_seconds_total CPU\n\
            # TYPE process_cpu_seconds_total counter\n\
            process_cpu_seconds_total 1.5\n\
            request_total{direction=\"outbound\",authority=\"a\\\"b\\n\"} 3 1700000000000\n\
            tcp_open_connections{ peer = \"dst\" ,} -2\n\
            this is not a metric\n\
            up NaN\n\
            # EOF\n\
            after_eof 1\n";
        let all = samples(text.as_bytes(), &Limits::default()).expect("a page");
        type Read<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);
        let got: Vec<Read> = all
            .iter()
            .filter(|s| !s.value.is_nan())
            .map(|s| {
                let labels = s
                    .labels
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                (s.name.as_str(), labels, s.value)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("process_cpu_seconds_total", vec![], 1.5),
                (
                    "request_total",
                    vec![("direction", "outbound"), ("authority", "a\"b\n")],
                    3.0
                ),
                ("tcp_open_connections", vec![("peer", "dst")], -2.0),
            ]
        );
        assert_eq!(all.len(), 4, "NaN is a value too");
        assert_eq!(all[1].label("direction"), Some("outbound"));
        assert_eq!(all[1].label("tls"), None);
        assert!(matches!(
            samples(b"<html>502</html>\n", &Limits::default()),
            Err(ParseError::NotExposition { line: 1, .. })
        ));
        let small = Limits {
            max_series: 1,
            ..Limits::default()
        };
        assert!(matches!(
            samples(b"a 1\nb 2\n", &small),
            Err(ParseError::TooManySeries { limit: 1 })
        ));
    }
}
