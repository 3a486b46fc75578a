//! How `eventctl` prints events: journalctl's formats (`short` and its
//! kin, `cat`, `verbose`, `json`, `json-pretty`, in [`journal`]), and
//! eventd's own `text` (coloured on a terminal) and `table`.

use crate::rings::Level;
use crate::store::rows::{EventRow, GapRow};
use jiff::tz::TimeZone;
use std::io::Write;

mod journal;

/// `eventctl export status --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Table,
}

/// `eventctl query --output`: journalctl's names for its formats, and
/// eventd's `text` and `table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `Dec 04 13:00:01 host provider[pid]: message` (local time).
    Short,
    /// `short` with an ISO 8601 time and its offset.
    ShortIso,
    /// `short` with an ISO 8601 time to the microsecond.
    ShortIsoPrecise,
    /// `short` to the microsecond.
    ShortPrecise,
    /// The message alone.
    Cat,
    /// Every column and field, one per line.
    Verbose,
    /// One JSON object per line (`fields` an object).
    Json,
    /// The same objects, indented.
    JsonPretty,
    /// eventd's line: UTC time, cpu, sequence, level, provider/name[pid],
    /// message and fields (coloured on a terminal).
    Text,
    /// Aligned columns under a header.
    Table,
}

impl From<Output> for Format {
    fn from(o: Output) -> Format {
        match o {
            Output::Text => Format::Text,
            Output::Json => Format::Json,
            Output::Table => Format::Table,
        }
    }
}

pub struct Renderer<W: Write> {
    out: W,
    format: Format,
    colour: bool,
    header_done: bool,
    /// The zone of the short formats' times.
    zone: TimeZone,
    /// The host that stored the events (`HostName`): the host column of
    /// local queries (a fleet query's rows name their own).
    hostname: String,
}

/// Bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069):
/// invisible, they make a terminal show the text around them in another
/// order than it is.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// What [`clean`] escapes: control characters (C0, DEL, C1) and bidi
/// controls.
fn unsafe_on_screen(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// Text from producers, and from the fleet (ClickHouse's answers and
/// errors), is untrusted: control characters (escape sequences, newlines
/// that would forge lines, C1 controls) and bidi controls are shown as
/// `\u{..}` escapes. Every line `eventctl` prints and every ClickHouse
/// text eventd logs goes through this; JSON output goes through
/// [`json_safe`].
pub fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(unsafe_on_screen) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if unsafe_on_screen(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// JSON text with DEL, the C1 controls and the bidi controls written as
/// `\uXXXX` (serde_json escapes only C0 and leaves the rest to the reader,
/// and a terminal acts on them). Outside its strings JSON text is ASCII, so
/// these characters can only be inside strings, where the escape means
/// the same character: the value read back is unchanged.
pub fn json_safe(json: String) -> String {
    let unsafe_in_json = |c: char| ('\u{7f}'..='\u{9f}').contains(&c) || is_bidi_control(c);
    if !json.chars().any(unsafe_in_json) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_in_json(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn time(ts: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ts.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

fn level_name(level: u8) -> &'static str {
    Level::from_u8(level).map_or("?", Level::name)
}

/// A ring as a gap line names it: `cpu 3`, `cpu syslog`, `cpu kernel`.
fn ring_number(cpu: u32) -> std::borrow::Cow<'static, str> {
    if crate::rings::is_own_ring(cpu) {
        crate::rings::ring_name(cpu)
    } else {
        cpu.to_string().into()
    }
}

/// Where an event came from, as text output shows it: `cpu3` for a
/// producer's event in a CPU ring; for eventd's own rings the source:
/// `kernel`, `syslog`, or, for service output (`fields.transport`
/// `stdout`), its stream (`stdout`, `stderr`; `exit` for the exit record).
pub fn source(cpu: u32, fields: Option<&str>) -> std::borrow::Cow<'static, str> {
    if cpu != crate::rings::SYSLOG_RING_CPU {
        return crate::rings::ring_name(cpu);
    }
    let parsed = fields.and_then(|f| serde_json::from_str::<serde_json::Value>(f).ok());
    let field = |key: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(key)?.as_str().map(str::to_string))
    };
    match field("transport").as_deref() {
        Some("stdout") => field("stream").unwrap_or_else(|| "exit".into()).into(),
        Some("eventd") => "eventd".into(),
        _ => "syslog".into(),
    }
}

impl<W: Write> Renderer<W> {
    /// Times in the system's zone, the kernel's host name: see
    /// [`in_zone`](Self::in_zone) and [`on_host`](Self::on_host).
    pub fn new(out: W, format: impl Into<Format>, colour: bool) -> Self {
        Renderer {
            out,
            format: format.into(),
            colour,
            header_done: false,
            zone: TimeZone::system(),
            hostname: crate::config::kernel_host_name(),
        }
    }

