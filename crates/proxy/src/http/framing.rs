//! The request framing a client sends on an HTTP/1 connection, checked
//! below hyper.
//!
//! hyper ends a chunk extension at the first CR and does not look inside
//! it, so a chunk-size line with an unterminated quoted-string
//! (`1;a="<CRLF>X<CRLF>0<CRLF><CRLF>GET /other ...`) ends the body for
//! hyper, while a front end that reads quoted-strings the RFC 9112 way (or
//! wrongly across the line end) sees one request. Bytes one side takes for
//! body and the other for a request are a smuggling channel. No released
//! hyper (1.12 here) checks the extension, and forking hyper for it would
//! leave the proxy on a private copy of its HTTP/1 code; so the proxy reads
//! the framing of the bytes it hands hyper with [`RequestFraming`] (heads
//! framed as httparse, hyper's parser, frames them; the fuzz target
//! `h1_framing` holds the two to the same requests) and
//! [`Guarded`] stops the stream before the end of a malformed chunk line:
//! hyper never sees that line end, its body read fails, and the server
//! answers the request 400 `malformed_chunk` itself (whatever became of it
//! upstream) and closes the connection.
//!
//! A chunk line must be, per RFC 9112 section 7.1.1 (with RFC 9110
//! section 5.6's token and quoted-string):
//! `1*HEXDIG *( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] ) BWS CRLF`
//! (the trailing BWS is hyper's leniency, kept: it frames the same either
//! way). CR, LF and other controls are never allowed inside, quoted or not.
//!
//! Where the framing is not one hyper would take (a head that does not
//! parse or is too large, a Transfer-Encoding that does not end in
//! chunked, lengths that disagree), the check stops and leaves the
//! connection to hyper, which refuses those itself; after a CONNECT or an
//! `Upgrade` request the bytes are not HTTP any more and are not read.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest chunk-size line read (hyper allows 16 KiB of extensions in a
/// whole body); a longer one is refused.
pub const MAX_CHUNK_LINE: usize = 16 * 1024;
/// Hex digits of a chunk size: 16 fill a u64.
const MAX_SIZE_DIGITS: usize = 16;

/// Why a request's framing was refused (the `io::Error`'s inner error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed chunk line (RFC 9112 section 7.1)")]
pub struct MalformedChunk;

