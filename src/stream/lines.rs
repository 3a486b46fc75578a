//! A connection's bytes as lines, and a line as an event.
//!
//! A line ends at `\n` or at a NUL byte (journald's stream protocol does
//! the same); one longer than [`PIECE_MAX`] is stored in pieces of at most
//! that many bytes, each but the last with `line_break` `line-max`; what is
//! left when the connection ends is stored with `line_break` `eof`. With
//! the level prefix on, a line that starts with `<N>` (N 0 to 7, as
//! sd-daemon.h writes it; `<0N>` and `<00N>` too) gets level N, the prefix
//! removed; anything else keeps the connection's level and its text.

use super::header::Header;
use crate::rings::client::truncate;
use crate::rings::{Event, Level};
use crate::syslog::record::Credentials;
use crate::trusted::Trusted;
use serde::Serialize;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The longest piece of a line stored as one event.
pub const PIECE_MAX: usize = 8192;
/// The read buffer of a connection.
const BUFFER_BYTES: usize = 64 << 10;
const _: () = assert!(PIECE_MAX < BUFFER_BYTES);

/// Why a stored line ended where it did, when not at `\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineBreak {
    Newline,
    Nul,
    /// Cut at [`PIECE_MAX`]: the line goes on in the next event.
    LineMax,
    /// The connection ended.
    Eof,
}

impl LineBreak {
    /// `fields.line_break`, for the ones that are not a newline.
    pub fn field(self) -> Option<&'static str> {
        match self {
            LineBreak::Newline => None,
            LineBreak::Nul => Some("nul"),
            LineBreak::LineMax => Some("line-max"),
            LineBreak::Eof => Some("eof"),
        }
    }
}

/// A connection's reader: a buffer, and the stop flag looked at whenever a
/// read times out (the socket's read timeout is set by the caller).
pub struct LineReader<'s, R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    stop: &'s AtomicBool,
}

impl<'s, R: Read> LineReader<'s, R> {
    pub fn new(inner: R, stop: &'s AtomicBool) -> Self {
        LineReader {
            inner,
            buf: vec![0; BUFFER_BYTES],
            start: 0,
            end: 0,
            eof: false,
            stop,
        }
    }

    /// Reads more; false at the end of the stream, at stop, or past
    /// `deadline`.
    fn fill(&mut self, deadline: Option<Instant>) -> std::io::Result<bool> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            // Relaxed: a request to end; nothing is published through it.
            if self.eof || self.stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the header did not come in time",
                ));
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line, or a piece of at most `max` bytes of a longer one
    /// (cut on a UTF-8 boundary where there is one near), with why it
    /// ended; `None` at the end. Waits as long as it takes, unless
    /// `deadline`.
    pub fn next_line(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> std::io::Result<Option<(&[u8], LineBreak)>> {
        let max = max.clamp(4, PIECE_MAX);
        loop {
            let avail = &self.buf[self.start..self.end];
            let window = &avail[..avail.len().min(max + 1)];
            if let Some(i) = window.iter().position(|&b| b == b'\n' || b == 0) {
                let brk = if avail[i] == 0 {
                    LineBreak::Nul
                } else {
                    LineBreak::Newline
                };
                let at = self.start;
                self.start += i + 1;
                return Ok(Some((&self.buf[at..at + i], brk)));
            }
            if avail.len() > max {
                let cut = utf8_cut(&avail[..max]);
                let at = self.start;
                self.start += cut;
                return Ok(Some((&self.buf[at..at + cut], LineBreak::LineMax)));
            }
            if !self.fill(deadline)? {
                if self.start == self.end {
                    return Ok(None);
                }
                let at = self.start;
                self.start = self.end;
                return Ok(Some((&self.buf[at..self.end], LineBreak::Eof)));
            }
        }
    }
}

/// Where to cut `bytes` (all of them are before a limit) so as not to
/// split a UTF-8 character: before a partial character at the end, if the
/// bytes are UTF-8 up to it.
fn utf8_cut(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=3.min(len) {
        let b = bytes[len - back];
        if b & 0xC0 != 0x80 {
            // The start of the last character: does it fit whole?
            let need = match b {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if need > back { len - back } else { len };
        }
    }
    len
}

/// `<N>` at the start of `line` (N 0-7, with up to two leading zeros, as
/// journald reads it): the level and the rest.
pub fn level_prefix(line: &[u8]) -> Option<(Level, &[u8])> {
    let rest = line.strip_prefix(b"<")?;
    let close = rest.iter().take(4).position(|&b| b == b'>')?;
    let digits = &rest[..close];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let (zeros, last) = digits.split_at(digits.len() - 1);
    if zeros.iter().any(|&d| d != b'0') {
        return None;
    }
    let level = Level::from_u8(last[0] - b'0')?;
    Some((level, &rest[close + 1..]))
}

/// The `fields` object of a line of output.
#[derive(Serialize)]
pub(super) struct OutputFields<'a> {
    pub transport: &'static str,
    pub stream: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_credentials: bool,
    #[serde(flatten)]
    pub trusted: Trusted<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_break: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated_from: Option<usize>,
}

