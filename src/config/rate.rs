//! `RateLimitInterval` and `RateLimitBurst`: each source's share of the
//! drains (see `crate::drain::limit`). Live: a reload stores them in the
//! drains' one [`RateLimits`](crate::drain::RateLimits) word.

use super::{duration_text, ConfigError};
use std::time::Duration;

/// journald's defaults (`RateLimitIntervalSec=30s`, `RateLimitBurst=10000`).
pub const RATE_LIMIT_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
pub const RATE_LIMIT_BURST_DEFAULT: u64 = 10_000;
/// The longest window (a day) and the largest burst.
const INTERVAL_MAX: Duration = Duration::from_secs(86_400);
const BURST_MAX: u64 = 1 << 31;

/// The rate limit as checked; either 0 turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RateLimit {
    #[serde(serialize_with = "as_text")]
    pub interval: Duration,
    pub burst: u64,
}

impl RateLimit {
    /// Checks the file's values (unset: the defaults).
    pub fn from_file(interval: Option<&str>, burst: Option<i64>) -> Result<Self, ConfigError> {
        let interval = match interval.map(str::trim) {
            None => RATE_LIMIT_INTERVAL_DEFAULT,
            Some("0") => Duration::ZERO,
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if d <= INTERVAL_MAX && (d.is_zero() || d.as_millis() > 0) => d,
                _ => {
                    return Err(ConfigError::Range {
                        key: "RateLimitInterval",
                        value: format!("{text:?}"),
                        allowed: "\"0\" (off) or a duration from \"1ms\" to \"1d\", such as \
                                  \"30s\""
                            .to_string(),
                    })
                }
            },
        };
        let burst = match burst {
            None => RATE_LIMIT_BURST_DEFAULT,
            Some(b) if (0..=BURST_MAX as i64).contains(&b) => b as u64,
            Some(b) => {
                return Err(ConfigError::Range {
                    key: "RateLimitBurst",
                    value: b.to_string(),
                    allowed: format!("0 (off) or 1..={BURST_MAX}"),
                })
            }
        };
        Ok(RateLimit { interval, burst })
    }

    /// The window in ms and the burst, as the drains take them.
    pub fn as_ms_and_burst(&self) -> (u64, u64) {
        (self.interval.as_millis() as u64, self.burst)
    }
}

fn as_text<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    if d.is_zero() {
        s.serialize_str("0")
    } else {
        s.serialize_str(&duration_text(*d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_off_and_bad_values() {
        let d = RateLimit::from_file(None, None).unwrap();
        assert_eq!(d.as_ms_and_burst(), (30_000, 10_000));
        let off = RateLimit::from_file(Some("0"), Some(5)).unwrap();
        assert_eq!(off.as_ms_and_burst(), (0, 5));
        assert_eq!(
            RateLimit::from_file(Some("10s"), Some(0))
                .unwrap()
                .as_ms_and_burst(),
            (10_000, 0)
        );
        let e = RateLimit::from_file(Some("soon"), None).unwrap_err();
        assert!(
            e.to_string().contains("RateLimitInterval = \"soon\""),
            "{e}"
        );
        let e = RateLimit::from_file(None, Some(-1)).unwrap_err();
        assert!(e.to_string().contains("RateLimitBurst = -1"), "{e}");
    }
}
