//! `RateLimitInterval`, `RateLimitBurst` and `RateLimitOverrides`: each
//! source's share of the drains (see `crate::drain::limit`). Live: the
//! daemon hands a reload's values to the drains.

use super::{duration_text, ConfigError};
use std::time::Duration;

/// journald's defaults (`RateLimitIntervalSec=30s`, `RateLimitBurst=10000`).
pub const RATE_LIMIT_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
pub const RATE_LIMIT_BURST_DEFAULT: u64 = 10_000;
/// The longest window (a day) and the largest burst.
const INTERVAL_MAX: Duration = Duration::from_secs(86_400);
const BURST_MAX: u64 = 1 << 31;
/// `RateLimitOverrides` entries at most (a drain scans them when a
/// source's window opens).
pub const OVERRIDES_MAX: usize = 256;

/// The rate limit as checked; either 0 turns it off.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RateLimit {
    #[serde(serialize_with = "as_text")]
    pub interval: Duration,
    pub burst: u64,
    /// `RateLimitOverrides`, in the file's order (the first that matches a
    /// source wins).
    pub overrides: Vec<RateLimitOverride>,
}

/// One `RateLimitOverrides` entry as written: one of `Provider`, `Unit`
/// or `Uid`, a `Burst`, and optionally an `Interval`.
#[derive(Debug, Default, Clone, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "PascalCase")]
pub struct OverrideFile {
    pub provider: Option<String>,
    pub unit: Option<String>,
    pub uid: Option<i64>,
    pub interval: Option<String>,
    pub burst: Option<i64>,
}

/// The sources an override is for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OverrideSource {
    /// Events whose provider is this.
    Provider(String),
    /// Senders in this systemd unit (eventd's trusted metadata).
    Unit(String),
    /// Events of this uid.
    Uid(u32),
}

/// One override, checked: its sources get this window and burst (either
/// 0: never limited) instead of the global ones.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RateLimitOverride {
    pub source: OverrideSource,
    #[serde(serialize_with = "as_text")]
    pub interval: Duration,
    pub burst: u64,
}

impl RateLimit {
    /// Checks the file's values (unset: the defaults; no overrides).
    pub fn from_file(interval: Option<&str>, burst: Option<i64>) -> Result<Self, ConfigError> {
        let range = |key, value: String, allowed| ConfigError::Range {
            key,
            value,
            allowed,
        };
        Ok(RateLimit {
            interval: interval_value(interval)
                .map_err(|a| {
                    range(
                        "RateLimitInterval",
                        format!("{:?}", interval.unwrap_or("")),
                        a,
                    )
                })?
                .unwrap_or(RATE_LIMIT_INTERVAL_DEFAULT),
            burst: burst_value(burst)
                .map_err(|a| range("RateLimitBurst", format!("{}", burst.unwrap_or(0)), a))?
                .unwrap_or(RATE_LIMIT_BURST_DEFAULT),
            overrides: Vec::new(),
        })
    }

    /// Adds `RateLimitOverrides`, checked entry by entry; an entry's
    /// `Interval` defaults to the global one (or, with that one "0", to
    /// the default 30 s).
    pub fn with_overrides(mut self, entries: &[OverrideFile]) -> Result<Self, ConfigError> {
        if entries.len() > OVERRIDES_MAX {
            return Err(ConfigError::Range {
                key: "RateLimitOverrides",
                value: format!("{} entries", entries.len()),
                allowed: format!("at most {OVERRIDES_MAX}"),
            });
        }
        for (index, e) in entries.iter().enumerate() {
            let wrong = |problem: String| ConfigError::Entry {
                key: "RateLimitOverrides",
                index,
                entry: entry_text(e),
                problem,
            };
            let source = match (&e.provider, &e.unit, e.uid) {
                (Some(p), None, None) if !p.trim().is_empty() => {
                    OverrideSource::Provider(p.trim().to_string())
                }
                (None, Some(u), None) if !u.trim().is_empty() => {
                    OverrideSource::Unit(u.trim().to_string())
                }
                (None, None, Some(uid)) if (0..i64::from(u32::MAX)).contains(&uid) => {
                    OverrideSource::Uid(uid as u32)
                }
                _ => {
                    return Err(wrong(
                        "an entry names exactly one source: Provider = \"NAME\", \
                         Unit = \"NAME.service\" or Uid = 0..4294967294"
                            .to_string(),
                    ))
                }
            };
            if self.overrides.iter().any(|o| o.source == source) {
                return Err(wrong(
                    "an earlier entry names the same source (each source once)".to_string(),
                ));
            }
            let burst = burst_value(e.burst)
                .map_err(|a| wrong(format!("Burst: {a}")))?
                .ok_or_else(|| {
                    wrong("every entry needs a Burst (0: that source is never limited)".into())
                })?;
            let interval = interval_value(e.interval.as_deref())
                .map_err(|a| wrong(format!("Interval: {a}")))?
                .unwrap_or(if self.interval.is_zero() {
                    RATE_LIMIT_INTERVAL_DEFAULT
                } else {
                    self.interval
                });
            self.overrides.push(RateLimitOverride {
                source,
                interval,
                burst,
            });
        }
        Ok(self)
    }

