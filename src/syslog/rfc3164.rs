//! The BSD header of RFC 3164, `[TIMESTAMP ][HOSTNAME ]TAG[[PID]]: MSG`,
//! read as rsyslog's `pmrfc3164` and syslog-ng's `syslog-format` read it,
//! with the variants real senders write (docs/guide/syslog.md lists them).
//!
//! The rule that tells a hostname from a tag: after the timestamp, a word
//! followed by a space (or ending the message) is the hostname when it can
//! be one: letters, digits, `.`, `_` and `-`, ending in a letter or digit
//! (rsyslog's rule), or an IPv6 address. A tag is followed by `:` or `[`,
//! which no such hostname holds; so what glibc's `syslog(3)` and `logger`
//! write to `/dev/log` (`myprog[123]: text`, `backup: text`) has no
//! hostname. The next word is the tag even without a colon (`fw01 Link
//! down` is tag `Link`; `%SYS-5-CONFIG_I Configured` is tag
//! `%SYS-5-CONFIG_I`), as both peers read it.
//!
//! Without a timestamp there is no hostname (RFC 3164 §4.1.2: it follows
//! the timestamp), and the first word is a tag only if `:` or `[` ends it
//! (the peers disagree there, and split plain text into wrong fields);
//! otherwise the message is not in either format and is stored whole.

use super::message::{text, Format, Parsed};
use super::timestamp;
use std::borrow::Cow;

/// The longest tag taken: the provider column's limit.
const TAG_MAX: usize = 255;
/// The longest hostname taken (RFC 5424's limit for HOSTNAME).
const HOSTNAME_MAX: usize = 255;

/// Letters, digits, `.`, `_`, `-`: what rsyslog takes in a hostname.
const HOST: u8 = 1;
/// `:` and `%`, which an IPv6 address and its zone hold.
const ADDRESS: u8 = 2;
/// Space, `:`, `[` and control characters: what ends a tag's name.
const TAG_END: u8 = 4;

/// The classes of each byte, looked up once per byte.
const CLASSES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-') {
            table[b] |= HOST;
        }
        if matches!(c, b':' | b'%') {
            table[b] |= ADDRESS;
        }
        if matches!(c, b' ' | b':' | b'[') || c.is_ascii_control() {
            table[b] |= TAG_END;
        }
        b += 1;
    }
    table
};

fn is(b: u8, class: u8) -> bool {
    CLASSES[usize::from(b)] & class != 0
}

/// A message's bytes and, when all of them are UTF-8, their text: parts of
/// it are then borrowed as text without being checked again one by one.
struct Source<'a> {
    bytes: &'a [u8],
    utf8: Option<&'a str>,
}

impl<'a> Source<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Source {
            bytes,
            utf8: std::str::from_utf8(bytes).ok(),
        }
    }

    /// The text of `part`, a slice of the source's bytes.
    // Inlined at its few call sites: a parse of glibc's local form took 8 %
    // more instructions with the calls (benches/syslog_parse.rs).
    #[inline(always)]
    fn text(&self, part: &'a [u8], problems: &mut Vec<&'static str>) -> Cow<'a, str> {
        let start = (part.as_ptr() as usize).wrapping_sub(self.bytes.as_ptr() as usize);
        let range = start.checked_add(part.len()).map(|end| start..end);
        match (self.utf8, range) {
            (Some(all), Some(range)) => match all.get(range) {
                Some(t) => Cow::Borrowed(t),
                None => text(part, problems),
            },
            _ => text(part, problems),
        }
    }
}

/// A message after `<PRI>` that is not RFC 5424.
#[inline]
pub(super) fn parse<'a>(input: &'a [u8], problems: &mut Vec<&'static str>) -> Parsed<'a> {
    let header = Header::read(input);
    let source = Source::new(input);
    let tag = header.tag.as_ref();
    let app_name = tag.map(|t| source.text(t.name, problems));
    let procid = tag
        .and_then(|t| t.pid)
        .map(|pid| source.text(pid, problems));
    if tag.is_some_and(|t| t.unclosed) {
        problems.push("unclosed [pid] in tag");
    }
    // One struct built whole (not filled in field by field: that made the
    // common parse slower).
    Parsed {
        format: header.format,
        facility: 0,
        severity: 0,
        timestamp: header.timestamp.map(|t| source.text(t, problems)),
        timestamp_ns: header.instant,
        hostname: header.hostname.map(|h| source.text(h, problems)),
        app_name,
        procid,
        msgid: None,
        structured_data: Vec::new(),
        message: source.text(header.message, problems),
        problems: Vec::new(),
    }
}

