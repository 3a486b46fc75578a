//! What a query asks for, and the SQL that filters it in each shard.

pub use crate::store::rows::{Cursor, GapCursor};
use serde::{Deserialize, Serialize};

/// Oldest first (ascending `(ts, cpu, seq, ring_epoch)`) or newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    #[default]
    OldestFirst,
    NewestFirst,
}

/// What `eventctl` prints as `--cursor TOKEN`: where a page's events and
/// its gaps ended. The token is `EVENTS:GAPS`, each part four numbers
/// joined by dots, or `_` when that listing has no position yet (not `-`,
/// which the command line would take for an option); a token
/// without `:` is the older events-only form, and its gaps start from the
/// beginning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PageCursor {
    pub events: Option<Cursor>,
    pub gaps: Option<GapCursor>,
}

impl PageCursor {
    pub fn token(&self) -> String {
        let events = self.events.map_or_else(|| "_".to_string(), |c| c.token());
        match self.gaps {
            Some(g) => format!("{events}:{}", g.token()),
            None => events,
        }
    }

    pub fn parse(token: &str) -> Option<PageCursor> {
        let (events, gaps) = match token.split_once(':') {
            Some((e, g)) => (e, Some(GapCursor::parse(g)?)),
            None => (token, None),
        };
        let events = match events {
            "_" => None,
            e => Some(Cursor::parse(e)?),
        };
        if events.is_none() && gaps.is_none() {
            return None;
        }
        Some(PageCursor { events, gaps })
    }
}

/// A query's filters. Every field is optional; an empty filter matches
/// every event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Filter {
    /// Events at or after this time (ns since the Unix epoch).
    pub since_ns: Option<i64>,
    /// Events before this time (ns).
    pub until_ns: Option<i64>,
    pub cpu: Option<u32>,
    /// Syslog level at or above this severity (0 emerg .. 7 debug): events
    /// whose level number is at most this.
    pub level: Option<u8>,
    pub provider: Option<String>,
    pub name: Option<String>,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    /// Substring of the message (case-sensitive).
    pub text: Option<String>,
    /// Structured field equality: `fields.key == value` (as text).
    pub fields: Vec<(String, String)>,
    pub order: Order,
    /// Continue after this cursor (from a previous page).
    pub after: Option<Cursor>,
    /// Continue the gap listing after this gap cursor (from a previous
    /// page's `end` line); unset, gaps start from the first.
    pub gaps_after: Option<GapCursor>,
    /// At most this many events, and at most this many gaps, per page (all
    /// when unset).
    pub limit: Option<u64>,
}

/// A SQL `WHERE` clause and its parameters.
pub struct Sql {
    pub clause: String,
    pub params: Vec<rusqlite::types::Value>,
}

impl Filter {
    /// The filters (not the cursor, order or limit) as SQL over `events`.
    pub fn sql(&self) -> Sql {
        use rusqlite::types::Value;
        let mut terms: Vec<String> = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        let mut add = |term: &str, value: Value| {
            params.push(value);
            terms.push(term.replace('?', &format!("?{}", params.len())));
        };
        if let Some(v) = self.since_ns {
            add("ts >= ?", Value::Integer(v));
        }
        if let Some(v) = self.until_ns {
            add("ts < ?", Value::Integer(v));
        }
        if let Some(v) = self.cpu {
            add("cpu = ?", Value::Integer(v.into()));
        }
        if let Some(v) = self.level {
            // `+`: never from an index on level (one an operator made):
            // a range of levels read from it comes out of time order and
            // is sorted whole; the time index in order, tested row by row,
            // reaches the first results at once.
            add("+level <= ?", Value::Integer(v.into()));
        }
        if let Some(v) = &self.provider {
            add("provider = ?", Value::Text(v.clone()));
        }
        if let Some(v) = &self.name {
            add("name = ?", Value::Text(v.clone()));
        }
        if let Some(v) = self.pid {
            add("pid = ?", Value::Integer(v.into()));
        }
        if let Some(v) = self.uid {
            add("uid = ?", Value::Integer(v.into()));
        }
        if let Some(v) = &self.text {
            add("instr(message, ?) > 0", Value::Text(v.clone()));
        }
        for (key, value) in &self.fields {
            if crate::store::indexes::plain_field_key(key) {
                // Word for word the expression of a `fields.KEY` query
                // index, so that SQLite uses one where the shard has it.
                let expr = crate::store::indexes::field_expr(key);
                params.push(Value::Text(value.clone()));
                terms.push(format!("{expr} = ?{}", params.len()));
                continue;
            }
            // Any other key: the path is a parameter too, `$."key"` with
            // quotes escaped.
            let path = format!("$.\"{}\"", key.replace('"', "\"\""));
            params.push(Value::Text(path));
            let p = params.len();
            params.push(Value::Text(value.clone()));
            let v = params.len();
            // Rows whose fields are not valid JSON (a foreign or damaged
            // file) simply do not match, instead of failing the query.
            terms.push(format!(
                "CASE WHEN json_valid(fields) THEN CAST(json_extract(fields, ?{p}) AS TEXT) END = ?{v}"
            ));
        }
        Sql {
            clause: if terms.is_empty() {
                "1".to_string()
            } else {
                terms.join(" AND ")
            },
            params,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_tokens_round_trip_and_reject_junk() {
        let c = Cursor {
            ts: 1_700_000_000_000_000_000,
            cpu: 3,
            seq: 42,
            ring_epoch: -5,
        };
        assert_eq!(Cursor::parse(&c.token()), Some(c));
        for bad in ["", "1.2.3", "1.2.3.4.5", "a.b.c.d", "1.-2.3.4"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn page_tokens_carry_both_cursors_and_old_tokens_still_parse() {
        let events = Cursor {
            ts: 17,
            cpu: 1,
            seq: 2,
            ring_epoch: -3,
        };
        let gaps = GapCursor {
            detected_at: 99,
            cpu: 4,
            from_seq: 5,
            ring_epoch: 6,
        };
        for page in [
            PageCursor {
                events: Some(events),
                gaps: Some(gaps),
            },
            PageCursor {
                events: None,
                gaps: Some(gaps),
            },
            PageCursor {
                events: Some(events),
                gaps: None,
            },
        ] {
            assert_eq!(PageCursor::parse(&page.token()), Some(page), "{page:?}");
        }
        // The events-only token of earlier versions.
        assert_eq!(
            PageCursor::parse("17.1.2.-3"),
            Some(PageCursor {
                events: Some(events),
                gaps: None
            })
        );
        for bad in [
            "",
            "_",
            "_:",
            "-:1.2.3.4",
            "1.2.3.4:",
            "1.2.3.4:1.2.3",
            ":1.2.3.4",
            "x:1.2.3.4",
        ] {
            assert_eq!(PageCursor::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn filters_become_numbered_parameters() {
        let f = Filter {
            since_ns: Some(10),
            level: Some(3),
            text: Some("disk".into()),
            fields: vec![("unit".into(), "sda".into()), ("a key".into(), "x".into())],
            ..Filter::default()
        };
        let sql = f.sql();
        assert_eq!(
            sql.clause,
            "ts >= ?1 AND +level <= ?2 AND instr(message, ?3) > 0 AND \
             CASE WHEN json_valid(fields) THEN CAST(json_extract(fields, '$.\"unit\"') AS TEXT) END = ?4 \
             AND CASE WHEN json_valid(fields) THEN CAST(json_extract(fields, ?5) AS TEXT) END = ?6"
        );
        assert_eq!(sql.params.len(), 6);
        assert_eq!(Filter::default().sql().clause, "1");
    }
}
