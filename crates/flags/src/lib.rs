//! Duration and byte-size flag values, parsed the same way by every Ballast
//! command and checked against a range chosen for what each flag means, so
//! that no configured value can overflow later (a timeout added to
//! `Instant::now()`, a buffer size handed to hyper) and panic the process.
//!
//! Ports, port lists, DNS names and `HOST:PORT` authorities ([`port_list`],
//! [`dns_name`], [`dns_label`], [`host_port`]...) are checked the same way, so
//! a value that cannot mean what its flag says never starts a process.
//!
//! The parsers are clap value parsers: a value out of range is refused at
//! start by clap (exit code 2) with a message naming the flag, the value and
//! the allowed range.
//!
//! ```
//! use std::time::Duration;
//! use ballast_flags::{bytes, duration};
//!
//! #[derive(clap::Parser)]
//! struct Cli {
//!     #[arg(long, default_value = "3s", value_parser = duration(Duration::from_millis(1), ballast_flags::DAY))]
//!     timeout: Duration,
//!     #[arg(long, default_value = "64K", value_parser = bytes::<usize>(8 * 1024, 16 * 1024 * 1024))]
//!     buffer: usize,
//! }
//! ```

#![forbid(unsafe_code)]

mod net;
mod usage;

pub use net::{dns_label, dns_name, dns_name_or_empty, host_port, non_empty, port, port_list};
pub use usage::{ordered, UsageError};

use clap::{builder::TypedValueParser, error::ErrorKind};
use std::{ffi::OsStr, fmt, marker::PhantomData, time::Duration};

/// One day, the longest timeout any flag takes.
pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// One hour.
pub const HOUR: Duration = Duration::from_secs(60 * 60);
/// One millisecond, the shortest timeout any flag takes (timers are
/// millisecond-grained).
pub const MILLISECOND: Duration = Duration::from_millis(1);
/// Timeouts and waits: 1 ms to 1 day.
pub const TIMEOUT: DurationRange = duration(MILLISECOND, DAY);
/// Backoff delays and retry caps: 1 ms to 1 hour.
pub const BACKOFF: DurationRange = duration(MILLISECOND, HOUR);
/// Shutdown grace periods: 0 (exit at once) to 1 day.
pub const GRACE: DurationRange = duration(Duration::ZERO, DAY);

/// 1024 bytes.
pub const KIB: u64 = 1 << 10;
/// 1024 KiB.
pub const MIB: u64 = 1 << 20;
/// 1024 MiB.
pub const GIB: u64 = 1 << 30;

/// Why a flag value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueError {
    /// Not a duration at all.
    NotADuration,
    /// Not a byte count at all.
    NotABytes,
    /// A unit the grammar does not have.
    UnknownUnit(String),
    /// Well-formed but outside the flag's range (text of the range).
    OutOfRange(String),
    /// Not a port (1 to 65535).
    NotAPort(String),
    /// An entry of a port list that is neither a port nor a range of ports.
    NotAPortRange(String),
    /// Not a DNS name, and why.
    NotADnsName { value: String, reason: &'static str },
    /// Not `HOST:PORT`, and why.
    NotAnAuthority { value: String, reason: String },
    /// Empty where a value is needed.
    Empty,
}

impl std::error::Error for ValueError {}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueError::NotADuration => {
                f.write_str("not a duration (a number and ms, s, m, h or d: 500ms, 5s, 2m)")
            }
            ValueError::NotABytes => f.write_str(
                "not a byte count (a number and K, M or G as powers of 1024: 65536, 64K, 1G)",
            ),
            ValueError::UnknownUnit(unit) => write!(f, "unknown unit {unit:?}"),
            ValueError::OutOfRange(range) => write!(f, "out of range: allowed {range}"),
            ValueError::NotAPort(text) => write!(f, "{text:?} is not a port (1 to 65535)"),
            ValueError::NotAPortRange(entry) => write!(
                f,
                "{entry:?} is not a port (1 to 65535) or a range of ports (LO-HI)"
            ),
            ValueError::NotADnsName { value, reason } => {
                write!(
                    f,
                    "{value:?} is not a DNS name (lower case RFC 1123): {reason}"
                )
            }
            ValueError::NotAnAuthority { value, reason } => {
                write!(f, "{value:?} is not HOST:PORT: {reason}")
            }
            ValueError::Empty => f.write_str("must not be empty"),
        }
    }
}

/// A duration flag's grammar: a decimal number and a unit (`ms`, `s`, `m`,
/// `h`, `d`); no unit means seconds. Not range-checked.
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    // Digits and dots only, so no sign, exponent, NaN or infinity gets here.
    let n: f64 = number.parse().map_err(|_| ValueError::NotADuration)?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => return Err(ValueError::UnknownUnit(other.to_string())),
    };
    // Past u64 seconds it cannot be a Duration: out of every range.
    Duration::try_from_secs_f64(n * scale)
        .map_err(|_| ValueError::OutOfRange(format!("far less than {s}")))
}

