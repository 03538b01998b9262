//! `--client raw`: the bench's streams on HTTP/2 connections it frames by
//! hand (not a test).
//!
//! The bench plays 25,000 proxies on the controller's two cores, so what it
//! spends reading an update delays the updates it measures; a real proxy
//! reads its few updates on CPU of its own. This client does the least a
//! gRPC client of server streams can: it writes each stream's request as
//! one HEADERS and one DATA frame (HPACK literals, no table), and reads
//! frames, splitting DATA into gRPC messages by their 5-byte prefixes
//! without decoding them (a Get stream's `Add` is told by the message's
//! first byte: field 1 of `Update`). It answers SETTINGS and PING, gives the
//! controller windows of 2 GiB and tops them up, and ends a stream on
//! trailers, RST_STREAM, GOAWAY or the connection's end. It does not decode
//! response headers (HPACK state it never needs), so a refusal is reported
//! without its gRPC status.

use super::Event;
use std::{collections::HashMap, net::SocketAddr, time::Instant};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{tcp::OwnedReadHalf, TcpStream},
    sync::{mpsc, OwnedSemaphorePermit},
};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest window HTTP/2 allows, asked for every stream and the
/// connection: the controller is never held back by this client.
const WINDOW: u32 = (1 << 31) - 1;
/// Consumed bytes after which a window is topped up.
const TOP_UP: u32 = 1 << 30;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;

/// A stream to open on a connection.
pub(super) struct Open {
    /// The bench's id of the stream (what its events carry).
    pub id: u32,
    /// The gRPC method's path.
    pub path: &'static str,
    /// The request message, encoded.
    pub message: Vec<u8>,
    /// Count only `Update`s whose first field is `add` (Get streams).
    pub adds_only: bool,
    /// Held until the stream's first message.
    pub permit: OwnedSemaphorePermit,
}

/// One connection: streams are opened by sending `Open`s; their events go
/// to `events`.
pub(super) async fn connect(
    addr: SocketAddr,
    events: mpsc::UnboundedSender<Event>,
) -> std::io::Result<mpsc::UnboundedSender<Open>> {
    let io = TcpStream::connect(addr).await?;
    io.set_nodelay(true)?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(io, addr.to_string(), rx, events));
    Ok(tx)
}

/// What a stream has read of its current gRPC message.
#[derive(Default)]
struct Messages {
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come, when inside one.
    remaining: Option<usize>,
    first_byte: Option<u8>,
}

impl Messages {
    /// Feeds a DATA frame's bytes; calls `done` with each whole message's
    /// first byte (`None` for an empty message).
    fn feed(&mut self, mut data: &[u8], mut done: impl FnMut(Option<u8>)) {
        while !data.is_empty() {
            match self.remaining {
                None => {
                    let n = (5 - self.prefix_len).min(data.len());
                    self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
                    self.prefix_len += n;
                    data = &data[n..];
                    if self.prefix_len == 5 {
                        self.prefix_len = 0;
                        let len = u32::from_be_bytes([
                            self.prefix[1],
                            self.prefix[2],
                            self.prefix[3],
                            self.prefix[4],
                        ]) as usize;
                        if len == 0 {
                            done(None);
                        } else {
                            self.remaining = Some(len);
                            self.first_byte = None;
                        }
                    }
                }
                Some(left) => {
                    let n = left.min(data.len());
                    if self.first_byte.is_none() {
                        self.first_byte = Some(data[0]);
                    }
                    data = &data[n..];
                    if n == left {
                        self.remaining = None;
                        done(self.first_byte.take());
                    } else {
                        self.remaining = Some(left - n);
                    }
                }
            }
        }
    }
}

struct Stream {
    id: u32,
    adds_only: bool,
    permit: Option<OwnedSemaphorePermit>,
    messages: Messages,
    consumed: u32,
}

