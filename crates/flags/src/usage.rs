//! Flags that are each valid but not together (a minimum above its
//! maximum): refused at start as a usage error, as clap refuses one value
//! (exit code 2), naming both flags.

use std::fmt;

/// A combination of flag values that cannot work. The binaries exit with
/// code 2 on it, as on any other usage error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `min_flag`'s value must not exceed `max_flag`'s.
pub fn ordered<T: PartialOrd + fmt::Debug>(
    min_flag: &str,
    min: T,
    max_flag: &str,
    max: T,
) -> Result<(), UsageError> {
    if min > max {
        return Err(UsageError(format!(
            "{min_flag} ({min:?}) must not be more than {max_flag} ({max:?})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_minimum_above_its_maximum_names_both_flags() {
        assert!(ordered("--a-min", 1, "--a-max", 1).is_ok());
        let e = ordered(
            "--a-min",
            Duration::from_secs(20),
            "--a-max",
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--a-min (20s) must not be more than --a-max (10s)"
        );
    }
}