/// A size flag's grammar: a whole number and an optional unit (`K`, `M`,
/// `G`, as powers of 1024; `KiB`, `Ki`, `B` too). Not range-checked.
pub fn parse_bytes(s: &str) -> Result<u64, ValueError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(ValueError::NotABytes);
    }
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KI" | "KIB" => KIB,
        "M" | "MI" | "MIB" => MIB,
        "G" | "GI" | "GIB" => GIB,
        _ => return Err(ValueError::UnknownUnit(unit.trim().to_string())),
    };
    // Too many digits for u64 is well-formed but beyond every range.
    let too_large = || ValueError::OutOfRange(format!("far less than {s}"));
    digits
        .parse::<u64>()
        .map_err(|_| too_large())?
        .checked_mul(scale)
        .ok_or_else(too_large)
}

/// A duration in the largest unit that states it exactly (`1d`, `90s`, `1ms`).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        return "0s".to_string();
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{d:?}");
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A byte count in the largest unit that states it exactly (`16M`, `8K`),
/// with the count itself when that is not whole (`16777215`).
pub fn show_bytes(n: u64) -> String {
    for (unit, size) in [("G", GIB), ("M", MIB), ("K", KIB)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    n.to_string()
}

/// The value parser of a duration flag allowed from `min` to `max`
/// (inclusive).
pub const fn duration(min: Duration, max: Duration) -> DurationRange {
    DurationRange { min, max }
}

/// See [`duration`].
#[derive(Clone, Copy, Debug)]
pub struct DurationRange {
    min: Duration,
    max: Duration,
}

impl DurationRange {
    /// `s` parsed and checked against the range.
    pub fn parse(&self, s: &str) -> Result<Duration, ValueError> {
        let d = parse_duration(s).map_err(|e| match e {
            ValueError::OutOfRange(_) => self.out_of_range(),
            other => other,
        })?;
        if d < self.min || d > self.max {
            return Err(self.out_of_range());
        }
        Ok(d)
    }

    fn out_of_range(&self) -> ValueError {
        ValueError::OutOfRange(format!(
            "{} to {}",
            show_duration(self.min),
            show_duration(self.max)
        ))
    }
}

impl TypedValueParser for DurationRange {
    type Value = Duration;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Duration, clap::Error> {
        let text = value.to_string_lossy();
        self.parse(&text).map_err(|e| refusal(cmd, arg, &text, &e))
    }
}

/// The value parser of a byte-size flag of type `T`, allowed from `min` to
/// `max` bytes (inclusive); with [`ByteRange::or_zero`], 0 too.
pub const fn bytes<T>(min: u64, max: u64) -> ByteRange<T> {
    ByteRange {
        min,
        max,
        zero: false,
        value: PhantomData,
    }
}

/// See [`bytes`].
#[derive(Debug)]
pub struct ByteRange<T> {
    min: u64,
    max: u64,
    zero: bool,
    value: PhantomData<fn() -> T>,
}

// By hand: a derive would ask `T: Clone`, which the marker does not need.
impl<T> Clone for ByteRange<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ByteRange<T> {}

impl<T: TryFrom<u64>> ByteRange<T> {
    /// Also allows 0, for flags where 0 means "off".
    pub const fn or_zero(self) -> Self {
        ByteRange { zero: true, ..self }
    }

    /// `s` parsed and checked against the range.
    pub fn parse(&self, s: &str) -> Result<T, ValueError> {
        let n = parse_bytes(s).map_err(|e| match e {
            ValueError::OutOfRange(_) => self.out_of_range(),
            other => other,
        })?;
        let allowed = (n >= self.min && n <= self.max) || (self.zero && n == 0);
        if !allowed {
            return Err(self.out_of_range());
        }
        // A range wider than T is a mistake in the flag's declaration; it is
        // still refused, never truncated.
        T::try_from(n).map_err(|_| self.out_of_range())
    }

    fn out_of_range(&self) -> ValueError {
        let range = format!("{} to {}", show_bytes(self.min), show_bytes(self.max));
        ValueError::OutOfRange(if self.zero {
            format!("0 (off) or {range}")
        } else {
            range
        })
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for ByteRange<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        self.parse(&text).map_err(|e| refusal(cmd, arg, &text, &e))
    }
}

/// The most of anything a count flag takes (connections, series, endpoints,
/// targets): past a million, a bound stops bounding on a sidecar.
pub const MANY: u64 = 1_000_000;

/// A count of things, between `min` and `max`, refused at start outside.
pub fn count(min: u64, max: u64) -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::TypedValueParser;
    clap::value_parser!(u64)
        .range(min..=max)
        .map(|v| usize::try_from(v).unwrap_or(usize::MAX))
}

/// A fraction from 0 to 1 inclusive (a jitter, a rate); refuses NaN.
pub fn fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err("not a fraction: allowed 0 to 1".to_string()),
    }
}

