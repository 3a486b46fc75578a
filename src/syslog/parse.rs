//! Parsing syslog messages: RFC 5424 (here), RFC 3164 (the BSD format with
//! the variants real senders write, including the hostname-less form that
//! glibc's `syslog(3)` and `logger` write to `/dev/log`: [`super::rfc3164`]),
//! and anything else, stored whole.
//!
//! The parser never fails: whatever arrives becomes a [`Parsed`] message,
//! with the parts it could not read left out and a note in
//! [`Parsed::problems`] saying what was wrong. Callers keep the raw bytes
//! when there is a problem, so nothing the sender wrote is lost.

use super::{rfc3164, timestamp};
use std::borrow::Cow;

/// Facility and severity when a message has no valid `<PRI>`: user.notice,
/// as RFC 3164 §4.3.3 suggests.
pub const DEFAULT_PRIORITY: u8 = 13;

use super::message::text;
pub use super::message::{Format, Parsed, SdElement};

/// Parses one message (a datagram, or one frame of a stream).
pub fn parse(input: &[u8]) -> Parsed<'_> {
    let mut problems = Vec::new();
    // Senders often end a message with a newline (or a NUL, from old
    // syslog(3) implementations); neither is part of the text.
    let mut input = input;
    while let [rest @ .., b'\n' | b'\r' | 0] = input {
        input = rest;
    }
    let (priority, rest) = match priority(input) {
        Ok(found) => found,
        Err(problem) => {
            problems.push(problem);
            (DEFAULT_PRIORITY, input)
        }
    };
    let mut parsed = if let Some(after) = rest.strip_prefix(b"1 ") {
        rfc5424(after, &mut problems)
    } else {
        rfc3164::parse(rest, &mut problems)
    };
    parsed.facility = priority >> 3;
    parsed.severity = priority & 7;
    parsed.problems = problems;
    parsed
}

/// `<PRI>` at the start: 1 to 3 digits, 0..=191, no leading zero (except
/// "0" itself).
fn priority(input: &[u8]) -> Result<(u8, &[u8]), &'static str> {
    let Some(rest) = input.strip_prefix(b"<") else {
        return Err("no <priority>");
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 3 || rest.get(digits) != Some(&b'>') {
        return Err("malformed <priority>");
    }
    if digits > 1 && rest[0] == b'0' {
        return Err("malformed <priority>");
    }
    let value: u32 = rest[..digits]
        .iter()
        .fold(0, |v, d| v * 10 + u32::from(d - b'0'));
    if value > 191 {
        return Err("priority out of range");
    }
    Ok((value as u8, &rest[digits + 1..]))
}

/// Splits off the next space-separated field.
fn field(input: &[u8]) -> Option<(&[u8], &[u8])> {
    if input.is_empty() {
        return None;
    }
    match input.iter().position(|&b| b == b' ') {
        Some(i) => Some((&input[..i], &input[i + 1..])),
        None => Some((input, &[])),
    }
}

