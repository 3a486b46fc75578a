//! How `eventctl` prints events: human text (coloured on a terminal), JSON
//! lines, or an aligned table.

use crate::rings::Level;
use crate::store::rows::{EventRow, GapRow};
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Table,
}

pub struct Renderer<W: Write> {
    out: W,
    format: Output,
    colour: bool,
    header_done: bool,
}

/// Text from producers is untrusted: control characters (escape sequences,
/// newlines that would forge lines) are shown as `\u{..}` escapes.
fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

fn time(ts: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ts.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

fn level_name(level: u8) -> &'static str {
    Level::from_u8(level).map_or("?", Level::name)
}

impl<W: Write> Renderer<W> {
    pub fn new(out: W, format: Output, colour: bool) -> Self {
        Renderer {
            out,
            format,
            colour,
            header_done: false,
        }
    }

    pub fn event(&mut self, e: &EventRow) -> std::io::Result<()> {
        self.event_from(None, e)
    }

    /// An event of a fleet query: the same output with its host first (a
    /// `host` key in JSON, a HOST column in a table).
    pub fn event_from(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        let prefix = host.map_or_else(String::new, |h| format!("{} ", clean(h)));
        match self.format {
            Output::Json => match host {
                None => writeln!(self.out, "{}", serde_json::to_string(e)?),
                Some(h) => {
                    let mut v = serde_json::to_value(e)?;
                    if let Some(map) = v.as_object_mut() {
                        map.insert("host".to_string(), serde_json::Value::from(h));
                    }
                    writeln!(self.out, "{v}")
                }
            },
            Output::Text => {
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
                    "{} cpu{} #{} {on}{level:<7}{off} {}/{}[{}]: {on}{}{off}",
                    time(e.ts),
                    e.cpu,
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
            Output::Table => {
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
        }
    }

    pub fn gap(&mut self, g: &GapRow) -> std::io::Result<()> {
        self.gap_from(None, g)
    }

    /// A gap of a fleet query, with its host.
    pub fn gap_from(&mut self, host: Option<&str>, g: &GapRow) -> std::io::Result<()> {
        let on = host.map_or_else(String::new, |h| format!(" on {}", clean(h)));
        match self.format {
            Output::Json => match host {
                None => writeln!(self.out, "{}", serde_json::json!({ "gap": g })),
                Some(h) => writeln!(self.out, "{}", serde_json::json!({ "gap": g, "host": h })),
            },
            _ => writeln!(
                self.out,
                "-- {} events lost{on} on cpu {} ({}, sequences {}..={}) between {} and {} --",
                g.lost,
                g.cpu,
                g.reason,
                g.from_seq,
                g.to_seq,
                if g.ts_before > 0 {
                    time(g.ts_before)
                } else {
                    "the ring's start".to_string()
                },
                time(g.detected_at)
            ),
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_from_producers_are_escaped() {
        assert_eq!(clean("plain ✓"), "plain ✓");
        assert_eq!(clean("a\x1b[2Jb\nc"), "a\\u{1b}[2Jb\\u{a}c");
    }
}
