//! Protocol detection: HTTP/1.x, HTTP/2 with prior knowledge, or opaque
//! bytes, from the first bytes a client sends. Pure, for unit tests and
//! fuzzing; the IO around it is in `io.rs`.

/// The HTTP/2 connection preface (RFC 9113, section 3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes read at most before deciding; an HTTP/1 request line longer than
/// this is treated as opaque.
pub const MAX_DETECT_BYTES: usize = 8 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    H2,
    Opaque,
}

/// What the bytes so far say: a protocol, or `None` when more are needed.
pub fn detect(buf: &[u8]) -> Option<Protocol> {
    let n = buf.len().min(H2_PREFACE.len());
    if buf[..n] == H2_PREFACE[..n] {
        return if n == H2_PREFACE.len() {
            Some(Protocol::H2)
        } else {
            None
        };
    }
    match buf.iter().position(|&b| b == b'\n') {
        Some(end) => Some(if is_http1_request_line(&buf[..end]) {
            Protocol::Http1
        } else {
            Protocol::Opaque
        }),
        None if buf.len() >= MAX_DETECT_BYTES => Some(Protocol::Opaque),
        // A request line is visible ASCII and spaces (a CR may end what has
        // arrived so far); anything else is not HTTP, however long we wait.
        // The same test as `is_http1_request_line`, so that how the bytes
        // were split into reads never changes the answer.
        None if !buf
            .iter()
            .take(32)
            .enumerate()
            .all(|(i, &b)| is_line_byte(b) || (b == b'\r' && i + 1 == buf.len())) =>
        {
            Some(Protocol::Opaque)
        }
        None => None,
    }
}

fn is_line_byte(b: u8) -> bool {
    b.is_ascii_graphic() || b == b' '
}

/// `METHOD SP TARGET SP HTTP/1.x [CR]`.
fn is_http1_request_line(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if !line.iter().all(|&b| is_line_byte(b)) {
        return false;
    }
    let Some(method_end) = line.iter().position(|&b| b == b' ') else {
        return false;
    };
    let method = &line[..method_end];
    if method.is_empty() || !method.iter().all(|b| b.is_ascii_alphabetic() || *b == b'-') {
        return false;
    }
    line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_by_table() {
        let cases: &[(&[u8], Option<Protocol>)] = &[
            (b"", None),
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Some(Protocol::Http1)),
            (b"POST /x?y=1 HTTP/1.0\r\n", Some(Protocol::Http1)),
            (b"M-SEARCH * HTTP/1.1\n", Some(Protocol::Http1)),
            (b"GET / HTT", None),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Some(Protocol::H2)),
            (
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00",
                Some(Protocol::H2),
            ),
            (b"PRI * HTTP/2", None),
            (b"\x16\x03\x01\x02\x00", Some(Protocol::Opaque)),
            (b"SSH-2.0-OpenSSH_9.2\r\n", Some(Protocol::Opaque)),
            (b"GET / HTTP/2.0\r\n", Some(Protocol::Opaque)),
            (b"hello world\n", Some(Protocol::Opaque)),
            (b"*1\r\n$4\r\nPING\r\n", Some(Protocol::Opaque)),
        ];
        for (bytes, want) in cases {
            assert_eq!(detect(bytes), *want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn how_the_first_line_is_split_into_reads_never_changes_the_answer() {
        for line in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"GET /\xe9 HTTP/1.1\r\n",
            b"GET /a\rb HTTP/1.1\r\n",
            b"GET / HTTP/1.1\n",
        ] {
            let whole = detect(line);
            for cut in 0..line.len() {
                if let Some(early) = detect(&line[..cut]) {
                    assert_eq!(
                        Some(early),
                        whole,
                        "{:?} cut at {cut}",
                        String::from_utf8_lossy(line)
                    );
                }
            }
        }
        assert_eq!(detect(b"GET / HTTP/1.1\r"), None);
        assert_eq!(detect(b"GET /\xe9 HTTP/1.1\r\n"), Some(Protocol::Opaque));
    }

    #[test]
    fn a_request_line_without_end_is_opaque_at_the_bound() {
        let mut long = b"GET /".to_vec();
        long.resize(MAX_DETECT_BYTES, b'a');
        assert_eq!(detect(&long), Some(Protocol::Opaque));
        assert_eq!(detect(&long[..100]), None);
    }
}
