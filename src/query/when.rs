//! Times as people write them for `--since` and `--until`, and as the
//! short output formats print them: in the local time zone (the `TZ`
//! variable, else `/etc/localtime`, read by `jiff`), or in UTC with
//! `--utc`, as journalctl does.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, Zoned};

/// The zone times are read and printed in: the system's, or UTC.
pub fn zone(utc: bool) -> TimeZone {
    if utc {
        TimeZone::UTC
    } else {
        TimeZone::system()
    }
}

/// A time on the command line, as ns since the Unix epoch. `now` is the
/// present in the zone the text is read in. The forms, as systemd.time(7)
/// has them:
///
/// - `now`, `today`, `yesterday`, `tomorrow` (midnight of that day);
/// - `2026-12-04`, `2026-12-04 13:00`, `2026-12-04 13:00:05.250` (a `T` in
///   place of the space too), `13:00` (today), each in `now`'s zone, or in
///   UTC when followed by ` UTC`;
/// - RFC 3339 with its offset (`2026-12-04T13:00:00Z`, `…+01:00`);
/// - `@1796000000` (seconds since the Unix epoch);
/// - a span: `10 min ago`, `-1h` and `2h` (before now: a bare span is an
///   age, as eventctl always read `10m`), `+1h` (after now); units from
///   `ns` to `years`, written as `10min`, `10 min`, `1h30m`, `2 hours`.
pub fn parse(text: &str, now: &Zoned) -> Result<i64, String> {
    let t = text.trim();
    let (t, now) = match t.strip_suffix(" UTC") {
        Some(rest) => (rest.trim_end(), now.with_time_zone(TimeZone::UTC)),
        None => (t, now.clone()),
    };
    let found = named_day(t, &now)
        .or_else(|| epoch_seconds(t))
        .or_else(|| t.parse::<Timestamp>().ok())
        .or_else(|| civil(t, &now))
        .or_else(|| from_span(t, &now));
    match found {
        Some(at) => Ok(at.as_nanosecond().clamp(i64::MIN.into(), i64::MAX.into()) as i64),
        None => Err(format!(
            "{text:?} is not a time: expected a date and time (\"2026-12-04 13:00\", \
             RFC 3339), now, today, yesterday, or a span before now (\"10 min ago\", \
             \"-1h\", \"2h\")"
        )),
    }
}

/// `now`, `today`, `yesterday`, `tomorrow`.
fn named_day(t: &str, now: &Zoned) -> Option<Timestamp> {
    let days = match t {
        "now" => return Some(now.timestamp()),
        "today" => 0,
        "yesterday" => -1,
        "tomorrow" => 1,
        _ => return None,
    };
    let day = now.start_of_day().ok()?;
    let day = day.date().checked_add(Span::new().days(days)).ok()?;
    day.to_zoned(now.time_zone().clone())
        .ok()
        .map(|z| z.timestamp())
}

/// `@SECONDS`, with a fraction if given.
fn epoch_seconds(t: &str) -> Option<Timestamp> {
    let digits = t.strip_prefix('@')?;
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let secs: i64 = whole.parse().ok()?;
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos: i32 = format!("{fraction:0<9}").parse().ok()?;
    Timestamp::new(secs, nanos).ok()
}

/// A date, a date and time, or a time of today, in `now`'s zone.
fn civil(t: &str, now: &Zoned) -> Option<Timestamp> {
    let tz = now.time_zone().clone();
    let at = if let Ok(dt) = t.parse::<DateTime>() {
        dt
    } else if let Ok(date) = t.parse::<Date>() {
        date.to_datetime(Time::midnight())
    } else if let Ok(time) = t.parse::<Time>() {
        now.date().to_datetime(time)
    } else {
        return None;
    };
    // A time a clock change skips or repeats: the earlier reading, as
    // `jiff`'s compatible disambiguation (and systemd) take it.
    at.to_zoned(tz).ok().map(|z| z.timestamp())
}

/// `10 min ago`, `-1h`, `+1h`, `2h`.
fn from_span(t: &str, now: &Zoned) -> Option<Timestamp> {
    let (after, body) = if let Some(b) = t.strip_prefix('+') {
        (true, b)
    } else if let Some(b) = t.strip_prefix('-') {
        (false, b)
    } else {
        (false, t.strip_suffix("ago").unwrap_or(t))
    };
    let span: Span = body.trim().parse().ok()?;
    if span.is_negative() {
        return None;
    }
    let span = if after { span } else { span.negate() };
    now.checked_add(span).ok().map(|z| z.timestamp())
}

/// How the short formats print a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `Dec 04 13:00:01` (journalctl's `short`).
    Short,
    /// `Dec 04 13:00:01.123456`.
    ShortPrecise,
    /// `2026-12-04T13:00:01+01:00`.
    Iso,
    /// `2026-12-04T13:00:01.123456+01:00`.
    IsoPrecise,
    /// `Fri 2026-12-04 13:00:01.123456 CET` (`verbose`).
    Verbose,
    /// `Fri 2026-12-04 13:00:01 CET` (`--list-boots`).
    Day,
}