    /// Prints the short formats' times in `zone`.
    pub fn in_zone(mut self, zone: TimeZone) -> Self {
        self.zone = zone;
        self
    }

    /// Names `hostname` as the host of local events.
    pub fn on_host(mut self, hostname: &str) -> Self {
        self.hostname = hostname.to_string();
        self
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn event(&mut self, e: &EventRow) -> std::io::Result<()> {
        self.event_from(None, e)
    }

    /// The colour of a message of `level` on a terminal (journalctl's: err
    /// and worse bright red, warning bright yellow, notice bright, debug
    /// grey), and the sequence that ends it.
    fn colours(&self, level: u8) -> (&'static str, &'static str) {
        match (self.colour, level) {
            (false, _) => ("", ""),
            (true, 0..=3) => ("\x1b[1;31m", "\x1b[0m"),
            (true, 4) => ("\x1b[1;33m", "\x1b[0m"),
            (true, 5) => ("\x1b[1m", "\x1b[0m"),
            (true, 7) => ("\x1b[2m", "\x1b[0m"),
            (true, _) => ("", ""),
        }
    }

    /// An event of a fleet query: the same output with its host (the host
    /// column in the short formats, `host` and `hostname` keys in JSON, a
    /// HOST column in a table, first on a text line).
    pub fn event_from(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        match self.format {
            Format::Text => self.text(host, e),
            Format::Table => self.table_row(host, e),
            _ => self.journal(host, e),
        }
    }

    fn text(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        let prefix = host.map_or_else(String::new, |h| format!("{} ", clean(h)));
        write!(self.out, "{prefix}")?;
        let level = level_name(e.level);
        let (on, off) = match (self.colour, e.level) {
            (false, _) => ("", ""),
            (true, 0..=3) => ("\x1b[1;31m", "\x1b[0m"),
            (true, 4) => ("\x1b[33m", "\x1b[0m"),
            (true, 7) => ("\x1b[2m", "\x1b[0m"),
            (true, _) => ("", ""),
        };
        write!(
            self.out,
            "{} {} #{} {on}{level:<7}{off} {}/{}[{}]: {on}{}{off}",
            time(e.ts),
            source(e.cpu, e.fields.as_deref()),
            e.seq,
            clean(&e.provider),
            clean(&e.name),
            e.pid,
            clean(&e.message)
        )?;
        match &e.fields {
            Some(f) => writeln!(self.out, " {}", clean(f)),
            None => writeln!(self.out),
        }
    }

    fn table_row(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        let host = host.map(|h| format!("{:<16} ", clean(h)));
        if !self.header_done {
            self.header_done = true;
            writeln!(
                self.out,
                "{}{:<27} {:>4} {:>10} {:<7} {:<16} {:<16} {:>7}  MESSAGE",
                host.as_ref().map_or("", |_| "HOST             "),
                "TIME",
                "CPU",
                "SEQ",
                "LEVEL",
                "PROVIDER",
                "NAME",
                "PID"
            )?;
        }
        writeln!(
            self.out,
            "{}{:<27} {:>4} {:>10} {:<7} {:<16} {:<16} {:>7}  {}",
            host.unwrap_or_default(),
            time(e.ts),
            e.cpu,
            e.seq,
            level_name(e.level),
            clean(&e.provider),
            clean(&e.name),
            e.pid,
            clean(&e.message)
        )
    }

    pub fn gap(&mut self, g: &GapRow) -> std::io::Result<()> {
        self.gap_from(None, g)
    }

    /// A gap of a fleet query, with its host. With `cat`, whose output is
    /// messages only, the note goes to standard error.
    pub fn gap_from(&mut self, host: Option<&str>, g: &GapRow) -> std::io::Result<()> {
        match self.format {
            Format::Json | Format::JsonPretty => {
                let hostname = host.unwrap_or(&self.hostname);
                let mut v = serde_json::json!({ "gap": g, "hostname": hostname });
                if let Some(h) = host {
                    v["host"] = serde_json::Value::from(h);
                }
                let text = match self.format {
                    Format::JsonPretty => serde_json::to_string_pretty(&v)?,
                    _ => v.to_string(),
                };
                writeln!(self.out, "{}", json_safe(text))
            }
            Format::Cat => {
                let line = self.gap_line(host, g);
                let _ = writeln!(std::io::stderr(), "{line}");
                Ok(())
            }
            _ => {
                let line = self.gap_line(host, g);
                writeln!(self.out, "{line}")
            }
        }
    }

    /// A time as this format prints it beside events: in the zone for
    /// journalctl's formats, RFC 3339 in UTC for `text` and `table`.
    fn time_of(&self, ts: i64) -> String {
        use super::when::{format, Style};
        let style = match self.format {
            Format::Text | Format::Table => return time(ts),
            Format::ShortIso => Style::Iso,
            Format::ShortIsoPrecise => Style::IsoPrecise,
            Format::Short | Format::Cat => Style::Short,
            _ => Style::ShortPrecise,
        };
        format(ts, &self.zone, style)
    }

    /// The note that says events were lost.
    fn gap_line(&self, host: Option<&str>, g: &GapRow) -> String {
        let on = host.map_or_else(String::new, |h| format!(" on {}", clean(h)));
        if g.cpu == crate::store::loss::STORE_CPU {
            return format!(
                "-- at least {} events lost{on}: {} (found {}); they were stored from {} on --",
                g.lost,
                clean(&g.reason),
                self.time_of(g.detected_at),
                if g.ts_before > 0 {
                    self.time_of(g.ts_before)
                } else {
                    "an unknown time".to_string()
                },
            );
        }
        format!(
            "-- {} events lost{on} on cpu {} ({}, sequences {}..={}) between {} and {} --",
            g.lost,
            ring_number(g.cpu),
            clean(&g.reason),
            g.from_seq,
            g.to_seq,
            if g.ts_before > 0 {
                self.time_of(g.ts_before)
            } else {
                "the ring's start".to_string()
            },
            self.time_of(g.detected_at)
        )
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_output_names_the_source_of_eventds_own_events() {
        use crate::rings::{KERNEL_RING_CPU, SYSLOG_RING_CPU};
        assert_eq!(source(3, Some(r#"{"transport":"stdout"}"#)), "cpu3");
        assert_eq!(source(KERNEL_RING_CPU, None), "kernel");
        assert_eq!(
            source(SYSLOG_RING_CPU, Some(r#"{"transport":"dgram"}"#)),
            "syslog"
        );
        let line = r#"{"transport":"stdout","stream":"stderr"}"#;
        assert_eq!(source(SYSLOG_RING_CPU, Some(line)), "stderr");
        assert_eq!(
            source(SYSLOG_RING_CPU, Some(r#"{"transport":"stdout"}"#)),
            "exit"
        );
        assert_eq!(
            source(SYSLOG_RING_CPU, Some(r#"{"transport":"eventd"}"#)),
            "eventd"
        );
        assert_eq!(source(SYSLOG_RING_CPU, Some("not json")), "syslog");
        let row = EventRow {
            ts: 0,
            cpu: KERNEL_RING_CPU,
            seq: 9,
            ring_epoch: 1,
            pid: 0,
            tid: 0,
            uid: 0,
            level: 3,
            provider: "kernel".into(),
            name: "kern".into(),
            message: "oops".into(),
            fields: None,
        };
        let mut out = Vec::new();
        Renderer::new(&mut out, Format::Text, false)
            .event(&row)
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.contains(" kernel #9 err "), "{out}");
    }

    #[test]
    fn control_characters_from_producers_are_escaped() {
        assert_eq!(clean("plain ✓"), "plain ✓");
        assert_eq!(clean("a\x1b[2Jb\nc"), "a\\u{1b}[2Jb\\u{a}c");
    }

    #[test]
    fn c1_and_bidi_controls_are_escaped_on_screen_and_in_json() {
        let text = "csi\u{9b}2J rtl\u{202e}txt iso\u{2066}x\u{2069} del\u{7f} é";
        assert_eq!(
            clean(text),
            "csi\\u{9b}2J rtl\\u{202e}txt iso\\u{2066}x\\u{2069} del\\u{7f} é"
        );
        let json = json_safe(serde_json::json!({ "m": text }).to_string());
        assert_eq!(
            json,
            r#"{"m":"csi\u009b2J rtl\u202etxt iso\u2066x\u2069 del\u007f é"}"#
        );
        let back: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back["m"], text);
        // Left alone: ordinary text, and the escapes serde_json writes.
        let plain = serde_json::json!({ "m": "a\u{1b}b ✓" }).to_string();
        assert_eq!(json_safe(plain.clone()), plain);
    }

    /// A fleet gap's reason comes from ClickHouse: escaped like the rest.
    #[test]
    fn a_gap_reason_is_escaped() {
        let gap = GapRow {
            ring_epoch: 1,
            cpu: 0,
            from_seq: 1,
            to_seq: 2,
            lost: 2,
            reason: "x\u{1b}[2J\u{202e}\nforged".to_string(),
            ts_before: 0,
            detected_at: 1,
        };
        for format in [
            Format::Text,
            Format::Table,
            Format::Json,
            Format::Short,
            Format::Verbose,
        ] {
            let mut out = Vec::new();
            Renderer::new(&mut out, format, false)
                .gap_from(Some("h"), &gap)
                .unwrap();
            let out = String::from_utf8(out).unwrap();
            assert_eq!(out.lines().count(), 1, "{out}");
            assert!(!out.contains(['\u{1b}', '\u{202e}']), "{out:?}");
        }
    }
}