/// Where the parts of a BSD header are in a message.
struct Header<'a> {
    format: Format,
    timestamp: Option<&'a [u8]>,
    instant: Option<i64>,
    hostname: Option<&'a [u8]>,
    tag: Option<Tag<'a>>,
    message: &'a [u8],
}

impl<'a> Header<'a> {
    fn read(input: &'a [u8]) -> Self {
        let mut header = Header {
            format: Format::Rfc3164,
            timestamp: None,
            instant: None,
            hostname: None,
            tag: None,
            message: input,
        };
        // Some devices put spaces between <PRI> and the header.
        let body = skip_spaces(input);
        let Some((len, instant, after)) = header_timestamp(body) else {
            // A message starting with '{' or '[' is JSON or bracketed
            // text, not a tag (rsyslog's rule).
            if !matches!(body.first(), Some(b'{' | b'[')) {
                header.tag = tag(body, false);
            }
            match &header.tag {
                Some(tag) => header.message = tag.message,
                None => header.format = Format::Unstructured,
            }
            return header;
        };
        header.timestamp = Some(&body[..len]);
        header.instant = instant;
        let mut rest = after;
        if let Some((name, after)) = hostname(rest) {
            header.hostname = Some(name);
            rest = skip_spaces(after);
        }
        header.tag = tag(rest, true);
        header.message = header.tag.as_ref().map_or(rest, |t| t.message);
        header
    }
}

/// The timestamp at the start of `s` (RFC 3339, else BSD), followed by a
/// `:` some devices add, then spaces or the end: its length, the instant
/// it names (RFC 3339 with an offset only), and what follows the spaces.
fn header_timestamp(s: &[u8]) -> Option<(usize, Option<i64>, &[u8])> {
    let (len, instant) = match timestamp::rfc3339(s) {
        Some(t) => (t.len, t.instant),
        None => (timestamp::bsd(s)?, None),
    };
    let after = &s[len..];
    let after = after.strip_prefix(b":").unwrap_or(after);
    match after.first() {
        None | Some(b' ') => Some((len, instant, skip_spaces(after))),
        Some(_) => None,
    }
}

fn skip_spaces(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ').count();
    &s[n..]
}