    /// The window in ms and the burst, as the drains take them.
    pub fn as_ms_and_burst(&self) -> (u64, u64) {
        (self.interval.as_millis() as u64, self.burst)
    }
}

/// An interval's value (`None`: unset), or what is allowed.
fn interval_value(text: Option<&str>) -> Result<Option<Duration>, String> {
    match text.map(str::trim) {
        None => Ok(None),
        Some("0") => Ok(Some(Duration::ZERO)),
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if d <= INTERVAL_MAX && (d.is_zero() || d.as_millis() > 0) => Ok(Some(d)),
            _ => {
                Err("\"0\" (off) or a duration from \"1ms\" to \"1d\", such as \"30s\"".to_string())
            }
        },
    }
}

/// A burst's value (`None`: unset), or what is allowed.
fn burst_value(burst: Option<i64>) -> Result<Option<u64>, String> {
    match burst {
        None => Ok(None),
        Some(b) if (0..=BURST_MAX as i64).contains(&b) => Ok(Some(b as u64)),
        Some(_) => Err(format!("0 (off) or 1..={BURST_MAX}")),
    }
}

/// An entry as an operator wrote it, for an error message.
fn entry_text(e: &OverrideFile) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &e.provider {
        parts.push(format!("Provider = {p:?}"));
    }
    if let Some(u) = &e.unit {
        parts.push(format!("Unit = {u:?}"));
    }
    if let Some(uid) = e.uid {
        parts.push(format!("Uid = {uid}"));
    }
    if let Some(i) = &e.interval {
        parts.push(format!("Interval = {i:?}"));
    }
    if let Some(b) = e.burst {
        parts.push(format!("Burst = {b}"));
    }
    format!("{{ {} }}", parts.join(", "))
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

    fn overrides(text: &str) -> Result<RateLimit, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct File {
            rate_limit_interval: Option<String>,
            rate_limit_overrides: Vec<OverrideFile>,
        }
        let f: File = toml::from_str(text).unwrap();
        RateLimit::from_file(f.rate_limit_interval.as_deref(), None)?
            .with_overrides(&f.rate_limit_overrides)
    }

    #[test]
    fn overrides_are_checked_entry_by_entry() {
        let r = overrides(
            "RateLimitOverrides = [\n\
             { Unit = \"backup.service\", Burst = 100000 },\n\
             { Provider = \"audit\", Burst = 0 },\n\
             { Uid = 1000, Burst = 50, Interval = \"10s\" },\n]\n",
        )
        .unwrap();
        assert_eq!(
            r.overrides,
            [
                RateLimitOverride {
                    source: OverrideSource::Unit("backup.service".into()),
                    interval: Duration::from_secs(30),
                    burst: 100_000,
                },
                RateLimitOverride {
                    source: OverrideSource::Provider("audit".into()),
                    interval: Duration::from_secs(30),
                    burst: 0,
                },
                RateLimitOverride {
                    source: OverrideSource::Uid(1000),
                    interval: Duration::from_secs(10),
                    burst: 50,
                },
            ]
        );
        // With the global interval off, an entry without one gets 30 s.
        let r =
            overrides("RateLimitInterval = \"0\"\nRateLimitOverrides = [{ Uid = 5, Burst = 9 }]\n")
                .unwrap();
        assert_eq!(r.overrides[0].interval, Duration::from_secs(30));
        for (text, says) in [
            (
                "[{ Burst = 5 }]",
                "[0] = { Burst = 5 }: an entry names exactly one",
            ),
            (
                "[{ Uid = 1, Unit = \"a\", Burst = 5 }]",
                "exactly one source",
            ),
            ("[{ Provider = \"\", Burst = 5 }]", "exactly one source"),
            ("[{ Uid = -1, Burst = 5 }]", "exactly one source"),
            ("[{ Provider = \"p\" }]", "every entry needs a Burst"),
            (
                "[{ Provider = \"p\", Burst = -3 }]",
                "Burst = -3 }: Burst: 0 (off)",
            ),
            (
                "[{ Uid = 1, Burst = 1 }, { Uid = 1, Burst = 2 }]",
                "[1] = { Uid = 1, Burst = 2 }: an earlier entry",
            ),
            (
                "[{ Unit = \"a\", Burst = 1, Interval = \"soon\" }]",
                "Interval: \"0\" (off)",
            ),
        ] {
            let e = overrides(&format!("RateLimitOverrides = {text}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("RateLimitOverrides") && e.contains(says),
                "{text}: {e}"
            );
        }
    }
}