/// RFC 5424 after `<PRI>1 `.
fn rfc5424<'a>(input: &'a [u8], problems: &mut Vec<&'static str>) -> Parsed<'a> {
    let mut parsed = Parsed::empty(Format::Rfc5424);
    let mut rest = input;
    let mut header: [Option<Cow<'a, str>>; 5] = Default::default();
    // TIMESTAMP HOSTNAME APP-NAME PROCID MSGID, each "-" when absent.
    let limits = [64, 255, 48, 128, 32];
    for (slot, limit) in header.iter_mut().zip(limits) {
        let Some((value, after)) = field(rest) else {
            problems.push("truncated RFC 5424 header");
            parsed.message = Cow::Borrowed("");
            return fill(parsed, header);
        };
        rest = after;
        if value != b"-" {
            if value.len() > limit {
                problems.push("RFC 5424 header field too long");
            }
            *slot = Some(text(value, problems));
        }
    }
    parsed = fill(parsed, header);
    if let Some(ts) = &parsed.timestamp {
        let read = timestamp::rfc3339(ts.as_bytes()).filter(|t| t.len == ts.len());
        match read {
            Some(t) if t.strict => parsed.timestamp_ns = t.instant,
            _ => problems.push("malformed RFC 5424 timestamp"),
        }
    }
    // STRUCTURED-DATA: "-" or one or more [elements].
    if let Some(after) = rest.strip_prefix(b"-") {
        rest = after;
    } else if rest.first() == Some(&b'[') {
        match structured_data(rest, problems) {
            Some((elements, after)) => {
                parsed.structured_data = elements;
                rest = after;
            }
            None => {
                // Unreadable: kept as part of the message.
                problems.push("malformed structured data");
            }
        }
    } else if !rest.is_empty() {
        problems.push("missing structured data");
    }
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    // An optional byte-order mark says the message is UTF-8.
    let rest = rest.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(rest);
    parsed.message = text(rest, problems);
    parsed
}

fn fill<'a>(mut parsed: Parsed<'a>, header: [Option<Cow<'a, str>>; 5]) -> Parsed<'a> {
    let [timestamp, hostname, app_name, procid, msgid] = header;
    parsed.timestamp = timestamp;
    parsed.hostname = hostname;
    parsed.app_name = app_name;
    parsed.procid = procid;
    parsed.msgid = msgid;
    parsed
}

/// One or more `[id param="value" ...]` elements; `None` if malformed.
fn structured_data<'a>(
    mut input: &'a [u8],
    problems: &mut Vec<&'static str>,
) -> Option<(Vec<SdElement<'a>>, &'a [u8])> {
    let mut elements = Vec::new();
    while let Some(after) = input.strip_prefix(b"[") {
        let id_len = after.iter().position(|&b| b == b' ' || b == b']')?;
        if id_len == 0 || id_len > 32 {
            return None;
        }
        let mut element = SdElement {
            id: text(&after[..id_len], problems),
            params: Vec::new(),
        };
        let mut rest = &after[id_len..];
        loop {
            match rest.first()? {
                b']' => {
                    rest = &rest[1..];
                    break;
                }
                b' ' => {
                    rest = &rest[1..];
                    let eq = rest.iter().position(|&b| b == b'=')?;
                    if eq == 0
                        || eq > 32
                        || rest[..eq]
                            .iter()
                            .any(|&b| b == b' ' || b == b']' || b == b'"')
                    {
                        return None;
                    }
                    let name = text(&rest[..eq], problems);
                    rest = rest[eq + 1..].strip_prefix(b"\"")?;
                    let (value, after) = quoted(rest)?;
                    element
                        .params
                        .push((name, text(&value, problems).into_owned()));
                    rest = after;
                }
                _ => return None,
            }
        }
        elements.push(element);
        input = rest;
    }
    Some((elements, input))
}

/// A PARAM-VALUE up to its closing quote, with `\"`, `\\` and `\]`
/// unescaped (a backslash before anything else stays, as RFC 5424 says).
fn quoted(input: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut value = Vec::new();
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'"' => return Some((value, &input[i + 1..])),
            b'\\' if matches!(input.get(i + 1), Some(b'"' | b'\\' | b']')) => {
                value.push(input[i + 1]);
                i += 2;
            }
            b => {
                value.push(b);
                i += 1;
            }
        }
    }
    None
}

