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
    /// Events whose level number is at least this (this severity or less
    /// severe); with `level`, a range (`-p warning..err`: 3 to 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level_min: Option<u8>,
    pub provider: Option<String>,
    /// Events of any of these providers (`-t` given more than once).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<String>,
    /// Events eventd vouches for (from its own rings) of any of these
    /// units: `fields.unit` equal to the name, or matching it as a glob
    /// when it holds `*`, `?` or `[`. Names come complete (see
    /// [`unit_pattern`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    /// Only the kernel's log: provider `kernel` from eventd's own rings,
    /// `fields.transport` = `kernel`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
    pub name: Option<String>,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    /// Substring of the message (case-sensitive).
    pub text: Option<String>,
    /// A regular expression (the `regex` crate's syntax) the message
    /// matches somewhere; `(?i)` at its start makes it case-insensitive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grep: Option<String>,
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

/// The lowest `cpu` of eventd's own rings (the syslog ring; the kernel's
/// comes after it). Producers' rings are numbered by CPU, far below: an
/// event with `cpu` at least this was written by eventd itself, and only
/// those carry metadata eventd vouches for (`unit`, `transport`, `comm`,
/// `exe`, `gid`, `boot_id` in `fields`).
pub const OWN_RINGS_FROM: u32 = crate::rings::SYSLOG_RING_CPU;

/// The suffixes of systemd's unit types.
const UNIT_SUFFIXES: [&str; 11] = [
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
];

/// Whether a unit pattern is a glob (unit names never hold these).
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// A unit as `-u` takes it, completed as journalctl does: a glob is used
/// as it is, a name without a unit type's suffix gets `.service`.
pub fn unit_pattern(name: &str) -> String {
    if is_glob(name) || UNIT_SUFFIXES.iter().any(|s| name.ends_with(s)) {
        name.to_string()
    } else {
        format!("{name}.service")
    }
}

/// `pattern` as `--grep` sends it: case-insensitive (`(?i)` prepended)
/// when `case_sensitive` says so, or, when it says nothing, when the
/// pattern has no upper-case letter (smart case, as journalctl). A letter
/// right after a backslash is an escape (`\S`, `\W`), not text, and does
/// not count.
pub fn grep_pattern(pattern: &str, case_sensitive: Option<bool>) -> String {
    let sensitive = case_sensitive.unwrap_or_else(|| {
        let mut escaped = false;
        pattern.chars().any(|c| {
            let upper = !escaped && c.is_uppercase();
            escaped = !escaped && c == '\\';
            upper
        })
    });
    if sensitive {
        pattern.to_string()
    } else {
        format!("(?i){pattern}")
    }
}

/// Largest compiled `--grep` pattern (the `regex` crate's size limit): a
/// pattern from any querying user is compiled in the daemon.
pub const GREP_COMPILED_MAX: usize = 1 << 20;

/// Compiles a `--grep` pattern; the error says what is wrong with it.
pub fn compile_grep(pattern: &str) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(GREP_COMPILED_MAX)
        .build()
        .map_err(|e| format!("--grep pattern {pattern:?}: {e}"))
}

/// Makes `REGEXP` work on a query connection: `X REGEXP P` is SQLite's
/// call of `regexp(P, X)`. The pattern is compiled once per statement run
/// (SQLite keeps it beside the statement while its argument is the same
/// parameter), so once per page of a shard.
pub fn register_functions(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "regexp",
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let re = ctx.get_or_create_aux(0, |v| {
                let pattern = v.as_str()?;
                compile_grep(pattern).map_err(|e| rusqlite::Error::UserFunctionError(e.into()))
            })?;
            Ok(match ctx.get_raw(1) {
                rusqlite::types::ValueRef::Text(t) => {
                    std::str::from_utf8(t).is_ok_and(|text| re.is_match(text))
                }
                _ => false,
            })
        },
    )
}

/// Numbered terms and their parameters, built up term by term.
#[derive(Default)]
struct Terms {
    terms: Vec<String>,
    params: Vec<rusqlite::types::Value>,
}

impl Terms {
    /// A parameter's placeholder (`?N`).
    fn param(&mut self, value: rusqlite::types::Value) -> String {
        self.params.push(value);
        format!("?{}", self.params.len())
    }

    /// A term with one `?`, numbered.
    fn add(&mut self, term: &str, value: rusqlite::types::Value) {
        let p = self.param(value);
        self.terms.push(term.replace('?', &p));
    }

    /// `cpu` from eventd's own rings: what it vouches for.
    fn own_rings(&mut self) {
        self.add("cpu >= ?", i64::from(OWN_RINGS_FROM).into());
    }
}

