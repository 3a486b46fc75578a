//! Parsing syslog messages: RFC 5424, RFC 3164 (the BSD format, including
//! the hostname-less form that glibc's `syslog(3)` and `logger` write to
//! `/dev/log`), and anything else, best effort.
//!
//! The parser never fails: whatever arrives becomes a [`Parsed`] message,
//! with the parts it could not read left out and a note in
//! [`Parsed::problems`] saying what was wrong. Callers keep the raw bytes
//! when there is a problem, so nothing the sender wrote is lost.

use std::borrow::Cow;

/// Facility and severity when a message has no valid `<PRI>`: user.notice,
/// as RFC 3164 §4.3.3 suggests.
pub const DEFAULT_PRIORITY: u8 = 13;

/// Which grammar a message was read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Rfc5424,
    Rfc3164,
    /// Neither: the whole text (after any `<PRI>`) is the message.
    Unstructured,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Rfc5424 => "rfc5424",
            Format::Rfc3164 => "rfc3164",
            Format::Unstructured => "unstructured",
        }
    }
}

/// One structured-data element of RFC 5424: `[id name="value" ...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdElement<'a> {
    pub id: Cow<'a, str>,
    pub params: Vec<(Cow<'a, str>, String)>,
}

/// A message as the sender wrote it. Everything here is a claim of the
/// sender; the kernel's credentials are kept apart by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub format: Format,
    /// 0..=23.
    pub facility: u8,
    /// 0 (emerg) ..= 7 (debug).
    pub severity: u8,
    /// The timestamp as written (RFC 3339 for 5424, `Mmm dd hh:mm:ss` for
    /// 3164), if any.
    pub timestamp: Option<Cow<'a, str>>,
    pub hostname: Option<Cow<'a, str>>,
    /// RFC 5424 APP-NAME, or the RFC 3164 tag.
    pub app_name: Option<Cow<'a, str>>,
    /// RFC 5424 PROCID, or the `[pid]` of an RFC 3164 tag.
    pub procid: Option<Cow<'a, str>>,
    pub msgid: Option<Cow<'a, str>>,
    pub structured_data: Vec<SdElement<'a>>,
    pub message: Cow<'a, str>,
    /// What did not parse, in words; empty for a well-formed message.
    pub problems: Vec<&'static str>,
}

impl Parsed<'_> {
    /// Nothing read yet (facility and severity are set by [`parse`]).
    fn empty(format: Format) -> Self {
        Parsed {
            format,
            facility: 0,
            severity: 0,
            timestamp: None,
            hostname: None,
            app_name: None,
            procid: None,
            msgid: None,
            structured_data: Vec::new(),
            message: Cow::Borrowed(""),
            problems: Vec::new(),
        }
    }
}