/// Facility names (RFC 5424 table 1, with the usual short names).
pub fn facility_name(facility: u8) -> &'static str {
    const NAMES: [&str; 24] = [
        "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
        "authpriv", "ftp", "ntp", "audit", "alert", "clock", "local0", "local1", "local2",
        "local3", "local4", "local5", "local6", "local7",
    ];
    NAMES
        .get(usize::from(facility))
        .copied()
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc5424_with_structured_data_and_bom() {
        let m = parse(
            b"<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog 8710 ID47 \
              [exampleSDID@32473 iut=\"3\" eventSource=\"App\\\"lic\\]ation\"][b@1 x=\"\"] \
              \xEF\xBB\xBFAn application event\n",
        );
        assert_eq!(m.format, Format::Rfc5424);
        assert_eq!((m.facility, m.severity), (20, 5));
        assert_eq!(m.timestamp.as_deref(), Some("2003-10-11T22:14:15.003Z"));
        assert_eq!(m.timestamp_ns, Some(1_065_910_455_003_000_000));
        assert_eq!(m.hostname.as_deref(), Some("mymachine.example.com"));
        assert_eq!(m.app_name.as_deref(), Some("evntslog"));
        assert_eq!(m.procid.as_deref(), Some("8710"));
        assert_eq!(m.msgid.as_deref(), Some("ID47"));
        assert_eq!(m.structured_data.len(), 2);
        assert_eq!(m.structured_data[0].id, "exampleSDID@32473");
        assert_eq!(
            m.structured_data[0].params,
            vec![
                ("iut".into(), "3".to_string()),
                ("eventSource".into(), "App\"lic]ation".to_string())
            ]
        );
        assert_eq!(
            m.structured_data[1].params,
            vec![("x".into(), String::new())]
        );
        assert_eq!(m.message, "An application event");
        assert!(m.problems.is_empty(), "{:?}", m.problems);
    }

    #[test]
    fn rfc5424_nil_values_and_no_message() {
        let m = parse(b"<34>1 - - - - - -");
        assert_eq!(m.format, Format::Rfc5424);
        assert_eq!((m.facility, m.severity), (4, 2));
        assert_eq!(
            (m.timestamp, m.hostname, m.app_name, m.procid, m.msgid),
            (None, None, None, None, None)
        );
        assert_eq!(m.message, "");
        assert!(m.problems.is_empty());
        let m = parse(b"<34>1 2026-11-30T10:00:00+01:00 h app - - - hello");
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!(m.message, "hello");
    }

    #[test]
    fn rfc3164_local_and_network_forms() {
        // What glibc syslog(3) and logger send to /dev/log.
        let m = parse(b"<38>Nov 30 10:01:02 sshd[1234]: Accepted publickey for root");
        assert_eq!(m.format, Format::Rfc3164);
        assert_eq!((m.facility, m.severity), (4, 6));
        assert_eq!(m.timestamp.as_deref(), Some("Nov 30 10:01:02"));
        assert_eq!(m.hostname, None);
        assert_eq!(m.app_name.as_deref(), Some("sshd"));
        assert_eq!(m.procid.as_deref(), Some("1234"));
        assert_eq!(m.message, "Accepted publickey for root");
        // With a hostname, and a single-digit day.
        let m = parse(b"<13>Feb  5 17:32:18 10.0.0.99 myapp: Use the BFG!");
        assert_eq!(m.hostname.as_deref(), Some("10.0.0.99"));
        assert_eq!(m.app_name.as_deref(), Some("myapp"));
        assert_eq!(m.procid, None);
        assert_eq!(m.message, "Use the BFG!");
        assert!(m.problems.is_empty());
        // No timestamp at all.
        let m = parse(b"<14>cron[77]: job done\n");
        assert_eq!(
            (m.app_name.as_deref(), m.procid.as_deref()),
            (Some("cron"), Some("77"))
        );
        assert_eq!(m.message, "job done");
    }

    #[test]
    fn malformed_input_is_kept_with_a_reason() {
        let m = parse(b"");
        assert_eq!(
            (m.format, m.facility, m.severity),
            (Format::Unstructured, 1, 5)
        );
        assert_eq!(m.problems, ["no <priority>"]);
        for (input, problem) in [
            (&b"<999>hi"[..], "priority out of range"),
            (b"<12x>hi", "malformed <priority>"),
            (b"<012>hi", "malformed <priority>"),
            (b"no priority at all", "no <priority>"),
        ] {
            let m = parse(input);
            assert_eq!(m.problems, [problem], "{input:?}");
            assert_eq!((m.facility, m.severity), (1, 5));
        }
        let m = parse(b"<13>1 2026-11-30T10:00:00Z host");
        assert_eq!(m.problems, ["truncated RFC 5424 header"]);
        assert_eq!(m.hostname.as_deref(), Some("host"));
        let m = parse(b"<13>1 yesterday h a p m [broken sd");
        assert!(m.problems.contains(&"malformed RFC 5424 timestamp"));
        for ts in [
            "2026-11-30T10:00:00.1234567Z",
            "2026-11-30T10:00:00,5Z",
            "2026-11-30T10:00:00",
            "2026-02-30T10:00:00Z",
        ] {
            let line = format!("<13>1 {ts} h a p m - text");
            let m = parse(line.as_bytes());
            assert_eq!(m.problems, ["malformed RFC 5424 timestamp"], "{ts}");
            assert_eq!((m.timestamp.as_deref(), m.timestamp_ns), (Some(ts), None));
        }
        assert!(m.problems.contains(&"malformed structured data"));
        assert_eq!(m.message, "[broken sd");
        let m = parse(b"<13>app: caf\xE9 \xFF");
        assert_eq!(m.problems, ["not UTF-8"]);
        assert_eq!(m.message, "caf\u{FFFD} \u{FFFD}");
        assert_eq!(facility_name(23), "local7");
        assert_eq!(facility_name(99), "unknown");
    }
}
