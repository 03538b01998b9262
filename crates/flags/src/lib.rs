//! Flag values every Ballast command parses the same way.

#![forbid(unsafe_code)]

use std::time::Duration;

/// `500ms`, `5s`, `2m`.
pub fn humantime_secs(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 5s, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// `1048576`, `512K`, `64M`, `1G`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a byte count (e.g. 268435456, 256M, 1G)"))?;
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KI" | "KIB" => 1 << 10,
        "M" | "MI" | "MIB" => 1 << 20,
        "G" | "GI" | "GIB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} in {s:?} (use K, M or G)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}