impl Stream {
    /// The stream is over: its first message's failure if it had none.
    fn end(self, why: String, events: &mpsc::UnboundedSender<Event>) {
        let _ = events.send(if self.permit.is_some() {
            Event::First(self.id, Err(why))
        } else {
            Event::Ended(self.id, why)
        });
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541, 5.1) after `first`'s
/// high bits.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A header as "literal without indexing, new name", no Huffman.
fn hpack_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A request on stream `stream`: HEADERS, then the message in one DATA
/// frame that ends the client's side.
fn request(out: &mut Vec<u8>, stream: u32, authority: &str, path: &str, message: &[u8]) {
    let mut block = Vec::with_capacity(128);
    block.push(0x83); // :method POST (static table 3)
    block.push(0x86); // :scheme http (static table 6)
    hpack_literal(&mut block, ":path", path);
    hpack_literal(&mut block, ":authority", authority);
    hpack_literal(&mut block, "content-type", "application/grpc");
    hpack_literal(&mut block, "te", "trailers");
    frame(out, HEADERS, END_HEADERS, stream, &block);
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    frame(out, DATA, END_STREAM, stream, &body);
}

fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    frame(out, WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

/// The start of a connection: preface, SETTINGS (no push, the largest
/// stream window), and the connection's window raised to the largest.
fn preface(out: &mut Vec<u8>) {
    out.extend_from_slice(PREFACE);
    let mut settings = Vec::new();
    for (id, value) in [(0x2u16, 0u32), (0x4, WINDOW)] {
        settings.extend_from_slice(&id.to_be_bytes());
        settings.extend_from_slice(&value.to_be_bytes());
    }
    frame(out, SETTINGS, 0, 0, &settings);
    window_update(out, 0, WINDOW - 65_535);
}

/// A connection's state: its streams by HTTP/2 id.
struct Conn {
    streams: HashMap<u32, Stream>,
    next_id: u32,
    consumed: u32,
    authority: String,
    events: mpsc::UnboundedSender<Event>,
}

impl Conn {
    fn open(&mut self, o: Open, out: &mut Vec<u8>) {
        let h2 = self.next_id;
        self.next_id += 2;
        request(out, h2, &self.authority, o.path, &o.message);
        self.streams.insert(
            h2,
            Stream {
                id: o.id,
                adds_only: o.adds_only,
                permit: Some(o.permit),
                messages: Messages::default(),
                consumed: 0,
            },
        );
    }

    /// Handles the whole frames at the start of `buf`, read at `at`; what
    /// it answers goes to `out`. The bytes it used, or why the connection
    /// cannot go on.
    fn frames(&mut self, buf: &[u8], at: Instant, out: &mut Vec<u8>) -> Result<usize, String> {
        let mut used = 0;
        while buf.len() - used >= 9 {
            let h = &buf[used..used + 9];
            let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
            if buf.len() - used - 9 < len {
                break;
            }
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            let payload = &buf[used + 9..used + 9 + len];
            used += 9 + len;
            match kind {
                DATA => self.data(stream, flags, payload, at, out)?,
                HEADERS if flags & END_STREAM != 0 => {
                    if let Some(s) = self.streams.remove(&stream) {
                        s.end(
                            "trailers (the raw client does not decode the gRPC status)".into(),
                            &self.events,
                        );
                    }
                }
                RST_STREAM => {
                    if let Some(s) = self.streams.remove(&stream) {
                        let code = payload
                            .get(..4)
                            .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                        s.end(format!("RST_STREAM (error code {code})"), &self.events);
                    }
                }
                SETTINGS if flags & ACK == 0 => frame(out, SETTINGS, ACK, 0, &[]),
                PING if flags & ACK == 0 => frame(out, PING, ACK, 0, payload),
                GOAWAY => {
                    let last = payload.get(..4).map_or(0, |c| {
                        u32::from_be_bytes([c[0], c[1], c[2], c[3]]) & 0x7fff_ffff
                    });
                    let refused: Vec<u32> = self
                        .streams
                        .keys()
                        .copied()
                        .filter(|id| *id > last)
                        .collect();
                    for id in refused {
                        if let Some(s) = self.streams.remove(&id) {
                            s.end("GOAWAY: not processed".into(), &self.events);
                        }
                    }
                }
                // Response headers, CONTINUATION, WINDOW_UPDATE, PRIORITY
                // and unknown frames change nothing this client tracks.
                _ => {}
            }
        }
        Ok(used)
    }

    fn data(
        &mut self,
        stream: u32,
        flags: u8,
        payload: &[u8],
        at: Instant,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        // Flow control counts the whole payload, padding included.
        let counted = payload.len() as u32;
        self.consumed += counted;
        if self.consumed >= TOP_UP {
            window_update(out, 0, self.consumed);
            self.consumed = 0;
        }
        let mut data = payload;
        if flags & PADDED != 0 {
            let (&pad, rest) = data
                .split_first()
                .ok_or("a padded DATA frame without its length")?;
            let keep = rest
                .len()
                .checked_sub(pad as usize)
                .ok_or("a DATA frame's padding longer than the frame")?;
            data = &rest[..keep];
        }
        let Some(s) = self.streams.get_mut(&stream) else {
            return Ok(());
        };
        s.consumed += counted;
        if s.consumed >= TOP_UP {
            window_update(out, stream, s.consumed);
            s.consumed = 0;
        }
        let events = &self.events;
        let (id, adds_only, permit) = (s.id, s.adds_only, &mut s.permit);
        s.messages.feed(data, |first_byte| {
            if permit.take().is_some() {
                let _ = events.send(Event::First(id, Ok(())));
            } else if !adds_only || first_byte == Some(0x0a) {
                let _ = events.send(Event::Update(id, at));
            }
        });
        if flags & END_STREAM != 0 {
            if let Some(s) = self.streams.remove(&stream) {
                s.end("ended without trailers".into(), &self.events);
            }
        }
        Ok(())
    }

    /// Every stream left ends with `why`.
    fn close(&mut self, why: &str) {
        for (_, s) in self.streams.drain() {
            s.end(why.to_string(), &self.events);
        }
    }
}

/// Reads what the socket has onto the end of `buf`, with room for a whole
/// frame (the buffer is kept: one allocation per connection, not per read).
async fn read_more(rd: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(16 * 1024 + 9);
    rd.read_buf(buf).await
}

async fn run(
    io: TcpStream,
    authority: String,
    mut opens: mpsc::UnboundedReceiver<Open>,
    events: mpsc::UnboundedSender<Event>,
) {
    let (mut rd, mut wr) = io.into_split();
    let mut conn = Conn {
        streams: HashMap::new(),
        next_id: 1,
        consumed: 0,
        authority,
        events,
    };
    let mut out = Vec::with_capacity(16 * 1024);
    preface(&mut out);
    // Frames are read straight into `buf`; what a read leaves of a frame
    // stays for the next. The controller's frames are at most 16 KiB (this
    // client leaves SETTINGS_MAX_FRAME_SIZE at its default).
    let mut buf: Vec<u8> = Vec::new();
    let mut opening = true;
    let why = loop {
        if !out.is_empty() {
            if let Err(e) = wr.write_all(&out).await {
                break format!("connection lost: {e}");
            }
            out.clear();
        }
        tokio::select! {
            open = opens.recv(), if opening => match open {
                Some(o) => {
                    conn.open(o, &mut out);
                    while let Ok(o) = opens.try_recv() {
                        conn.open(o, &mut out);
                    }
                }
                None => opening = false,
            },
            read = read_more(&mut rd, &mut buf) => match read {
                Ok(0) => break "connection closed by the controller".to_string(),
                Err(e) => break format!("connection lost: {e}"),
                Ok(_) => {
                    let at = Instant::now();
                    match conn.frames(&buf, at, &mut out) {
                        Ok(used) => drop(buf.drain(..used)),
                        Err(e) => break format!("bad frame from the controller: {e}"),
                    }
                }
            },
        }
    };
    conn.close(&why);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(message: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&(message.len() as u32).to_be_bytes());
        v.extend_from_slice(message);
        v
    }

    #[test]
    fn messages_are_split_by_their_prefixes_across_frames() {
        let mut bytes = grpc(&[0x0a, 1, 2, 3]);
        bytes.extend(grpc(&[]));
        bytes.extend(grpc(&[0x12, 9]));
        // Every split point, including inside a prefix.
        for cut in 0..bytes.len() {
            let mut m = Messages::default();
            let mut got = Vec::new();
            m.feed(&bytes[..cut], |b| got.push(b));
            m.feed(&bytes[cut..], |b| got.push(b));
            assert_eq!(got, vec![Some(0x0a), None, Some(0x12)], "cut at {cut}");
        }
    }

    #[test]
    fn hpack_integers_follow_the_prefix_rule() {
        // RFC 7541, C.1.1 and C.1.2.
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 5, 10);
        assert_eq!(out, [10]);
        out.clear();
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [31, 154, 10]);
        out.clear();
        hpack_int(&mut out, 0, 7, 127);
        assert_eq!(out, [127, 0]);
    }

    #[tokio::test]
    async fn frames_answer_pings_and_report_messages_updates_and_ends() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut conn = Conn {
            streams: HashMap::new(),
            next_id: 1,
            consumed: 0,
            authority: "127.0.0.1:1".into(),
            events: tx,
        };
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(2));
        let mut out = Vec::new();
        for (id, adds_only) in [(7, true), (8, false)] {
            let open = Open {
                id,
                path: "/p",
                message: vec![1, 2],
                adds_only,
                permit: sem.clone().acquire_owned().await.unwrap(),
            };
            conn.open(open, &mut out);
        }
        // Two requests, HEADERS and DATA each, on streams 1 and 3.
        assert_eq!(conn.streams.len(), 2);
        assert_eq!(sem.available_permits(), 0);
        out.clear();

        let mut from = Vec::new();
        frame(&mut from, PING, 0, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        frame(&mut from, DATA, 0, 1, &grpc(&[0x0a])); // stream 1's first
        frame(&mut from, DATA, 0, 3, &grpc(&[0x12])); // stream 3's first
        frame(&mut from, DATA, 0, 1, &grpc(&[0x12])); // a Remove: not counted
        frame(&mut from, DATA, 0, 1, &grpc(&[0x0a])); // an Add
        frame(&mut from, DATA, 0, 3, &grpc(&[0x12])); // counted: not adds_only
        frame(&mut from, RST_STREAM, 0, 3, &8u32.to_be_bytes());
        let at = Instant::now();
        let whole = from.len();
        from.extend_from_slice(&[0, 0]); // the start of a next frame
        assert_eq!(conn.frames(&from, at, &mut out), Ok(whole));
        let mut ack = Vec::new();
        frame(&mut ack, PING, ACK, 0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(out, ack);
        assert_eq!(
            sem.available_permits(),
            2,
            "first messages let go of permits"
        );

        let mut seen = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            seen.push(match ev {
                Event::First(id, r) => format!("first {id} {}", r.is_ok()),
                Event::Update(id, _) => format!("update {id}"),
                Event::Ended(id, why) => format!("ended {id} {why}"),
            });
        }
        assert_eq!(
            seen,
            [
                "first 7 true",
                "first 8 true",
                "update 7",
                "update 8",
                "ended 8 RST_STREAM (error code 8)"
            ]
        );
        conn.close("gone");
        assert!(matches!(rx.try_recv(), Ok(Event::Ended(7, why)) if why == "gone"));
    }
}