const MONTHS: [&[u8]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Text of `bytes`: borrowed when it is UTF-8, else with U+FFFD in place of
/// each bad sequence (the caller keeps the raw bytes).
fn text<'a>(bytes: &'a [u8], problems: &mut Vec<&'static str>) -> Cow<'a, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => {
            if !problems.contains(&"not UTF-8") {
                problems.push("not UTF-8");
            }
            String::from_utf8_lossy(bytes)
        }
    }
}

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
        rfc3164(rest, &mut problems)
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
        if !looks_like_rfc3339(ts.as_bytes()) {
            problems.push("malformed RFC 5424 timestamp");
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

/// `YYYY-MM-DDThh:mm:ss[.frac](Z|+hh:mm|-hh:mm)`, checked by shape.
fn looks_like_rfc3339(ts: &[u8]) -> bool {
    let digits =
        |r: std::ops::Range<usize>| ts.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if ts.len() < 20
        || !digits(0..4)
        || ts[4] != b'-'
        || !digits(5..7)
        || ts[7] != b'-'
        || !digits(8..10)
        || !(ts[10] == b'T' || ts[10] == b't')
        || !digits(11..13)
        || ts[13] != b':'
        || !digits(14..16)
        || ts[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let mut at = 19;
    if ts[at] == b'.' {
        let frac = ts[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        // RFC 5424 allows up to six digits (microseconds).
        if frac == 0 || frac > 6 {
            return false;
        }
        at += 1 + frac;
    }
    match &ts[at..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()),
        _ => false,
    }
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

/// RFC 3164 after `<PRI>`: `[TIMESTAMP ][HOSTNAME ]TAG[PID]: MSG`, where
/// the local form (what `/dev/log` gets) has no hostname.
fn rfc3164<'a>(input: &'a [u8], problems: &mut Vec<&'static str>) -> Parsed<'a> {
    let mut parsed = Parsed::empty(Format::Rfc3164);
    let mut rest = input;
    if let Some(after) = bsd_timestamp(rest) {
        parsed.timestamp = Some(text(&rest[..15], problems));
        rest = after;
    }
    // TAG: up to 32 alphanumerics and a few punctuation marks, then '[',
    // ':' or a space. A first word that is not followed by one of those
    // but by another word ending in ':' or '[' is a hostname.
    let tag = |s: &'a [u8]| -> Option<(usize, &'a [u8])> {
        let n = s
            .iter()
            .take_while(|&&b| b.is_ascii_graphic() && b != b'[' && b != b':')
            .count();
        (n > 0 && n <= 48).then_some((n, &s[n..]))
    };
    let mut header = tag(rest);
    if parsed.timestamp.is_some() {
        if let Some((n, after)) = header {
            if after.first() == Some(&b' ') {
                // "host tag: msg" — the first word was the hostname.
                if let Some((m, after_tag)) = tag(&after[1..]) {
                    if matches!(after_tag.first(), Some(b'[' | b':')) {
                        parsed.hostname = Some(text(&rest[..n], problems));
                        rest = &after[1..];
                        header = Some((m, after_tag));
                    }
                }
            }
        }
    }
    match header {
        Some((n, after)) if matches!(after.first(), Some(b'[' | b':')) => {
            parsed.app_name = Some(text(&rest[..n], problems));
            let mut after = after;
            if after.first() == Some(&b'[') {
                if let Some(close) = after.iter().position(|&b| b == b']') {
                    parsed.procid = Some(text(&after[1..close], problems));
                    after = &after[close + 1..];
                } else {
                    problems.push("unclosed [pid] in tag");
                }
            }
            let after = after.strip_prefix(b":").unwrap_or(after);
            let after = after.strip_prefix(b" ").unwrap_or(after);
            parsed.message = text(after, problems);
        }
        _ => {
            if parsed.timestamp.is_none() {
                parsed.format = Format::Unstructured;
            }
            parsed.message = text(rest, problems);
        }
    }
    parsed
}

/// `Mmm dd hh:mm:ss ` (day space-padded): the rest after it.
fn bsd_timestamp(s: &[u8]) -> Option<&[u8]> {
    if s.len() < 16 || !MONTHS.contains(&&s[0..3]) || s[3] != b' ' {
        return None;
    }
    let day_ok = (s[4] == b' ' || s[4].is_ascii_digit()) && s[5].is_ascii_digit();
    let time_ok = s[6] == b' '
        && s[7].is_ascii_digit()
        && s[8].is_ascii_digit()
        && s[9] == b':'
        && s[10].is_ascii_digit()
        && s[11].is_ascii_digit()
        && s[12] == b':'
        && s[13].is_ascii_digit()
        && s[14].is_ascii_digit()
        && s[15] == b' ';
    (day_ok && time_ok).then_some(&s[16..])
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
        assert!(m.problems.contains(&"malformed structured data"));
        assert_eq!(m.message, "[broken sd");
        let m = parse(b"<13>app: caf\xE9 \xFF");
        assert_eq!(m.problems, ["not UTF-8"]);
        assert_eq!(m.message, "caf\u{FFFD} \u{FFFD}");
        assert_eq!(facility_name(23), "local7");
        assert_eq!(facility_name(99), "unknown");
    }
}
