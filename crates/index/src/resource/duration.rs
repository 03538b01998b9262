//! The two duration grammars policy objects use.

use super::InvalidObject;
use std::time::Duration;

/// Longest duration any policy object may name: a day. Larger values are
/// more likely typos than intent, and bounded values cannot overflow timers.
pub const MAX_POLICY_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Gateway API's `Duration` (GEP-2257): one to four `<number><unit>` parts,
/// units `h`, `m`, `s`, `ms`, e.g. `1h30m`, `500ms`, `0s`.
pub fn parse_gateway_duration(field: &str, s: &str) -> Result<Duration, InvalidObject> {
    parse(field, s, 4, false)
}

/// Linkerd's annotation durations: one `<number><unit>` part with units `ms`,
/// `s`, `m`, `h`, `d` (e.g. `10s`), or a Gateway-style sequence.
pub fn parse_annotation_duration(field: &str, s: &str) -> Result<Duration, InvalidObject> {
    parse(field, s.trim(), 4, true)
}

fn parse(field: &str, s: &str, max_parts: usize, days: bool) -> Result<Duration, InvalidObject> {
    let bad = || {
        let mut shown = s.to_string();
        super::truncate(&mut shown, 40);
        InvalidObject::invalid(
            field,
            format!("{shown:?} is not a duration like 500ms, 10s or 1m30s"),
        )
    };
    if s.is_empty() {
        return Err(bad());
    }
    let mut rest = s;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        parts += 1;
        if parts > max_parts {
            return Err(bad());
        }
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if days && rest.starts_with('d') {
            (Duration::from_secs(86400), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total = unit
            .checked_mul(u32::try_from(n).map_err(|_| bad())?)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
    }
    if total > MAX_POLICY_DURATION {
        return Err(InvalidObject::invalid(
            field,
            format!("{s:?} is longer than the 24h a policy duration may be"),
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_by_both_grammars() {
        let ok = [
            ("500ms", 500),
            ("10s", 10_000),
            ("1m30s", 90_000),
            ("1h", 3_600_000),
            ("0s", 0),
        ];
        for (s, ms) in ok {
            assert_eq!(
                parse_gateway_duration("f", s).unwrap().as_millis(),
                ms,
                "{s}"
            );
            assert_eq!(
                parse_annotation_duration("f", s).unwrap().as_millis(),
                ms,
                "{s}"
            );
        }
        assert_eq!(
            parse_annotation_duration("f", "1d").unwrap().as_secs(),
            86400
        );
        for s in [
            "",
            "10",
            "s",
            "1.5s",
            "-1s",
            "1x",
            "999999s",
            "1d",
            "2d",
            "1h1h1h1h1h",
        ] {
            assert!(parse_gateway_duration("f", s).is_err(), "{s}");
        }
        assert!(parse_annotation_duration("f", "2d").is_err());
        assert_eq!(
            parse_gateway_duration("spec.x", "soon").unwrap_err().field,
            "spec.x"
        );
    }
}