/// clap's refusal, naming the flag, the value and the reason (with the range).
fn refusal(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &str,
    e: &ValueError,
) -> clap::Error {
    let flag = arg.map_or_else(|| "...".to_string(), ToString::to_string);
    let mut cmd = cmd.clone();
    clap::Error::raw(
        ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{flag}': {e}\n"),
    )
    .format(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_are_held_to_their_range() {
        let ms = Duration::from_millis;
        for (input, expected) in [
            ("1ms", Ok(ms(1))),
            ("500ms", Ok(ms(500))),
            ("1.5s", Ok(ms(1500))),
            ("3", Ok(ms(3000))),
            ("2m", Ok(ms(120_000))),
            ("1h", Ok(ms(3_600_000))),
            ("1d", Ok(DAY)),
            (" 10s ", Ok(ms(10_000))),
            ("0.5ms", Err("out of range: allowed 1ms to 1d")),
            ("0s", Err("out of range: allowed 1ms to 1d")),
            ("25h", Err("out of range: allowed 1ms to 1d")),
            ("86401s", Err("out of range: allowed 1ms to 1d")),
            (
                "18000000000000000000s",
                Err("out of range: allowed 1ms to 1d"),
            ),
            (
                "99999999999999999999999999d",
                Err("out of range: allowed 1ms to 1d"),
            ),
            ("-1s", Err("not a duration")),
            ("NaNs", Err("not a duration")),
            ("inf", Err("not a duration")),
            ("", Err("not a duration")),
            ("1..2s", Err("not a duration")),
            ("5 weeks", Err("unknown unit \"weeks\"")),
            ("5us", Err("unknown unit \"us\"")),
        ] {
            let got = TIMEOUT.parse(input).map_err(|e| e.to_string());
            match (got, expected) {
                (Ok(d), Ok(want)) => assert_eq!(d, want, "{input:?}"),
                (Err(e), Err(want)) => assert!(e.starts_with(want), "{input:?}: {e}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
        let grace = duration(Duration::ZERO, DAY);
        assert_eq!(grace.parse("0s"), Ok(Duration::ZERO));
        assert!(grace
            .parse("2d")
            .is_err_and(|e| e.to_string().contains("0s to 1d")));
        assert_eq!(show_duration(Duration::from_secs(90)), "90s");
        assert_eq!(show_duration(Duration::from_micros(1500)), "1.5ms");
    }

    #[test]
    fn byte_sizes_parse_and_are_held_to_their_range() {
        let buffer = bytes::<usize>(8 * KIB, 16 * MIB);
        for (input, expected) in [
            ("8192", Ok(8192)),
            ("8K", Ok(8192)),
            ("64KiB", Ok(65_536)),
            ("16M", Ok(16 << 20)),
            ("16mi", Ok(16 << 20)),
            ("8191", Err("out of range: allowed 8K to 16M")),
            ("17M", Err("out of range: allowed 8K to 16M")),
            ("0", Err("out of range: allowed 8K to 16M")),
            (
                "99999999999999999999999",
                Err("out of range: allowed 8K to 16M"),
            ),
            (
                "18446744073709551615G",
                Err("out of range: allowed 8K to 16M"),
            ),
            ("-1", Err("not a byte count")),
            ("K", Err("not a byte count")),
            ("", Err("not a byte count")),
            ("1.5M", Err("unknown unit \".5M\"")),
            ("4T", Err("unknown unit \"T\"")),
        ] {
            let got = buffer.parse(input).map_err(|e| e.to_string());
            match (got, expected) {
                (Ok(n), Ok(want)) => assert_eq!(n, want, "{input:?}"),
                (Err(e), Err(want)) => assert!(e.starts_with(want), "{input:?}: {e}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
        let frame = bytes::<u32>(16 * KIB, 16 * MIB - 1);
        assert_eq!(
            frame.parse("16M").map_err(|e| e.to_string()),
            Err("out of range: allowed 16K to 16777215".to_string())
        );
        let limit = bytes::<u64>(MIB, 1 << 40).or_zero();
        assert_eq!(limit.parse("0"), Ok(0));
        assert_eq!(limit.parse("1G"), Ok(GIB));
        assert!(limit
            .parse("1K")
            .is_err_and(|e| e.to_string().contains("0 (off) or 1M")));
        // A range wider than the type refuses rather than truncates.
        assert!(bytes::<u8>(0, 1000).parse("300").is_err());
    }

    #[test]
    fn fractions_are_zero_to_one() {
        assert_eq!(fraction("0.5"), Ok(0.5));
        assert_eq!(fraction("1"), Ok(1.0));
        for bad in ["NaN", "-0.1", "1.01", "inf", "half"] {
            assert!(fraction(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn clap_names_the_flag_the_value_and_the_range() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[arg(long, default_value = "3s", value_parser = TIMEOUT)]
            failfast: Duration,
        }
        use clap::Parser;
        let err =
            Cli::try_parse_from(["t", "--failfast", "18000000000000000000s"]).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        for needle in ["--failfast", "18000000000000000000s", "1ms to 1d"] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
        let cli = Cli::try_parse_from(["t"]).expect("the default is in range");
        assert_eq!(cli.failfast, Duration::from_secs(3));
    }
}
