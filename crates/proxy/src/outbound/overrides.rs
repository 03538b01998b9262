//! Linkerd's `l5d-*` request headers that change a rule's retries and
//! timeouts for one request, honoured only on rules that allow them
//! (`allow_l5d_request_headers`), and removed from the request either way
//! they are read:
//!
//! - `l5d-retry-limit: N`, `l5d-retry-timeout: DURATION`,
//!   `l5d-retry-http: 5xx,gateway-error,429,500-504`,
//!   `l5d-retry-grpc: cancelled,deadline-exceeded,internal,resource-exhausted,unavailable`;
//! - `l5d-timeout` / `l5d-request-timeout: DURATION` (the whole request),
//!   `l5d-response-timeout: DURATION`.
//!
//! Durations are `0`, or a number with `ms`, `s`, `m`, `h` or `d`.

use super::policy::{RetryBackoff, RetryPolicy, Timeouts, MAX_POLICY_DURATION, MAX_RETRIES};
use http::HeaderMap;
use std::time::Duration;

/// Linkerd's retry when only headers ask for one: body kept up to 64 KiB,
/// 25 ms .. 250 ms between tries, fully jittered.
const HEADER_RETRY_BODY_BYTES: usize = 64 * 1024;
const HEADER_RETRY_BACKOFF: RetryBackoff = RetryBackoff {
    min: Duration::from_millis(25),
    max: Duration::from_millis(250),
    jitter: 1.0,
};

/// The retry and timeouts of one request: the rule's, changed by the
/// request's headers where the rule allows.
pub fn apply(
    allowed: bool,
    retry: Option<&RetryPolicy>,
    timeouts: Timeouts,
    headers: &mut HeaderMap,
) -> (Option<RetryPolicy>, Timeouts) {
    if !allowed {
        return (retry.cloned(), timeouts);
    }
    let mut take = |name: &str| {
        headers
            .remove(name)
            .and_then(|v| v.to_str().ok().map(str::to_owned))
    };
    let http = take("l5d-retry-http").map(|v| http_conditions(&v));
    let grpc = take("l5d-retry-grpc").map(|v| grpc_conditions(&v));
    let limit = take("l5d-retry-limit")
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map(|n| n.min(MAX_RETRIES));
    let retry_timeout = take("l5d-retry-timeout").and_then(|v| duration(&v));
    let request = take("l5d-timeout")
        .into_iter()
        .chain(take("l5d-request-timeout"))
        .filter_map(|v| duration(&v))
        .next_back();
    let response = take("l5d-response-timeout").and_then(|v| duration(&v));

    let retry = match retry {
        Some(r) => Some(RetryPolicy {
            max_retries: limit.unwrap_or(r.max_retries),
            statuses: http.unwrap_or_else(|| r.statuses.clone()),
            grpc_codes: grpc.unwrap_or_else(|| r.grpc_codes.clone()),
            timeout: retry_timeout.or(r.timeout),
            ..r.clone()
        }),
        None if http.is_none() && grpc.is_none() && limit.is_none() && retry_timeout.is_none() => {
            None
        }
        None => Some(RetryPolicy {
            max_retries: limit.unwrap_or(1),
            max_request_bytes: HEADER_RETRY_BODY_BYTES,
            statuses: http.unwrap_or_default(),
            grpc_codes: grpc.unwrap_or_default(),
            timeout: retry_timeout,
            backoff: Some(HEADER_RETRY_BACKOFF),
        }),
    };
    let timeouts = Timeouts {
        request: request.or(timeouts.request),
        response: response.or(timeouts.response),
        idle: timeouts.idle,
    };
    (retry, timeouts)
}

/// `5xx`, `gateway-error`, `429`, `500-504`, comma-separated; others skipped.
fn http_conditions(s: &str) -> Vec<(u16, u16)> {
    let code = |s: &str| {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|c| (100..600).contains(c))
    };
    s.split(',')
        .filter_map(|c| {
            let c = c.trim();
            if c.eq_ignore_ascii_case("5xx") {
                return Some((500, 599));
            }
            if c.eq_ignore_ascii_case("gateway-error") {
                return Some((502, 504));
            }
            if let Some(n) = code(c) {
                return Some((n, n));
            }
            let (a, b) = c.split_once('-')?;
            let (a, b) = (code(a)?, code(b)?);
            (a <= b).then_some((a, b))
        })
        .collect()
}

fn grpc_conditions(s: &str) -> Vec<u32> {
    s.split(',')
        .filter_map(|c| {
            Some(match c.trim().to_ascii_lowercase().as_str() {
                "cancelled" => 1,
                "deadline-exceeded" => 4,
                "resource-exhausted" => 8,
                "internal" => 13,
                "unavailable" => 14,
                _ => return None,
            })
        })
        .collect()
}

/// `0`, or a whole number with a unit; bounded like policy durations.
fn duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let ms: u64 = match unit {
        "" if n == 0 => 0,
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    let d = Duration::from_millis(n.checked_mul(ms)?).min(MAX_POLICY_DURATION);
    (!d.is_zero()).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn headers_change_a_rule_only_where_it_allows_and_are_removed() {
        let mut h = headers(&[("l5d-retry-limit", "3"), ("l5d-timeout", "2s")]);
        let (retry, timeouts) = apply(false, None, Timeouts::default(), &mut h);
        assert!(retry.is_none());
        assert_eq!(timeouts, Timeouts::default());
        assert_eq!(h.len(), 2, "left alone where not allowed");

        let (retry, timeouts) = apply(true, None, Timeouts::default(), &mut h);
        assert!(h.is_empty(), "read and removed");
        let retry = retry.expect("asked for");
        assert_eq!(retry.max_retries, 3);
        assert_eq!(retry.max_request_bytes, HEADER_RETRY_BODY_BYTES);
        assert_eq!(timeouts.request, Some(Duration::from_secs(2)));

        let rule = RetryPolicy {
            max_retries: 1,
            max_request_bytes: 10,
            statuses: vec![(503, 503)],
            grpc_codes: vec![],
            timeout: None,
            backoff: None,
        };
        let mut h = headers(&[
            ("l5d-retry-http", "5xx, 429,bogus,400-300"),
            ("l5d-retry-grpc", "unavailable,nope"),
            ("l5d-retry-timeout", "250ms"),
            ("l5d-response-timeout", "1m"),
        ]);
        let (retry, timeouts) = apply(true, Some(&rule), Timeouts::default(), &mut h);
        let retry = retry.expect("the rule's");
        assert_eq!(retry.statuses, [(500, 599), (429, 429)]);
        assert_eq!(retry.grpc_codes, [14]);
        assert_eq!(retry.max_retries, 1, "the rule's limit stays");
        assert_eq!(retry.max_request_bytes, 10);
        assert_eq!(retry.timeout, Some(Duration::from_millis(250)));
        assert_eq!(timeouts.response, Some(Duration::from_secs(60)));
    }

    #[test]
    fn durations_read_as_linkerd_reads_them() {
        assert_eq!(duration("150ms"), Some(Duration::from_millis(150)));
        assert_eq!(duration(" 2h "), Some(Duration::from_secs(7200)));
        assert_eq!(duration("0"), None);
        assert_eq!(duration("10"), None, "a unit is required");
        assert_eq!(duration("1.5s"), None);
        assert_eq!(duration("99999999999999999999d"), None);
        assert_eq!(duration("9999999d"), Some(MAX_POLICY_DURATION));
    }
}