/// The hostname at the start of `s` (see the module's rule) and what
/// follows it.
fn hostname(s: &[u8]) -> Option<(&[u8], &[u8])> {
    // The word ends at the first byte no hostname holds; unless that is a
    // space or the end, it is not a hostname (a tag such as `sshd[12]:`
    // is turned away after its name).
    let n = s
        .iter()
        .position(|&b| !is(b, HOST | ADDRESS))
        .unwrap_or(s.len());
    if n == 0 || n > HOSTNAME_MAX || s.get(n).is_some_and(|&b| b != b' ') {
        return None;
    }
    let word = &s[..n];
    let ok = if word.iter().any(|&b| is(b, ADDRESS)) {
        is_ipv6(word)
    } else {
        word.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    ok.then_some((word, &s[n..]))
}

/// An IPv6 address, with or without a `%zone`.
fn is_ipv6(word: &[u8]) -> bool {
    let (address, zone) = match word.iter().position(|&b| b == b'%') {
        Some(i) => (&word[..i], Some(&word[i + 1..])),
        None => (word, None),
    };
    // A cheap look first turns a tag such as `dead:` away before the full
    // parse.
    let looks = address
        .iter()
        .all(|&b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
    let zone_ok = zone.is_none_or(|z| !z.is_empty() && z.iter().all(|&b| is(b, HOST)));
    looks
        && zone_ok
        && std::str::from_utf8(address).is_ok_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
}

/// A tag as read: its name, the `[pid]` after it, the message after both.
struct Tag<'a> {
    name: &'a [u8],
    pid: Option<&'a [u8]>,
    /// A `[` with no `]` before the next space or colon.
    unclosed: bool,
    message: &'a [u8],
}

/// The tag at the start of `s`: anything but spaces, `:`, `[` and control
/// characters, then `[pid]`, `:` or both. `bare` also takes one ended by a
/// space or the end of the text (after a timestamp).
fn tag(s: &[u8], bare: bool) -> Option<Tag<'_>> {
    let n = s.iter().position(|&b| is(b, TAG_END)).unwrap_or(s.len());
    if n == 0 || n > TAG_MAX {
        return None;
    }
    let (name, after) = s.split_at(n);
    let mut tag = Tag {
        name,
        pid: None,
        unclosed: false,
        message: after,
    };
    match after.first() {
        Some(b'[') => {
            let inside = &after[1..];
            let end = inside
                .iter()
                .position(|&b| matches!(b, b']' | b' ' | b':' | b'['));
            match end.filter(|&i| inside[i] == b']') {
                Some(i) => {
                    tag.pid = (i > 0).then_some(&inside[..i]);
                    tag.message = &inside[i + 1..];
                }
                None => tag.unclosed = true,
            }
        }
        Some(b':') => {}
        _ if bare => {}
        _ => return None,
    }
    let message = tag.message.strip_prefix(b":").unwrap_or(tag.message);
    tag.message = message.strip_prefix(b" ").unwrap_or(message);
    Some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(line: &str) -> Parsed<'_> {
        let mut problems = Vec::new();
        let parsed = parse(line.as_bytes(), &mut problems);
        assert!(problems.is_empty(), "{line}: {problems:?}");
        parsed
    }

    /// (hostname, tag, message) of `line`.
    fn fields(line: &str) -> (Option<String>, Option<String>, String) {
        let p = read(line);
        (
            p.hostname.map(|h| h.into_owned()),
            p.app_name.map(|a| a.into_owned()),
            p.message.into_owned(),
        )
    }

    fn owned(
        host: Option<&str>,
        tag: Option<&str>,
        message: &str,
    ) -> (Option<String>, Option<String>, String) {
        (
            host.map(str::to_string),
            tag.map(str::to_string),
            message.to_string(),
        )
    }

    #[test]
    fn a_hostname_is_told_from_a_tag() {
        for (line, host, tag, message) in [
            // The local forms: a tag ends in ':' or '['.
            (
                "Dec  4 10:00:00 myprog[123]: text",
                None,
                Some("myprog"),
                "text",
            ),
            ("Dec  4 10:00:00 backup: text", None, Some("backup"), "text"),
            (
                "Dec  4 10:00:00 cafe: hex-looking tag",
                None,
                Some("cafe"),
                "hex-looking tag",
            ),
            (
                "Dec  4 10:00:00 dead:beef: not an address",
                None,
                Some("dead"),
                "beef: not an address",
            ),
            // A word that can be a hostname, followed by a space or the end.
            (
                "Dec  4 10:00:00 host app: text",
                Some("host"),
                Some("app"),
                "text",
            ),
            ("Dec  4 10:00:00 host", Some("host"), None, ""),
            (
                "Dec  4 10:00:00 host Link down",
                Some("host"),
                Some("Link"),
                "down",
            ),
            (
                "Dec  4 10:00:00 10.0.0.9 app[7]: x",
                Some("10.0.0.9"),
                Some("app"),
                "x",
            ),
            (
                "Dec  4 10:00:00 fe80::1%eth0 app: x",
                Some("fe80::1%eth0"),
                Some("app"),
                "x",
            ),
            ("Dec  4 10:00:00 :: app: x", Some("::"), Some("app"), "x"),
            // Words that cannot be a hostname are the tag.
            (
                "Dec  4 10:00:00 host. app: x",
                None,
                Some("host."),
                "app: x",
            ),
            (
                "Dec  4 10:00:00 %SYS-5-X Configured",
                None,
                Some("%SYS-5-X"),
                "Configured",
            ),
            // No tag.
            (
                "Dec  4 10:00:00 host [audit] x",
                Some("host"),
                None,
                "[audit] x",
            ),
            ("Dec  4 10:00:00 [audit] x", None, None, "[audit] x"),
        ] {
            assert_eq!(fields(line), owned(host, tag, message), "{line}");
        }
    }

    #[test]
    fn without_a_timestamp_a_tag_needs_its_colon_or_pid() {
        assert_eq!(
            fields("cron[77]: job done"),
            owned(None, Some("cron"), "job done")
        );
        assert_eq!(
            fields("error: disk full"),
            owned(None, Some("error"), "disk full")
        );
        for line in ["plain text", "{\"a\":1}", "[x]: y", "", "   "] {
            let p = read(line);
            assert_eq!(p.format, Format::Unstructured, "{line}");
            assert_eq!(p.message, line, "stored whole");
            assert_eq!((p.hostname, p.app_name), (None, None));
        }
    }

    #[test]
    fn the_pid_and_what_follows_the_tag() {
        let p = read("Dec  4 10:00:00 app[]: empty pid");
        assert_eq!((p.app_name.as_deref(), p.procid), (Some("app"), None));
        let p = read("Dec  4 10:00:00 app[12] no colon");
        assert_eq!((p.procid.as_deref(), &*p.message), (Some("12"), "no colon"));
        let p = read("Dec  4 10:00:00 app:no space");
        assert_eq!(p.message, "no space");
        let mut problems = Vec::new();
        let p = parse(b"Dec  4 10:00:00 app[12 oops: x", &mut problems);
        assert_eq!(problems, ["unclosed [pid] in tag"]);
        assert_eq!((p.app_name.as_deref(), p.procid), (Some("app"), None));
        assert_eq!(p.message, "[12 oops: x");
        let long = format!("Dec  4 10:00:00 {}: x", "t".repeat(TAG_MAX + 1));
        let p = read(&long);
        assert_eq!(p.app_name, None, "too long for a tag");
        assert_eq!(p.message, long[16..]);
    }

    #[test]
    fn parts_are_borrowed_from_utf8_and_converted_when_not() {
        let mut problems = Vec::new();
        let p = parse("Dec  4 10:00:00 prög[1]: été".as_bytes(), &mut problems);
        assert!(problems.is_empty());
        assert!(matches!(p.app_name, Some(Cow::Borrowed("prög"))));
        assert!(matches!(p.procid, Some(Cow::Borrowed("1"))));
        assert!(matches!(p.message, Cow::Borrowed("été")));
        // Not a host name's letters: the tag.
        let p = parse("Dec  4 10:00:00 hôte x".as_bytes(), &mut problems);
        assert_eq!((p.hostname, p.app_name.as_deref()), (None, Some("hôte")));
        let p = parse(b"Dec  4 10:00:00 host pr\xF6g[1]: \xE9t\xE9", &mut problems);
        assert_eq!(problems, ["not UTF-8"]);
        assert_eq!(p.hostname.as_deref(), Some("host"));
        assert_eq!(p.app_name.as_deref(), Some("pr\u{FFFD}g"));
        assert_eq!(p.procid.as_deref(), Some("1"));
        assert_eq!(p.message, "\u{FFFD}t\u{FFFD}");
    }

    #[test]
    fn a_timestamp_must_end_its_word() {
        let p = read("Dec  4 10:00:00x app: y");
        assert_eq!(p.format, Format::Unstructured);
        assert_eq!(p.timestamp, None);
        let p = read("2025-03-14T09:26:53Zfoo app: y");
        assert_eq!(p.timestamp, None);
        let p = read("  Dec  4 10:00:00:   host   app: y");
        assert_eq!(p.timestamp.as_deref(), Some("Dec  4 10:00:00"));
        assert_eq!(
            (p.hostname.as_deref(), p.app_name.as_deref()),
            (Some("host"), Some("app"))
        );
    }
}
