//! Parsers of the values annotations and flags carry: ports and port
//! ranges, Kubernetes quantities, log filters. Each says what is wrong.

use std::fmt;

/// Why a value is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(String);

impl InvalidValue {
    pub fn new(why: impl Into<String>) -> Self {
        Self(why.into())
    }
}

/// Ports one opaque-ports range may expand to: the proxy takes single
/// ports, and a range like `1-65535` would make an argument of 380 KB.
pub const MAX_EXPANDED_PORTS: usize = 1024;

/// `LOW-HIGH` (or one port, `LOW == HIGH`), ports 1-65535.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

fn port(s: &str) -> Result<u16, InvalidValue> {
    match s.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(InvalidValue(format!("{s:?} is not a port (1-65535)"))),
    }
}

/// Comma-separated ports and `LOW-HIGH` ranges (blank items are skipped,
/// as Linkerd does).
pub fn parse_port_ranges(s: &str) -> Result<Vec<PortRange>, InvalidValue> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (low, high) = match item.split_once('-') {
                Some((low, high)) => (port(low)?, port(high)?),
                None => {
                    let p = port(item)?;
                    (p, p)
                }
            };
            if low > high {
                return Err(InvalidValue(format!("port range {item:?} runs backwards")));
            }
            Ok(PortRange { low, high })
        })
        .collect()
}

/// The single ports of `ranges`, in order, without repeats; at most
/// [`MAX_EXPANDED_PORTS`].
pub fn expand_port_ranges(ranges: &[PortRange]) -> Result<Vec<u16>, InvalidValue> {
    let mut ports = Vec::new();
    for range in ranges {
        for p in range.low..=range.high {
            if !ports.contains(&p) {
                if ports.len() == MAX_EXPANDED_PORTS {
                    return Err(InvalidValue(format!(
                        "more than {MAX_EXPANDED_PORTS} ports (range {range})"
                    )));
                }
                ports.push(p);
            }
        }
    }
    Ok(ports)
}

/// A Kubernetes resource quantity (`100m`, `16Mi`, `1.5`, `2e3`), checked
/// as the API server does: a non-negative decimal number and one suffix.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantity {
    /// The value in base units (cores for CPU, bytes for memory).
    pub value: f64,
}

pub fn parse_quantity(s: &str) -> Result<Quantity, InvalidValue> {
    let bad = |why: &str| {
        InvalidValue(format!(
            "{s:?} is not a Kubernetes quantity ({why}; e.g. 100m, 1.5, 64Mi, 1G)"
        ))
    };
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() || number.contains('+') || number.matches('.').count() > 1 || number == "."
    {
        return Err(bad("no number"));
    }
    let base: f64 = number.parse().map_err(|_| bad("no number"))?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("bad exponent"));
            }
            let e: i32 = digits.parse().map_err(|_| bad("bad exponent"))?;
            10f64.powi(e)
        }
        _ => return Err(bad("unknown suffix")),
    };
    Ok(Quantity {
        value: base * scale,
    })
}

/// Levels of tracing's `Targets` filter, the syntax of the proxy's `BALLAST_LOG`.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A log filter: comma-separated `LEVEL` or `TARGET=LEVEL` (e.g.
/// `warn,ballast=debug`), as the proxy's `BALLAST_LOG` takes.
pub fn check_log_level(s: &str) -> Result<(), InvalidValue> {
    if s.trim().is_empty() {
        return Err(InvalidValue("the log filter is empty".into()));
    }
    for directive in s.split(',').map(str::trim) {
        let (target, level) = directive.rsplit_once('=').unwrap_or(("", directive));
        let target_ok = target
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'));
        if !target_ok || !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(InvalidValue(format!(
                "{directive:?} in {s:?} is not LEVEL or TARGET=LEVEL (levels: {})",
                LEVELS.join(", ")
            )));
        }
    }
    Ok(())
}

/// A uid: a non-negative integer.
pub fn parse_uid(s: &str) -> Result<u32, InvalidValue> {
    s.trim()
        .parse()
        .map_err(|_| InvalidValue(format!("{s:?} is not a user id (0-4294967295)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_and_bad_ones_are_named() {
        let r = parse_port_ranges("25, 4000-4100,,8080").unwrap();
        assert_eq!(
            r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["25", "4000-4100", "8080"]
        );
        for bad in ["0", "70000", "abc", "10-5", "1-", "-3"] {
            let e = parse_port_ranges(bad).expect_err(bad).to_string();
            assert!(e.contains('"'), "{bad}: {e}");
        }
        assert_eq!(
            expand_port_ranges(&parse_port_ranges("3-5,4,9").unwrap()).unwrap(),
            [3, 4, 5, 9]
        );
        assert!(expand_port_ranges(&parse_port_ranges("1-65535").unwrap()).is_err());
    }

    #[test]
    fn quantities_follow_kubernetes() {
        for (s, v) in [
            ("100m", 0.1),
            ("1", 1.0),
            ("1.5", 1.5),
            ("16Mi", 16.0 * 1024.0 * 1024.0),
            ("1G", 1e9),
            ("2e3", 2000.0),
            ("+.5", 0.5),
        ] {
            let q = parse_quantity(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert!((q.value - v).abs() < 1e-9 * v.max(1.0), "{s}: {}", q.value);
        }
        for bad in ["", "abc", "-1", "1.2.3", "10MB", "1e", "m", "1 Gi", "."] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn log_filters_are_levels_and_targets() {
        for ok in [
            "info",
            "warn,ballast=debug",
            "WARN",
            "ballast_proxy::outbound=trace",
        ] {
            check_log_level(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "loud", "ballast=loud", "info,{x}"] {
            assert!(check_log_level(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_uid("2102").unwrap(), 2102);
        assert!(parse_uid("-1").is_err());
    }
}
