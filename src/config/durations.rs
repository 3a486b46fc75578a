//! Durations as the configuration file writes them.

use super::ConfigError;
use std::time::Duration;

/// A duration as the file writes one: whole days, hours, minutes or
/// seconds in the largest unit that holds it exactly ("7d", "36h",
/// "90m", "3630s"); a fraction of a second as humantime writes it.
pub fn duration_text(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return humantime::format_duration(d).to_string();
    }
    let (n, unit) = [(86_400, "d"), (3_600, "h"), (60, "m")]
        .into_iter()
        .find(|(size, _)| secs % size == 0)
        .map_or((secs, "s"), |(size, unit)| (secs / size, unit));
    format!("{n}{unit}")
}

/// `RetentionMaxAge` in a report: its text, or null.
pub(super) fn age_as_text<S: serde::Serializer>(
    age: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match age {
        Some(d) => s.serialize_str(&duration_text(*d)),
        None => s.serialize_none(),
    }
}

pub(super) fn parse_age(text: &str) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::Range {
        key: "RetentionMaxAge",
        value: format!("{text:?}"),
        allowed: "a positive duration such as \"12h\", \"30d\" or \"1w\"".to_string(),
    };
    match humantime::parse_duration(text.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(bad()),
    }
}