/// `ts` (ns since the Unix epoch) in `tz`, in `style`.
pub fn format(ts: i64, tz: &TimeZone, style: Style) -> String {
    let Ok(at) = Timestamp::from_nanosecond(ts.into()) else {
        // Every i64 of nanoseconds is inside jiff's range (years -9999 to
        // 9999); kept for the type's sake.
        return ts.to_string();
    };
    let z = at.to_zoned(tz.clone());
    let pattern = match style {
        Style::Short => "%b %d %H:%M:%S",
        Style::ShortPrecise => "%b %d %H:%M:%S.%6f",
        Style::Iso => "%Y-%m-%dT%H:%M:%S%:z",
        Style::IsoPrecise => "%Y-%m-%dT%H:%M:%S.%6f%:z",
        Style::Verbose => "%a %Y-%m-%d %H:%M:%S.%6f %Z",
        Style::Day => "%a %Y-%m-%d %H:%M:%S %Z",
    };
    z.strftime(pattern).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-04 13:30:00 in UTC+1 (no daylight saving in December).
    fn now() -> Zoned {
        let tz = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        "2026-12-04T12:30:00Z"
            .parse::<Timestamp>()
            .unwrap()
            .to_zoned(tz)
    }

    fn at(rfc3339: &str) -> i64 {
        rfc3339.parse::<Timestamp>().unwrap().as_nanosecond() as i64
    }

    #[test]
    fn every_form_reads_as_systemd_reads_it() {
        let now = now();
        let cases = [
            ("now", "2026-12-04T12:30:00Z"),
            ("today", "2026-12-03T23:00:00Z"),
            ("yesterday", "2026-12-02T23:00:00Z"),
            ("tomorrow", "2026-12-04T23:00:00Z"),
            ("2026-12-04 13:00", "2026-12-04T12:00:00Z"),
            ("2026-12-04 13:00:00", "2026-12-04T12:00:00Z"),
            ("2026-12-04T13:00:05.25", "2026-12-04T12:00:05.25Z"),
            ("2026-12-04", "2026-12-03T23:00:00Z"),
            ("2026-12-04 13:00 UTC", "2026-12-04T13:00:00Z"),
            ("09:15", "2026-12-04T08:15:00Z"),
            ("2026-12-04T13:00:00Z", "2026-12-04T13:00:00Z"),
            ("2026-12-04T13:00:00+03:00", "2026-12-04T10:00:00Z"),
            ("@1796000000.5", "2026-11-30T00:53:20.5Z"),
            ("10 min ago", "2026-12-04T12:20:00Z"),
            ("10min ago", "2026-12-04T12:20:00Z"),
            ("-1h", "2026-12-04T11:30:00Z"),
            ("+1h", "2026-12-04T13:30:00Z"),
            ("2h", "2026-12-04T10:30:00Z"),
            ("10m", "2026-12-04T12:20:00Z"),
            ("1d", "2026-12-03T12:30:00Z"),
            ("1h30m", "2026-12-04T11:00:00Z"),
            ("2 days ago", "2026-12-02T12:30:00Z"),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text, &now), Ok(at(want)), "{text}");
        }
        for bad in ["", "soon", "2026-13-01", "10 parsecs ago", "+-1h", "@x"] {
            let e = parse(bad, &now).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn days_start_at_local_midnight_across_a_clock_change() {
        // 2026-03-29 02:00 CET jumps to 03:00 CEST: that day is 23 hours.
        let tz = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let now = "2026-03-29T20:00:00Z"
            .parse::<Timestamp>()
            .unwrap()
            .to_zoned(tz);
        assert_eq!(parse("today", &now), Ok(at("2026-03-28T23:00:00Z")));
        assert_eq!(parse("tomorrow", &now), Ok(at("2026-03-29T22:00:00Z")));
        assert_eq!(
            parse("2026-03-29 12:00", &now),
            Ok(at("2026-03-29T10:00:00Z"))
        );
    }

    #[test]
    fn each_style_prints_in_the_zone_given() {
        let tz = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        let ts = at("2026-12-04T12:00:01.123456789Z");
        assert_eq!(format(ts, &tz, Style::Short), "Dec 04 13:00:01");
        assert_eq!(
            format(ts, &tz, Style::ShortPrecise),
            "Dec 04 13:00:01.123456"
        );
        assert_eq!(format(ts, &tz, Style::Iso), "2026-12-04T13:00:01+01:00");
        assert_eq!(
            format(ts, &tz, Style::IsoPrecise),
            "2026-12-04T13:00:01.123456+01:00"
        );
        assert_eq!(
            format(ts, &tz, Style::Verbose),
            "Fri 2026-12-04 13:00:01.123456 CET"
        );
        assert_eq!(
            format(ts, &TimeZone::UTC, Style::Day),
            "Fri 2026-12-04 12:00:01 UTC"
        );
    }
}