/// The event of one line (or piece) of a connection with `header`, from
/// `credentials`; its fields text in `fields`, its message in `text`, cut
/// so the record fits `max` payload bytes.
pub fn line_event<'e>(
    header: &'e Header,
    credentials: Option<Credentials>,
    trusted: Trusted<'_>,
    line: (&[u8], LineBreak),
    max: usize,
    bufs: (&'e mut String, &'e mut Vec<u8>),
) -> Event<'e> {
    let (text, fields) = bufs;
    let (bytes, brk) = line;
    let (level, bytes) = match header.level_prefix.then(|| level_prefix(bytes)).flatten() {
        Some((level, rest)) => (level, rest),
        None => (header.level, bytes),
    };
    text.clear();
    text.push_str(&String::from_utf8_lossy(bytes));
    let mut f = OutputFields {
        transport: "stdout",
        stream: header.stream.name(),
        gid: credentials.map(|c| c.gid),
        no_credentials: credentials.is_none(),
        trusted,
        line_break: brk.field(),
        truncated_from: None,
    };
    let write = |f: &OutputFields<'_>, out: &mut Vec<u8>| {
        out.clear();
        // Plain strings and numbers into a Vec: cannot fail.
        let _ = serde_json::to_writer(&mut *out, f);
    };
    write(&f, fields);
    let provider = truncate(&header.identifier, 255);
    let name = header.stream.name();
    let fixed = provider.len() + name.len();
    if fixed + fields.len() + text.len() > max {
        f.truncated_from = Some(text.len());
        write(&f, fields);
        let keep = truncate(text, max.saturating_sub(fixed + fields.len())).len();
        text.truncate(keep);
    }
    let (pid, uid) = match credentials {
        Some(c) => (u32::try_from(c.pid).unwrap_or(0), c.uid),
        None => (0, u32::MAX),
    };
    let fields: &'e Vec<u8> = fields;
    Event {
        ts_ns: crate::rings::now_ns(),
        pid,
        tid: 0,
        uid,
        level,
        provider,
        name,
        message: text,
        // serde_json writes UTF-8.
        fields: std::str::from_utf8(fields).unwrap_or("{}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::header::Stream;

    /// Reads of at most 7 bytes: lines cross reads.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(7).min(self.0.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn lines(input: &[u8], max: usize) -> Vec<(String, LineBreak)> {
        let stop = AtomicBool::new(false);
        let mut r = LineReader::new(Trickle(input), &stop);
        let mut out = Vec::new();
        while let Some((line, brk)) = r.next_line(max, None).unwrap() {
            out.push((String::from_utf8_lossy(line).into_owned(), brk));
        }
        out
    }

    #[test]
    fn lines_end_at_newlines_nuls_the_piece_limit_and_the_end() {
        use LineBreak::*;
        assert_eq!(
            lines(b"one\ntwo\0\nthree is long\nend", 6),
            vec![
                ("one".into(), Newline),
                ("two".into(), Nul),
                ("".into(), Newline),
                ("three ".into(), LineMax),
                ("is lon".into(), LineMax),
                ("g".into(), Newline),
                ("end".into(), Eof),
            ]
        );
        // A character is not cut in two.
        assert_eq!(
            lines("aaaaé\n".as_bytes(), 5),
            vec![("aaaa".into(), LineMax), ("é".into(), Newline)]
        );
        assert_eq!(lines(b"", 6), vec![]);
    }

    #[test]
    fn level_prefixes_are_read_as_journald_reads_them() {
        assert_eq!(
            level_prefix(b"<3>disk failed"),
            Some((Level::Err, &b"disk failed"[..]))
        );
        assert_eq!(level_prefix(b"<07>x"), Some((Level::Debug, &b"x"[..])));
        assert_eq!(level_prefix(b"<004>x"), Some((Level::Warning, &b"x"[..])));
        for no in [
            &b"<8>x"[..],
            b"<13>x",
            b"<>x",
            b"<0004>x",
            b"<a>x",
            b"3>x",
            b"<3x",
        ] {
            assert_eq!(level_prefix(no), None, "{:?}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn a_line_becomes_an_event_with_trusted_fields_and_its_prefix_level() {
        let header = Header {
            stream: Stream::Stderr,
            identifier: "job".into(),
            level: Level::Warning,
            level_prefix: true,
            exit: None,
        };
        let creds = Credentials {
            pid: 77,
            uid: 1000,
            gid: 100,
        };
        let trusted = Trusted {
            comm: Some("job"),
            ..Trusted::default()
        };
        let (mut text, mut fields) = (String::new(), Vec::new());
        let e = line_event(
            &header,
            Some(creds),
            trusted,
            (b"<2>it broke", LineBreak::Newline),
            16_000,
            (&mut text, &mut fields),
        );
        assert_eq!(
            (e.level, e.message, e.provider, e.name),
            (Level::Crit, "it broke", "job", "stderr")
        );
        assert_eq!((e.pid, e.uid), (77, 1000));
        let f: serde_json::Value = serde_json::from_str(e.fields).unwrap();
        assert_eq!(f["transport"], "stdout");
        assert_eq!(f["stream"], "stderr");
        assert_eq!(f["gid"], 100);
        assert_eq!(f["comm"], "job");
        assert!(f.get("line_break").is_none());
        let plain = Header {
            level_prefix: false,
            ..header
        };
        let e = line_event(
            &plain,
            None,
            Trusted::default(),
            (b"<2>kept", LineBreak::Eof),
            16_000,
            (&mut text, &mut fields),
        );
        assert_eq!(
            (e.level, e.message, e.uid),
            (Level::Warning, "<2>kept", u32::MAX)
        );
        let f: serde_json::Value = serde_json::from_str(e.fields).unwrap();
        assert_eq!(
            (&f["line_break"], &f["no_credentials"]),
            (&"eof".into(), &true.into())
        );
    }
}
