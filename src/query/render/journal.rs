//! journalctl's output formats: `short` and its kin, `cat`, `verbose`,
//! `json` and `json-pretty`.
//!
//! The JSON object of an event (documented in docs/guide/queries.md): the
//! event's columns, `hostname` (the host that stored it: `HostName`, or a
//! fleet row's host, which is also given as `host`), and `fields` as an
//! object (`{}` when the event has none). Fields whose stored text is not
//! a JSON object (a foreign or damaged file) are given as that text in
//! `fields_text`, beside an empty `fields`.

use super::{clean, json_safe, level_name, Format, Renderer};
use crate::store::rows::EventRow;
use serde::Serialize;
use serde_json::value::RawValue;
use std::io::Write;

/// An event as `--output json` prints it, its fields borrowed as written.
#[derive(Serialize)]
struct JsonEvent<'a, F: Serialize> {
    ts: i64,
    hostname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    cpu: u32,
    seq: u64,
    ring_epoch: i64,
    pid: u32,
    tid: u32,
    uid: u32,
    level: u8,
    provider: &'a str,
    name: &'a str,
    message: &'a str,
    fields: F,
    #[serde(skip_serializing_if = "Option::is_none")]
    fields_text: Option<&'a str>,
}

impl<'a, F: Serialize> JsonEvent<'a, F> {
    fn of(
        e: &'a EventRow,
        hostname: &'a str,
        host: Option<&'a str>,
        fields: F,
        fields_text: Option<&'a str>,
    ) -> Self {
        JsonEvent {
            ts: e.ts,
            hostname,
            host,
            cpu: e.cpu,
            seq: e.seq,
            ring_epoch: e.ring_epoch,
            pid: e.pid,
            tid: e.tid,
            uid: e.uid,
            level: e.level,
            provider: &e.provider,
            name: &e.name,
            message: &e.message,
            fields,
            fields_text,
        }
    }
}

/// The stored fields text, if it is a JSON object.
fn fields_object(text: Option<&str>) -> Option<&RawValue> {
    let raw: &RawValue = serde_json::from_str(text?).ok()?;
    raw.get().starts_with('{').then_some(raw)
}

impl<W: Write> Renderer<W> {
    /// An event in one of journalctl's formats.
    pub(super) fn journal(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        match self.format {
            Format::Cat => {
                let (on, off) = self.colours(e.level);
                writeln!(self.out, "{on}{}{off}", clean(&e.message))
            }
            Format::Json | Format::JsonPretty => self.json(host, e),
            Format::Verbose => self.verbose(host, e),
            _ => self.short(host, e),
        }
    }

    /// `TIME HOST PROVIDER[PID]: MESSAGE`, as journalctl's `short`: the
    /// provider stands where journalctl puts the syslog identifier; no
    /// `[PID]` when the pid is 0 (unknown).
    fn short(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        let (on, off) = self.colours(e.level);
        let host = clean(host.unwrap_or(&self.hostname)).into_owned();
        let pid = if e.pid == 0 {
            String::new()
        } else {
            format!("[{}]", e.pid)
        };
        writeln!(
            self.out,
            "{} {host} {}{pid}: {on}{}{off}",
            self.time_of(e.ts),
            clean(&e.provider),
            clean(&e.message)
        )
    }

    fn json(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        let stored = fields_object(e.fields.as_deref());
        let empty: &RawValue = serde_json::from_str("{}")?;
        let fields_text = match stored {
            None => e.fields.as_deref().filter(|t| !t.is_empty()),
            Some(_) => None,
        };
        let fields = stored.unwrap_or(empty);
        let hostname = host.unwrap_or(&self.hostname);
        let line = match self.format {
            // Pretty: the fields parsed, so that they are indented too.
            Format::JsonPretty => {
                let value: serde_json::Value = serde_json::from_str(fields.get())?;
                let event = JsonEvent::of(e, hostname, host, value, fields_text);
                serde_json::to_string_pretty(&event)?
            }
            // Otherwise as stored: its keys in their order, its numbers as
            // written.
            _ => serde_json::to_string(&JsonEvent::of(e, hostname, host, fields, fields_text))?,
        };
        writeln!(self.out, "{}", json_safe(line))
    }