impl MalformedChunk {
    /// Whether `e`, or an error it was caused by, is this refusal.
    pub fn caused(e: &(dyn std::error::Error + 'static)) -> bool {
        let mut source = Some(e);
        while let Some(err) = source {
            if err.downcast_ref::<MalformedChunk>().is_some() {
                return true;
            }
            if let Some(io) = err.downcast_ref::<io::Error>() {
                if io
                    .get_ref()
                    .is_some_and(|inner| inner.downcast_ref::<MalformedChunk>().is_some())
                {
                    return true;
                }
            }
            source = err.source();
        }
        false
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a request head (kept in `buf`).
    Head,
    /// This many body bytes follow by Content-Length.
    Fixed(u64),
    /// Reading a chunk-size line (kept in `buf`, up to its LF).
    SizeLine,
    /// This many bytes of chunk data follow, then CRLF.
    Data(u64),
    DataCr,
    DataLf,
    /// Trailer lines after the last chunk, up to an empty line; `len` is
    /// the current line's length so far, `cr` whether its last byte was CR.
    /// Each line ends with CRLF, never a bare LF: hyper reads a bare LF in a
    /// trailer as part of the line, where a lenient reader ends the line
    /// there (and a request after it would hide in hyper's trailers).
    Trailers {
        len: usize,
        cr: bool,
    },
    /// Not read any more: left to hyper.
    Off,
    /// A malformed chunk line was seen.
    Refused,
}

/// The framing of the requests on one client connection, read as the bytes
/// pass.
#[derive(Debug)]
pub struct RequestFraming {
    state: State,
    /// The head or chunk line being read.
    buf: Vec<u8>,
    /// The largest head read; a longer one is left to hyper (which answers
    /// 431).
    max_head: usize,
    /// Request heads read whole so far.
    heads: u64,
}

impl RequestFraming {
    pub fn new(max_head: usize) -> Self {
        Self {
            state: State::Head,
            buf: Vec::new(),
            max_head,
            heads: 0,
        }
    }

    /// Request heads read whole so far.
    pub fn heads(&self) -> u64 {
        self.heads
    }

    /// Whether the bytes so far end between two messages.
    pub fn between_messages(&self) -> bool {
        self.state == State::Head && self.buf.is_empty()
    }

    /// Whether the framing was left to hyper (see the module's doc).
    pub fn left_to_hyper(&self) -> bool {
        self.state == State::Off
    }

    /// Reads `bytes`, the next the client sent. `Err(n)`: the framing is
    /// malformed; only `bytes[..n]` may be handed on (they end before the
    /// end of the offending line, so a reader never completes it).
    pub fn scan(&mut self, mut bytes: &[u8]) -> Result<(), usize> {
        let total = bytes.len();
        while !bytes.is_empty() {
            let at = total - bytes.len();
            match self.state {
                State::Off => return Ok(()),
                State::Refused => return Err(at),
                State::Head => bytes = self.head(bytes),
                State::Fixed(n) => {
                    let left;
                    (bytes, left) = skip(bytes, n);
                    self.state = if left == 0 {
                        State::Head
                    } else {
                        State::Fixed(left)
                    };
                }
                State::SizeLine => {
                    let Some(lf) = bytes.iter().position(|&b| b == b'\n') else {
                        if self.buf.len() + bytes.len() > MAX_CHUNK_LINE {
                            return self.refuse(at);
                        }
                        self.buf.extend_from_slice(bytes);
                        return Ok(());
                    };
                    if self.buf.len() + lf > MAX_CHUNK_LINE {
                        return self.refuse(at);
                    }
                    self.buf.extend_from_slice(&bytes[..lf]);
                    let Some(size) = chunk_size_line(&self.buf) else {
                        return self.refuse(at + lf);
                    };
                    self.buf.clear();
                    bytes = &bytes[lf + 1..];
                    self.state = if size == 0 {
                        State::Trailers { len: 0, cr: false }
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(n) => {
                    let left;
                    (bytes, left) = skip(bytes, n);
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data(left)
                    };
                }
                State::DataCr | State::DataLf => {
                    let want = if self.state == State::DataCr {
                        b'\r'
                    } else {
                        b'\n'
                    };
                    if bytes[0] != want {
                        return self.refuse(at);
                    }
                    bytes = &bytes[1..];
                    self.state = if want == b'\r' {
                        State::DataLf
                    } else {
                        State::SizeLine
                    };
                }
                State::Trailers { mut len, mut cr } => {
                    // Byte by byte: trailers are rare and short.
                    let mut end = None;
                    for (i, &b) in bytes.iter().enumerate() {
                        match (cr, b) {
                            (true, b'\n') if len == 0 => {
                                end = Some(i + 1);
                                break;
                            }
                            (true, b'\n') => (len, cr) = (0, false),
                            (true, _) | (false, b'\n') => return self.refuse(at + i),
                            (false, b'\r') => cr = true,
                            (false, _) => len += 1,
                        }
                    }
                    match end {
                        Some(n) => {
                            bytes = &bytes[n..];
                            self.state = State::Head;
                        }
                        None => {
                            self.state = State::Trailers { len, cr };
                            return Ok(());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn refuse(&mut self, at: usize) -> Result<(), usize> {
        self.state = State::Refused;
        self.buf = Vec::new();
        Err(at)
    }

    fn off(&mut self) {
        self.state = State::Off;
        self.buf = Vec::new();
    }

    /// Reads head bytes; returns what follows the head once it is whole.
    fn head<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        // Most heads come whole in one read: parsed where they lie.
        let had = self.buf.len();
        let parsed = if had == 0 {
            parse_head(bytes)
        } else {
            self.buf.extend_from_slice(bytes);
            parse_head(&self.buf)
        };
        match parsed {
            Parsed::Done(len, next) => {
                self.buf.clear();
                self.state = next;
                self.heads += 1;
                // The bytes kept from earlier reads did not hold the head.
                &bytes[len.saturating_sub(had).min(bytes.len())..]
            }
            Parsed::Partial => {
                if had == 0 {
                    self.buf.extend_from_slice(bytes);
                }
                if self.buf.len() > self.max_head {
                    self.off();
                }
                &[]
            }
            Parsed::Off => {
                self.off();
                &[]
            }
        }
    }
}

/// Passes over up to `n` body bytes: what follows them, and how many are
/// still to come.
fn skip(bytes: &[u8], n: u64) -> (&[u8], u64) {
    let take = usize::try_from(n).unwrap_or(usize::MAX).min(bytes.len());
    (&bytes[take..], n - take as u64)
}

/// The answer to a request whose chunked body was refused: the client's
/// fault, whatever the upstream did with the part it got; its connection
/// closes (hyper cannot read on).
pub fn refused_response() -> http::Response<super::ResponseBody> {
    let mut rsp = super::error_response(http::StatusCode::BAD_REQUEST, "malformed_chunk");
    rsp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    rsp
}

enum Parsed {
    Partial,
    /// The head is this long; the framing that follows it.
    Done(usize, State),
    /// Not a framing to read: left to hyper.
    Off,
}

/// Reads a request head as httparse (hyper's parser) frames it: empty
/// lines before the request line are skipped, lines end with LF (a CR
/// before it is dropped), and the head ends at the first empty line. Only
/// what framing needs is read (the method, the version, Transfer-Encoding,
/// Content-Length, Upgrade): a second full parse per request cost ~1,300
/// instructions. What httparse would refuse, hyper refuses itself, so a
/// head read here that hyper refuses ends the connection either way.
fn parse_head(bytes: &[u8]) -> Parsed {
    let mut at = 0;
    loop {
        match &bytes[at..] {
            [b'\r', b'\n', ..] => at += 2,
            [b'\n', ..] => at += 1,
            [] | [b'\r'] => return Parsed::Partial,
            _ => break,
        }
    }
    let Some(lf) = memchr::memchr(b'\n', &bytes[at..]) else {
        return Parsed::Partial;
    };
    let line = &bytes[at..at + lf];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    at += lf + 1;
    let http11 = if line.ends_with(b" HTTP/1.1") {
        true
    } else if line.ends_with(b" HTTP/1.0") {
        false
    } else {
        return Parsed::Off;
    };
    if line.starts_with(b"CONNECT ") {
        return Parsed::Off;
    }
    let mut te: Option<&[u8]> = None;
    let mut length: Option<u64> = None;
    loop {
        let Some(lf) = memchr::memchr(b'\n', &bytes[at..]) else {
            return Parsed::Partial;
        };
        let line = &bytes[at..at + lf];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += lf + 1;
        // Only names starting like the three read need their colon found
        // (a line with none is httparse's error, and so hyper's).
        match line.first() {
            None => break,
            Some(b'c' | b'C' | b't' | b'T' | b'u' | b'U') => {}
            Some(_) => continue,
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            return Parsed::Off;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        // Compared by length first: most names are none of the three.
        match name.len() {
            7 if name.eq_ignore_ascii_case(b"upgrade") => return Parsed::Off,
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                for v in value.split(|&b| b == b',') {
                    let v = v.trim_ascii();
                    let Some(n) = std::str::from_utf8(v)
                        .ok()
                        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok())
                    else {
                        return Parsed::Off;
                    };
                    if length.is_some_and(|l| l != n) {
                        return Parsed::Off;
                    }
                    length = Some(n);
                }
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => te = Some(value),
            _ => {}
        }
    }
    let next = match (te, length) {
        (Some(te), _) => {
            let last = te.rsplit(|&b| b == b',').next().unwrap_or_default();
            if !http11 || !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Parsed::Off;
            }
            State::SizeLine
        }
        (None, Some(0)) | (None, None) => State::Head,
        (None, Some(n)) => State::Fixed(n),
    };
    Parsed::Done(at, next)
}

/// The size of a chunk-size `line` (its LF removed, its CR kept), if the
/// line is well formed.
pub fn chunk_size_line(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r")?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > MAX_SIZE_DIGITS {
        return None;
    }
    let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()?;
    let mut rest = skip_ws(&line[digits..]);
    while let Some(ext) = rest.strip_prefix(b";") {
        let ext = skip_ws(ext);
        let name = token_len(ext);
        if name == 0 {
            return None;
        }
        rest = skip_ws(&ext[name..]);
        if let Some(value) = rest.strip_prefix(b"=") {
            let value = skip_ws(value);
            let len = if value.first() == Some(&b'"') {
                quoted_len(value)?
            } else {
                token_len(value)
            };
            if len == 0 {
                return None;
            }
            rest = skip_ws(&value[len..]);
        }
    }
    rest.is_empty().then_some(size)
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    &s[n..]
}

/// RFC 9110 section 5.6.2: tchar.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn token_len(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| is_tchar(b)).count()
}

/// The length of the quoted-string `s` starts with (RFC 9110 section
/// 5.6.4), if it is closed.
fn quoted_len(s: &[u8]) -> Option<usize> {
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                let next = *s.get(i + 1)?;
                if !(next == b'\t' || next == b' ' || (0x21..=0x7e).contains(&next) || next >= 0x80)
                {
                    return None;
                }
                i += 2;
            }
            b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => i += 1,
            _ => return None,
        }
    }
    None
}

/// Told when a connection's request framing is refused: the server answers
/// the request in progress itself (its upstream may have failed any way).
pub trait OnRefused {
    fn refused(&self);
}

impl OnRefused for () {
    fn refused(&self) {}
}

impl<R: OnRefused> OnRefused for std::sync::Arc<R> {
    fn refused(&self) {
        (**self).refused()
    }
}

/// A client stream whose request framing is read as hyper reads it: past a
/// malformed chunk line, reads fail with [`MalformedChunk`] and `notify`
/// is told.
#[derive(Debug)]
pub struct Guarded<T, R = ()> {
    inner: T,
    framing: RequestFraming,
    refused: bool,
    notify: R,
}

impl<T> Guarded<T> {
    pub fn new(inner: T, max_head: usize) -> Self {
        Self::with_notify(inner, max_head, ())
    }
}

impl<T, R> Guarded<T, R> {
    pub fn with_notify(inner: T, max_head: usize, notify: R) -> Self {
        Self {
            inner,
            framing: RequestFraming::new(max_head),
            refused: false,
            notify,
        }
    }

    pub fn into_inner(self) -> T {
        self.inner
    }
}

fn refused() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, MalformedChunk)
}

