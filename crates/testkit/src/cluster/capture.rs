//! What the wire between pods carries: tcpdump on the node's bridge (every pod's
//! traffic is routed through it), written to a pcap file and read back as TCP
//! segments. Needs tcpdump.

use std::io::{self, BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::node::{Node, BRIDGE};

/// How long tcpdump may take to say it listens.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many bytes of a pcap file are read back.
pub const MAX_CAPTURE_BYTES: u64 = 256 << 20;

/// One TCP segment with a payload, or a connection's opening SYN, as seen on
/// the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// A SYN without ACK: the client opening the connection.
    pub opens: bool,
    pub payload: Vec<u8>,
}

/// A running capture; [`Capture::stop`] ends it and reads what it saw. Dropped
/// unstopped, tcpdump is killed.
pub struct Capture {
    child: Child,
    path: PathBuf,
}

impl Capture {
    /// Starts tcpdump on `node`'s bridge with the BPF `filter`, writing to
    /// `path`; returns once it listens.
    pub fn start(node: &Node, filter: &str, path: &Path) -> io::Result<Capture> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", node.netns(), "tcpdump", "-i", BRIDGE])
            // Unbuffered, whole packets, no name lookups, and no dropping
            // to the tcpdump user (the file is in a root-owned directory).
            .args(["-U", "-s", "0", "-n", "-Z", "root", "-w"])
            .arg(path)
            .arg(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().expect("piped stderr");
        // tcpdump says "listening on IFACE" once its socket is bound; read it
        // on a thread so that a silent tcpdump cannot hang the caller.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(Ok(()));
                    // Keep draining, so that tcpdump never blocks on stderr.
                    continue;
                }
                said.push_str(&line);
                said.push('\n');
            }
            let _ = tx.send(Err(said));
        });
        let mut capture = Capture {
            child,
            path: path.to_path_buf(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => Ok(capture),
            Ok(Err(said)) => {
                capture.kill();
                Err(io::Error::other(format!("tcpdump exited: {said}")))
            }
            Err(_) => {
                capture.kill();
                Err(io::Error::other("tcpdump did not start listening in 10s"))
            }
        }
    }

    /// Ends the capture (tcpdump flushes on SIGTERM) and returns its segments.
    pub fn stop(mut self) -> io::Result<Vec<Segment>> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut bytes = Vec::new();
        use std::io::Read;
        std::fs::File::open(&self.path)?
            .take(MAX_CAPTURE_BYTES)
            .read_to_end(&mut bytes)?;
        parse_pcap(&bytes).map_err(io::Error::other)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// The TCP segments with a payload, and the opening SYNs, of a classic pcap file of Ethernet frames
/// (what tcpdump writes for a bridge); a truncated last record is ignored,
/// as a capture stopped mid-write leaves one.
pub fn parse_pcap(bytes: &[u8]) -> Result<Vec<Segment>, String> {
    let header = bytes.get(..24).ok_or("shorter than a pcap header")?;
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let little = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        other => return Err(format!("not a pcap file (magic {other:#x})")),
    };
    let u32_at = |b: &[u8], at: usize| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if little {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let link_type = u32_at(header, 20) & 0xffff;
    if link_type != 1 {
        return Err(format!("link type {link_type}, not Ethernet"));
    }
    let mut segments = Vec::new();
    let mut at = 24;
    while let Some(record) = bytes.get(at..at + 16) {
        let captured = u32_at(record, 8) as usize;
        let Some(frame) = bytes.get(at + 16..at + 16 + captured) else {
            break;
        };
        at += 16 + captured;
        if let Some(segment) = tcp_segment(frame) {
            segments.push(segment);
        }
    }
    Ok(segments)
}

/// The TCP segment of an Ethernet frame carrying IPv4, if it has a payload
/// or opens a connection.
fn tcp_segment(frame: &[u8]) -> Option<Segment> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype != 0x0800 {
        return None;
    }
    let ip = frame.get(14..)?;
    let header_len = usize::from(ip.first()? & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    if *ip.get(9)? != 6 || header_len < 20 || total_len < header_len {
        return None;
    }
    let src_ip = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst_ip = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let tcp = ip.get(header_len..total_len.min(ip.len()))?;
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    let flags = *tcp.get(13)?;
    let opens = flags & 0x02 != 0 && flags & 0x10 == 0;
    let payload = tcp.get(data_offset..)?;
    if payload.is_empty() && !opens {
        return None;
    }
    Some(Segment {
        src: SocketAddrV4::new(src_ip, u16::from_be_bytes([tcp[0], tcp[1]])),
        dst: SocketAddrV4::new(dst_ip, u16::from_be_bytes([tcp[2], tcp[3]])),
        opens,
        payload: payload.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(src: [u8; 4], dst: [u8; 4], ports: (u16, u16), payload: &[u8]) -> Vec<u8> {
        flagged(src, dst, ports, 0x18, payload)
    }

    fn flagged(
        src: [u8; 4],
        dst: [u8; 4],
        ports: (u16, u16),
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let total = 20 + 20 + payload.len();
        let mut ip = vec![
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0,
            0,
            64,
            6,
            0,
            0,
        ];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        f.extend_from_slice(&ip);
        let mut tcp = vec![0u8; 20];
        tcp[..2].copy_from_slice(&ports.0.to_be_bytes());
        tcp[2..4].copy_from_slice(&ports.1.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        f.extend_from_slice(&tcp);
        f.extend_from_slice(payload);
        f
    }

    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        out.extend_from_slice(&[2, 0, 4, 0]);
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        for f in frames {
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            out.extend_from_slice(f);
        }
        out
    }

    #[test]
    fn segments_with_payloads_and_syns_are_read_and_bare_acks_skipped() {
        let (a, b) = ([10, 0, 0, 2], [10, 0, 0, 3]);
        let bytes = pcap(&[
            flagged(a, b, (40000, 8080), 0x02, b""),
            flagged(b, a, (8080, 40000), 0x12, b""),
            flagged(a, b, (40000, 8080), 0x10, b""),
            frame(a, b, (40000, 8080), b"\x16\x03\x01hello"),
        ]);
        let segments = parse_pcap(&bytes).unwrap();
        let (client, server) = (
            "10.0.0.2:40000".parse().unwrap(),
            "10.0.0.3:8080".parse().unwrap(),
        );
        assert_eq!(
            segments,
            vec![
                Segment {
                    src: client,
                    dst: server,
                    opens: true,
                    payload: vec![]
                },
                Segment {
                    src: client,
                    dst: server,
                    opens: false,
                    payload: b"\x16\x03\x01hello".to_vec(),
                },
            ]
        );
    }

    #[test]
    fn a_truncated_record_ends_the_file_and_garbage_is_an_error() {
        let mut bytes = pcap(&[frame([10, 0, 0, 2], [10, 0, 0, 3], (1, 2), b"GET /")]);
        let whole = parse_pcap(&bytes).unwrap().len();
        bytes.truncate(bytes.len() - 3);
        assert_eq!((whole, parse_pcap(&bytes).unwrap().len()), (1, 0));
        assert!(parse_pcap(b"not a capture at all, nothing here").is_err());
        assert!(parse_pcap(b"short").is_err());
        // A frame claiming more IP bytes than it has is cut to what it has.
        let mut f = frame([10, 0, 0, 2], [10, 0, 0, 3], (1, 2), b"abc");
        f[16] = 0xff;
        assert_eq!(parse_pcap(&pcap(&[f])).unwrap()[0].payload, b"abc");
    }
}