    /// journalctl's `verbose`: the time and the event's cursor (usable
    /// with `--cursor`), then every column and every field, one per line,
    /// `KEY=VALUE`, fields as `fields.KEY` (a string as it is, any other
    /// value as JSON).
    fn verbose(&mut self, host: Option<&str>, e: &EventRow) -> std::io::Result<()> {
        use super::super::when::{format, Style};
        let cursor = match host {
            None => format!(" [{}]", e.cursor().token()),
            Some(_) => String::new(),
        };
        writeln!(
            self.out,
            "{}{cursor}",
            format(e.ts, &self.zone, Style::Verbose)
        )?;
        let host = host.unwrap_or(&self.hostname).to_string();
        let level = format!("{} ({})", e.level, level_name(e.level));
        let columns: [(&str, &dyn std::fmt::Display); 12] = [
            ("hostname", &host),
            ("ts", &e.ts),
            ("cpu", &e.cpu),
            ("seq", &e.seq),
            ("ring_epoch", &e.ring_epoch),
            ("pid", &e.pid),
            ("tid", &e.tid),
            ("uid", &e.uid),
            ("level", &level),
            ("provider", &e.provider),
            ("name", &e.name),
            ("message", &e.message),
        ];
        for (key, value) in columns {
            writeln!(self.out, "    {key}={}", clean(&value.to_string()))?;
        }
        let fields = e.fields.as_deref().filter(|t| !t.is_empty());
        let parsed = fields.and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok());
        match (fields, parsed) {
            (_, Some(serde_json::Value::Object(map))) => {
                for (key, value) in map {
                    let text = match value {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    writeln!(self.out, "    fields.{}={}", clean(&key), clean(&text))?;
                }
            }
            (Some(text), _) => writeln!(self.out, "    fields_text={}", clean(text))?,
            (None, _) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::tz::TimeZone;

    fn event(fields: Option<&str>) -> EventRow {
        EventRow {
            // 2026-12-04T12:00:01.5Z
            ts: 1_796_385_601_500_000_000,
            cpu: 1_048_576,
            seq: 7,
            ring_epoch: 3,
            pid: 4242,
            tid: 4243,
            uid: 33,
            level: 4,
            provider: "nginx".into(),
            name: "message".into(),
            message: "slow upstream\u{1b}[2J".into(),
            fields: fields.map(str::to_string),
        }
    }

    fn render(format: Format, host: Option<&str>, e: &EventRow) -> String {
        let mut out = Vec::new();
        let zone = TimeZone::posix("CET-1CEST,M3.5.0,M10.5.0/3").unwrap();
        Renderer::new(&mut out, format, false)
            .in_zone(zone)
            .on_host("web01")
            .event_from(host, e)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn short_formats_print_local_time_host_and_identifier() {
        let e = event(None);
        let cases = [
            (Format::Short, "Dec 04 13:00:01"),
            (Format::ShortPrecise, "Dec 04 13:00:01.500000"),
            (Format::ShortIso, "2026-12-04T13:00:01+01:00"),
            (Format::ShortIsoPrecise, "2026-12-04T13:00:01.500000+01:00"),
        ];
        for (format, time) in cases {
            assert_eq!(
                render(format, None, &e),
                format!("{time} web01 nginx[4242]: slow upstream\\u{{1b}}[2J\n")
            );
        }
        assert_eq!(
            render(Format::Short, Some("db02"), &event(None)),
            "Dec 04 13:00:01 db02 nginx[4242]: slow upstream\\u{1b}[2J\n"
        );
        assert_eq!(render(Format::Cat, None, &e), "slow upstream\\u{1b}[2J\n");
    }

    #[test]
    fn json_has_fields_as_an_object_and_the_host_name() {
        let e = event(Some(r#"{"unit":"nginx.service","n":12345678901234567890}"#));
        let line = render(Format::Json, None, &e);
        assert_eq!(line.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["hostname"], "web01");
        assert_eq!(v["fields"]["unit"], "nginx.service");
        assert!(line.contains(r#""n":12345678901234567890"#), "{line}");
        assert_eq!(v["message"], "slow upstream\u{1b}[2J");
        assert_eq!(v["level"], 4);
        assert!(v.get("host").is_none());
        let v: serde_json::Value =
            serde_json::from_str(&render(Format::Json, Some("db02"), &e)).unwrap();
        assert_eq!(
            (v["hostname"].as_str(), v["host"].as_str()),
            (Some("db02"), Some("db02"))
        );
        // No fields: an empty object; not JSON: the text beside it.
        let v: serde_json::Value =
            serde_json::from_str(&render(Format::Json, None, &event(None))).unwrap();
        assert_eq!(v["fields"], serde_json::json!({}));
        let v: serde_json::Value =
            serde_json::from_str(&render(Format::Json, None, &event(Some("not json")))).unwrap();
        assert_eq!(v["fields"], serde_json::json!({}));
        assert_eq!(v["fields_text"], "not json");
        let pretty = render(Format::JsonPretty, None, &e);
        assert!(pretty.lines().count() > 10, "{pretty}");
        let back: serde_json::Value = serde_json::from_str(&pretty).unwrap();
        assert_eq!(back["fields"]["unit"], "nginx.service");
    }

    #[test]
    fn verbose_lists_every_column_and_field() {
        let e = event(Some(r#"{"unit":"nginx.service","n":3,"evil":"a\nb"}"#));
        let text = render(Format::Verbose, None, &e);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Fri 2026-12-04 13:00:01.500000 CET [1796385601500000000.1048576.7.3]"
        );
        for want in [
            "    hostname=web01",
            "    pid=4242",
            "    level=4 (warning)",
            "    provider=nginx",
            "    message=slow upstream\\u{1b}[2J",
            "    fields.unit=nginx.service",
            "    fields.n=3",
            "    fields.evil=a\\u{a}b",
        ] {
            assert!(lines.contains(&want), "{want} not in {text}");
        }
        assert_eq!(lines.len(), 1 + 12 + 3, "{text}");
    }
}