impl<T: AsyncRead + Unpin, R: OnRefused + Unpin> AsyncRead for Guarded<T, R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.refused {
            return Poll::Ready(Err(refused()));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        if let Err(keep) = this.framing.scan(&buf.filled()[before..]) {
            this.refused = true;
            this.notify.refused();
            buf.set_filled(before + keep);
            if keep == 0 {
                return Poll::Ready(Err(refused()));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin, R: Unpin> AsyncWrite for Guarded<T, R> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_HEAD: usize = 64 * 1024;

    /// Scans `input` whole, split in two at every point, and byte by byte;
    /// every way must agree. Returns the bytes handed on and the end
    /// state.
    fn scan_all(input: &[u8]) -> (usize, State) {
        let whole = {
            let mut f = RequestFraming::new(MAX_HEAD);
            let passed = match f.scan(input) {
                Ok(()) => input.len(),
                Err(n) => n,
            };
            (passed, f.state)
        };
        for cut in 0..=input.len() {
            let mut f = RequestFraming::new(MAX_HEAD);
            let passed = match f.scan(&input[..cut]) {
                Ok(()) => match f.scan(&input[cut..]) {
                    Ok(()) => input.len(),
                    Err(n) => cut + n,
                },
                Err(n) => n,
            };
            assert_eq!((passed, f.state), whole, "split at {cut} of {input:?}");
        }
        // Byte by byte.
        let mut f = RequestFraming::new(MAX_HEAD);
        let mut passed = input.len();
        for (i, b) in input.iter().enumerate() {
            if f.scan(std::slice::from_ref(b)).is_err() {
                passed = i;
                break;
            }
        }
        assert_eq!((passed, f.state), whole, "byte by byte: {input:?}");
        whole
    }

    #[test]
    fn well_formed_chunk_lines_are_read() {
        for (line, size) in [
            (&b"a\r"[..], 10),
            (b"0\r", 0),
            (b"FF\r", 255),
            (b"1;x\r", 1),
            (b"1;a=b\r", 1),
            (b"1 ; a = b ; c\r", 1),
            (b"1;a=\"\"\r", 1),
            (b"1;a=\"q \\\" ;\\\\ \t\"\r", 1),
            (b"1;a=\"\xc3\xa9\"\r", 1),
            (b"1 \r", 1),
            (b"ffffffffffffffff\r", u64::MAX),
        ] {
            assert_eq!(chunk_size_line(line), Some(size), "{line:?}");
        }
    }

    #[test]
    fn malformed_chunk_lines_are_refused() {
        for line in [
            &b"1;a=\"\r"[..],
            b"1;a=\"x\r",
            b"1;a=\"x\\\"\r",
            b"1;a=\"x\x00\"\r",
            b"1;a=\"x\\\x01\"\r",
            b"1;\r",
            b"1;a=\r",
            b"1;a b\r",
            b"1;a=b c\r",
            b"1;a=\"x\"y\r",
            b";a\r",
            b"\r",
            b"g\r",
            b"1",
            b"1x\r",
            b"1;a\x00\r",
            b"1\r\r",
            b"10000000000000000\r",
        ] {
            assert_eq!(chunk_size_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn a_quoted_string_across_the_line_end_stops_before_the_line_ends() {
        let input: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            1;a=\"\r\nX\r\n0\r\n\r\nGET /other HTTP/1.1\r\nHost: a\r\n\r\n\"\r\n";
        let lf = input.windows(3).position(|w| w == b"\"\r\n").unwrap() + 2;
        let (passed, state) = scan_all(input);
        assert_eq!(state, State::Refused);
        assert_eq!(passed, lf, "handed on up to the line's LF, not past it");
    }

    #[test]
    fn pipelined_requests_of_every_framing_are_read_to_the_end() {
        let input: &[u8] = b"\
            POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
            5;name=\"v;1\"\r\nhello\r\n3\r\n\r\n;\r\n0\r\nTrailer: x\r\n\r\n\
            PUT /b HTTP/1.1\r\nHost: a\r\nContent-Length: 7, 7\r\n\r\n0\r\n\"\r\n;\n\
            GET /c HTTP/1.1\r\nHost: a\r\n\r\n\
            POST /d HTTP/1.1\r\nHost: a\r\ntransfer-encoding: CHUNKED\r\nContent-Length: 3\r\n\r\n\
            0\r\n\r\n";
        assert_eq!(scan_all(input), (input.len(), State::Head));
        // And a malformed line after all of them is still caught.
        let mut bad = input.to_vec();
        bad.extend_from_slice(
            b"POST /e HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;a=\"\r\n",
        );
        assert_eq!(scan_all(&bad), (bad.len() - 1, State::Refused));
    }

    #[test]
    fn trailer_lines_end_with_crlf_only() {
        // hyper reads `T: x<LF><CR><LF>PUT ...<CR><LF><CR><LF>` as trailers to
        // the blank line after PUT's head; a lenient reader ends the
        // trailers at the first CRLF and sees PUT as a request.
        let input: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            0\r\nT: x\n\r\nPUT /b HTTP/1.1\r\nHost: a\r\n\r\n";
        let at = input.windows(2).position(|w| w == b"x\n").unwrap() + 1;
        assert_eq!(scan_all(input), (at, State::Refused));
        let input: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            0\r\nT: x\rY\r\n\r\n";
        let at = input.windows(2).position(|w| w == b"\rY").unwrap() + 1;
        assert_eq!(scan_all(input), (at, State::Refused));
        let input: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            0\r\nT: x\r\nU: y\r\n\r\n";
        assert_eq!(scan_all(input), (input.len(), State::Head));
    }

    #[test]
    fn chunk_data_must_end_with_crlf() {
        let input = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nXY\r\n";
        let at = input.len() - 3;
        assert_eq!(scan_all(input), (at, State::Refused));
    }

    #[test]
    fn framing_hyper_refuses_or_leaves_http_is_not_read() {
        for input in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n1;a=\"\r\n"[..],
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n1;a=\"\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n1;a=\"\r\n",
            b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;a=\"\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection close\r\n\r\n",
        ] {
            assert_eq!(scan_all(input), (input.len(), State::Off), "{input:?}");
        }
    }

    #[test]
    fn a_head_past_the_bound_is_left_to_hyper_and_frees_its_buffer() {
        let mut f = RequestFraming::new(32);
        assert_eq!(f.scan(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(()));
        assert_eq!(f.scan(b"X-Long: 0123456789\r\n"), Ok(()));
        assert_eq!(f.state, State::Off);
        assert_eq!(f.buf.capacity(), 0);
    }

    #[test]
    fn a_chunk_line_past_the_bound_is_refused() {
        let mut input =
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1".to_vec();
        let mut f = RequestFraming::new(MAX_HEAD);
        assert_eq!(f.scan(&input), Ok(()));
        input.clear();
        input.extend(std::iter::repeat_n(b';', MAX_CHUNK_LINE));
        assert!(f.scan(&input).is_err());
        assert_eq!(f.state, State::Refused);
    }

    #[tokio::test]
    async fn a_guarded_stream_fails_reads_past_a_malformed_line() {
        use tokio::io::AsyncReadExt;
        let input: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            1;a=\"\r\nX\r\n0\r\n\r\n";
        let mut g = Guarded::new(input, MAX_HEAD);
        let mut got = Vec::new();
        let e = g.read_to_end(&mut got).await.expect_err("refused");
        assert!(MalformedChunk::caused(&e), "{e}");
        assert!(
            got.ends_with(b"1;a=\"\r"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(g.read(&mut [0; 8]).await.is_err(), "stays refused");
    }
}
