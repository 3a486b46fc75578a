//! A syslog message as read: which grammar it was read with, the parts
//! found, and what did not parse. The readers (`parse` for RFC 5424 and
//! the dispatch, `rfc3164` for the BSD format) fill it.

use std::borrow::Cow;

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
    /// The timestamp as written (RFC 3339 for 5424; for 3164 a BSD
    /// timestamp such as `Mmm dd hh:mm:ss`, or RFC 3339), if any.
    pub timestamp: Option<Cow<'a, str>>,
    /// The instant the timestamp names, in nanoseconds since the Unix
    /// epoch: only for RFC 3339 timestamps with an offset (a BSD timestamp
    /// names no year and no zone, and none is guessed).
    pub timestamp_ns: Option<i64>,
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
    /// Nothing read yet (facility and severity are set by
    /// [`parse`](super::parse::parse)).
    pub(super) fn empty(format: Format) -> Self {
        Parsed {
            format,
            facility: 0,
            severity: 0,
            timestamp: None,
            timestamp_ns: None,
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

/// Text of `bytes`: borrowed when it is UTF-8, else with U+FFFD in place of
/// each bad sequence (the caller keeps the raw bytes).
#[inline]
pub(super) fn text<'a>(bytes: &'a [u8], problems: &mut Vec<&'static str>) -> Cow<'a, str> {
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