impl Filter {
    /// Whether the filter can run: its `--grep` pattern compiles, its
    /// levels are levels. The message says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if let Some(level) = self
            .level
            .into_iter()
            .chain(self.level_min)
            .find(|&l| l > 7)
        {
            return Err(format!("level {level}: levels are 0 (emerg) to 7 (debug)"));
        }
        if let Some(pattern) = &self.grep {
            compile_grep(pattern)?;
        }
        Ok(())
    }

    /// The filters (not the cursor, order or limit) as SQL over `events`.
    pub fn sql(&self) -> Sql {
        use rusqlite::types::Value;
        let mut t = Terms::default();
        if let Some(v) = self.since_ns {
            t.add("ts >= ?", Value::Integer(v));
        }
        if let Some(v) = self.until_ns {
            t.add("ts < ?", Value::Integer(v));
        }
        if let Some(v) = self.cpu {
            t.add("cpu = ?", Value::Integer(v.into()));
        }
        // `+`: never from an index on level (one an operator made): a
        // range of levels read from it comes out of time order and is
        // sorted whole; the time index in order, tested row by row,
        // reaches the first results at once.
        if let Some(v) = self.level {
            t.add("+level <= ?", Value::Integer(v.into()));
        }
        if let Some(v) = self.level_min {
            t.add("+level >= ?", Value::Integer(v.into()));
        }
        if let Some(v) = &self.provider {
            t.add("provider = ?", Value::Text(v.clone()));
        }
        if !self.providers.is_empty() {
            // `+` as for levels: several providers read from the
            // provider index come out of time order.
            let list: Vec<String> = self
                .providers
                .iter()
                .map(|p| t.param(Value::Text(p.clone())))
                .collect();
            t.terms.push(format!("+provider IN ({})", list.join(", ")));
        }
        self.trusted_terms(&mut t);
        if let Some(v) = &self.name {
            t.add("name = ?", Value::Text(v.clone()));
        }
        if let Some(v) = self.pid {
            t.add("pid = ?", Value::Integer(v.into()));
        }
        if let Some(v) = self.uid {
            t.add("uid = ?", Value::Integer(v.into()));
        }
        if let Some(v) = &self.text {
            t.add("instr(message, ?) > 0", Value::Text(v.clone()));
        }
        if let Some(v) = &self.grep {
            t.add("message REGEXP ?", Value::Text(v.clone()));
        }
        self.field_terms(&mut t);
        Sql {
            clause: if t.terms.is_empty() {
                "1".to_string()
            } else {
                t.terms.join(" AND ")
            },
            params: t.params,
        }
    }

    /// `--field KEY=VALUE` terms, each on the row's JSON fields.
    fn field_terms(&self, t: &mut Terms) {
        use rusqlite::types::Value;
        for (key, value) in &self.fields {
            if crate::store::indexes::plain_field_key(key) {
                // Word for word the expression of a `fields.KEY` query
                // index, so that SQLite uses one where the shard has it.
                let expr = crate::store::indexes::field_expr(key);
                t.add(&format!("{expr} = ?"), Value::Text(value.clone()));
                continue;
            }
            // Any other key: the path is a parameter too, `$."key"` with
            // quotes escaped.
            let path = format!("$.\"{}\"", key.replace('"', "\"\""));
            let p = t.param(Value::Text(path));
            let v = t.param(Value::Text(value.clone()));
            // Rows whose fields are not valid JSON (a foreign or damaged
            // file) simply do not match, instead of failing the query.
            t.terms.push(format!(
                "CASE WHEN json_valid(fields) THEN CAST(json_extract(fields, {p}) AS TEXT) END = {v}"
            ));
        }
    }

    /// `-u` and `-k`: metadata only eventd's own rings can vouch for, so
    /// each also asks for `cpu` from those rings (a producer may write any
    /// `unit` into its fields).
    fn trusted_terms(&self, t: &mut Terms) {
        use crate::store::indexes::field_expr;
        use rusqlite::types::Value;
        if !self.units.is_empty() {
            t.own_rings();
            // The index expression of `fields.unit`, word for word.
            let expr = field_expr("unit");
            let each: Vec<String> = self
                .units
                .iter()
                .map(|u| {
                    let op = if is_glob(u) { "GLOB" } else { "=" };
                    format!("{expr} {op} {}", t.param(Value::Text(u.clone())))
                })
                .collect();
            t.terms.push(format!("({})", each.join(" OR ")));
        }
        if self.kernel {
            t.own_rings();
            t.add("provider = ?", Value::Text("kernel".into()));
            t.add(
                &format!("{} = ?", field_expr("transport")),
                Value::Text("kernel".into()),
            );
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

    #[test]
    fn units_are_completed_as_journalctl_completes_them() {
        assert_eq!(unit_pattern("nginx"), "nginx.service");
        assert_eq!(unit_pattern("nginx.service"), "nginx.service");
        assert_eq!(unit_pattern("sshd.socket"), "sshd.socket");
        assert_eq!(unit_pattern("user@1000"), "user@1000.service");
        assert_eq!(unit_pattern("nginx*"), "nginx*");
        assert_eq!(unit_pattern("a.b"), "a.b.service");
    }

    #[test]
    fn grep_is_case_insensitive_unless_the_pattern_has_a_capital() {
        assert_eq!(grep_pattern("disk", None), "(?i)disk");
        assert_eq!(grep_pattern("Disk", None), "Disk");
        assert_eq!(grep_pattern(r"\S+ full", None), r"(?i)\S+ full");
        assert_eq!(grep_pattern("Disk", Some(false)), "(?i)Disk");
        assert_eq!(grep_pattern("disk", Some(true)), "disk");
        assert!(compile_grep("(unclosed").unwrap_err().contains("(unclosed"));
        let f = Filter {
            grep: Some("[".into()),
            ..Filter::default()
        };
        assert!(f.check().is_err());
        let f = Filter {
            level_min: Some(9),
            ..Filter::default()
        };
        assert!(f.check().unwrap_err().contains("level 9"));
    }

    /// Each new filter on a real shard: the rows it selects, by message.
    #[test]
    fn journalctl_filters_select_exactly_their_rows_in_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::store::open_shard(&dir.path().join("shard-000.db")).unwrap();
        let own = i64::from(OWN_RINGS_FROM);
        // (cpu, level, provider, message, fields)
        let rows: [(i64, i64, &str, &str, &str); 8] = [
            (own, 6, "nginx", "own nginx", r#"{"unit":"nginx.service"}"#),
            (0, 6, "nginx", "forged nginx", r#"{"unit":"nginx.service"}"#),
            (own, 6, "web", "own web-1", r#"{"unit":"web-1.socket"}"#),
            (
                own + 1,
                3,
                "kernel",
                "kernel Disk error",
                r#"{"transport":"kernel"}"#,
            ),
            (2, 3, "kernel", "forged kernel", r#"{"transport":"kernel"}"#),
            (1, 4, "app", "warning DISK low", "{}"),
            (1, 2, "app", "crit disk gone", "not json"),
            (1, 7, "other", "debug", ""),
        ];
        for (k, (cpu, level, provider, message, fields)) in rows.iter().enumerate() {
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![
                    k as i64,
                    cpu,
                    k as i64,
                    1i64,
                    1,
                    1,
                    0,
                    level,
                    provider,
                    "n",
                    message,
                    (!fields.is_empty()).then_some(*fields)
                ],
            )
            .unwrap();
        }
        let select = |f: Filter| -> Vec<String> {
            f.check().unwrap();
            let mut fan = crate::query::FanOut::open(dir.path(), f, None).unwrap();
            let found = std::iter::from_fn(|| fan.next_event().map(|e| e.message)).collect();
            assert!(fan.warnings.is_empty(), "{:?}", fan.warnings);
            found
        };
        let units = |u: &[&str]| Filter {
            units: u.iter().map(|u| unit_pattern(u)).collect(),
            ..Filter::default()
        };
        assert_eq!(select(units(&["nginx"])), ["own nginx"]);
        assert_eq!(select(units(&["web*"])), ["own web-1"]);
        assert_eq!(
            select(units(&["nginx", "web-1.socket"])),
            ["own nginx", "own web-1"]
        );
        let kernel = Filter {
            kernel: true,
            ..Filter::default()
        };
        assert_eq!(select(kernel), ["kernel Disk error"]);
        let range = Filter {
            level: Some(4),
            level_min: Some(3),
            ..Filter::default()
        };
        assert_eq!(
            select(range),
            ["kernel Disk error", "forged kernel", "warning DISK low"]
        );
        let grep = |p: &str| Filter {
            grep: Some(grep_pattern(p, None)),
            ..Filter::default()
        };
        assert_eq!(
            select(grep("disk")),
            ["kernel Disk error", "warning DISK low", "crit disk gone"]
        );
        assert_eq!(select(grep("DISK")), ["warning DISK low"]);
        assert_eq!(
            select(grep("^(own|forged) n")),
            ["own nginx", "forged nginx"]
        );
        let providers = Filter {
            providers: vec!["web".into(), "other".into()],
            ..Filter::default()
        };
        assert_eq!(select(providers), ["own web-1", "debug"]);
    }
}
