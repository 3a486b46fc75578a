//! `eventctl query --cluster URL`: the filters of `eventctl query` as
//! ClickHouse SQL over the Distributed tables, for every host at once.
//!
//! Events come in `(ts, host, cpu, seq, ring_epoch)` order (newest first
//! with `--reverse`): the local order with the host as the tie-breaker
//! after the time. Results are read in pages of [`PAGE_ROWS`] with a
//! keyset on that order (so memory stays bounded whatever the window), as
//! RowBinary. Gaps are those whose span meets the window, per host, in
//! `(detected_at, host, cpu, from_seq, ring_epoch)` order.

use super::clickhouse::{ClickHouseError, Client};
use super::format::{DecodeError, Reader, EVENT_READ_COLUMNS, GAP_READ_COLUMNS};
use super::literal::{ident, quote};
use crate::query::filter::{is_glob, OWN_RINGS_FROM};
use crate::query::{Filter, Order};
use crate::store::rows::{EventRow, GapRow};

/// Rows fetched per request.
pub const PAGE_ROWS: u64 = 10_000;

/// Where a fleet page ended, per listing: the last row's sort key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetCursor {
    pub events: Option<(i64, String, u32, u64, i64)>,
    pub gaps: Option<(i64, String, u32, u64, i64)>,
}

fn key_token(k: &(i64, String, u32, u64, i64)) -> String {
    let hex: String = k.1.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{}.{}.{}.{}.{}", k.0, k.2, k.3, k.4, hex)
}

fn parse_key(text: &str) -> Option<(i64, String, u32, u64, i64)> {
    let mut p = text.split('.');
    let (t, c, s, e, h) = (p.next()?, p.next()?, p.next()?, p.next()?, p.next()?);
    if p.next().is_some() || h.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect();
    Some((
        t.parse().ok()?,
        String::from_utf8(bytes?).ok()?,
        c.parse().ok()?,
        s.parse().ok()?,
        e.parse().ok()?,
    ))
}

impl FleetCursor {
    /// `EVENTS:GAPS`, each five fields (the fifth the host, hex), `_` for a
    /// listing with no position.
    pub fn token(&self) -> String {
        let part = |k: &Option<_>| k.as_ref().map_or_else(|| "_".to_string(), key_token);
        format!("{}:{}", part(&self.events), part(&self.gaps))
    }

    pub fn parse(token: &str) -> Option<FleetCursor> {
        let (e, g) = token.split_once(':')?;
        let part = |t: &str| match t {
            "_" => Some(None),
            t => parse_key(t).map(Some),
        };
        let cursor = FleetCursor {
            events: part(e)?,
            gaps: part(g)?,
        };
        (cursor.events.is_some() || cursor.gaps.is_some()).then_some(cursor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(transparent)]
    ClickHouse(#[from] ClickHouseError),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// One fleet query.
pub struct FleetQuery<'a> {
    pub client: &'a Client,
    pub database: &'a str,
    pub filter: &'a Filter,
    /// Only these hosts (all when empty).
    pub hosts: &'a [String],
    pub cursor: FleetCursor,
}

/// `(a, b, ...) > (x, y, ...)` spelled out term by term (`<` for newest
/// first), for servers without tuple comparison.
fn after(columns: &[&str], values: &[String], cmp: &str) -> String {
    match (columns.split_first(), values.split_first()) {
        (Some((c, [])), Some((v, _))) => format!("{c} {cmp} {v}"),
        (Some((c, cs)), Some((v, vs))) => {
            format!("({c} {cmp} {v} OR ({c} = {v} AND {}))", after(cs, vs, cmp))
        }
        _ => "1".to_string(),
    }
}

/// `-u` and `-k` over the fleet: as in each host's store, only events of
/// eventd's own rings (`cpu` from [`OWN_RINGS_FROM`]) vouch for them.
fn trusted_terms(f: &Filter, terms: &mut Vec<String>) {
    let own = format!("cpu >= {OWN_RINGS_FROM}");
    if !f.units.is_empty() {
        terms.push(own.clone());
        let each: Vec<String> = f
            .units
            .iter()
            .map(|u| {
                let unit = "visitParamExtractString(fields, 'unit')";
                if is_glob(u) {
                    format!("match({unit}, {})", quote(&glob_regex(u)))
                } else {
                    format!("{unit} = {}", quote(u))
                }
            })
            .collect();
        terms.push(format!("({})", each.join(" OR ")));
    }
    if f.kernel {
        terms.push(own);
        terms.push("provider = 'kernel'".to_string());
        terms.push("visitParamExtractString(fields, 'transport') = 'kernel'".to_string());
    }
}

/// A glob as SQLite's GLOB reads it (`*`, `?`, `[...]`, `[^...]`), as an
/// anchored regular expression for ClickHouse's `match`.
fn glob_regex(glob: &str) -> String {
    let mut re = String::from("^");
    let mut in_class = false;
    for c in glob.chars() {
        match c {
            ']' if in_class => {
                in_class = false;
                re.push(']');
            }
            _ if in_class => {
                if c == '\\' {
                    re.push('\\');
                }
                re.push(c);
            }
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '[' => {
                in_class = true;
                re.push('[');
            }
            _ => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    if in_class {
        // An unclosed class matches nothing in SQLite either.
        return "^$.".to_string();
    }
    re.push('$');
    re
}

impl FleetQuery<'_> {
    fn host_terms(&self, terms: &mut Vec<String>) {
        if !self.hosts.is_empty() {
            let list: Vec<String> = self.hosts.iter().map(|h| quote(h)).collect();
            terms.push(format!("host IN ({})", list.join(", ")));
        }
    }

    /// The filters as a ClickHouse `WHERE` over `events`.
    pub fn event_terms(&self) -> Vec<String> {
        let f = self.filter;
        let mut terms = Vec::new();
        if let Some(v) = f.since_ns {
            terms.push(format!("ts >= {v}"));
        }
        if let Some(v) = f.until_ns {
            terms.push(format!("ts < {v}"));
        }
        if let Some(v) = f.cpu {
            terms.push(format!("cpu = {v}"));
        }
        if let Some(v) = f.level {
            terms.push(format!("level <= {v}"));
        }
        if let Some(v) = f.level_min {
            terms.push(format!("level >= {v}"));
        }
        if let Some(v) = &f.provider {
            terms.push(format!("provider = {}", quote(v)));
        }
        if !f.providers.is_empty() {
            let list: Vec<String> = f.providers.iter().map(|p| quote(p)).collect();
            terms.push(format!("provider IN ({})", list.join(", ")));
        }
        trusted_terms(f, &mut terms);
        if let Some(v) = &f.name {
            terms.push(format!("name = {}", quote(v)));
        }
        if let Some(v) = f.pid {
            terms.push(format!("pid = {v}"));
        }
        if let Some(v) = f.uid {
            terms.push(format!("uid = {v}"));
        }
        if let Some(v) = &f.text {
            terms.push(format!("position(message, {}) > 0", quote(v)));
        }
        if let Some(v) = &f.grep {
            // re2's syntax, which the patterns people write share with
            // the regex crate's (see docs/guide/queries.md).
            terms.push(format!("match(message, {})", quote(v)));
        }
        for (key, value) in &f.fields {
            // A string field compares unquoted, any other value as written
            // (as the local query's CAST of json_extract does).
            terms.push(format!(
                "(visitParamExtractString(fields, {k}) = {v} OR \
                 visitParamExtractRaw(fields, {k}) = {v})",
                k = quote(key),
                v = quote(value)
            ));
        }
        self.host_terms(&mut terms);
        terms
    }

    fn direction(&self) -> (&'static str, &'static str) {
        match self.filter.order {
            Order::OldestFirst => (">", "ASC"),
            Order::NewestFirst => ("<", "DESC"),
        }
    }

    /// The SQL of the next page of events after `last`.
    pub fn events_sql(&self, last: Option<&(i64, String, u32, u64, i64)>, rows: u64) -> String {
        let (cmp, dir) = self.direction();
        let mut terms = self.event_terms();
        if let Some(k) = last {
            let values = [
                k.0.to_string(),
                quote(&k.1),
                k.2.to_string(),
                k.3.to_string(),
                k.4.to_string(),
            ];
            terms.push(after(
                &["ts", "host", "cpu", "seq", "ring_epoch"],
                &values,
                cmp,
            ));
        }
        let clause = if terms.is_empty() {
            "1".to_string()
        } else {
            terms.join(" AND ")
        };
        format!(
            "SELECT {EVENT_READ_COLUMNS} FROM {}.events WHERE {clause} \
             ORDER BY ts {dir}, host {dir}, cpu {dir}, seq {dir}, ring_epoch {dir} \
             LIMIT {rows} FORMAT RowBinary",
            ident(self.database)
        )
    }

    /// The SQL of the next page of gaps after `last`: those detected at or
    /// after the window's start whose last event before them is before its
    /// end.
    pub fn gaps_sql(&self, last: Option<&(i64, String, u32, u64, i64)>, rows: u64) -> String {
        let (cmp, dir) = self.direction();
        let f = self.filter;
        let mut terms = vec![
            format!("detected_at >= {}", f.since_ns.unwrap_or(i64::MIN)),
            format!("ts_before < {}", f.until_ns.unwrap_or(i64::MAX)),
        ];
        if let Some(v) = f.cpu {
            terms.push(format!("cpu = {v}"));
        }
        self.host_terms(&mut terms);
        if let Some(k) = last {
            let values = [
                k.0.to_string(),
                quote(&k.1),
                k.2.to_string(),
                k.3.to_string(),
                k.4.to_string(),
            ];
            terms.push(after(
                &["detected_at", "host", "cpu", "from_seq", "ring_epoch"],
                &values,
                cmp,
            ));
        }
        format!(
            "SELECT {GAP_READ_COLUMNS} FROM {}.gaps WHERE {} \
             ORDER BY detected_at {dir}, host {dir}, cpu {dir}, from_seq {dir}, ring_epoch {dir} \
             LIMIT {rows} FORMAT RowBinary",
            ident(self.database),
            terms.join(" AND ")
        )
    }

    /// Calls `each` with every event (host first), then `each_gap` with
    /// every gap, up to the filter's limit of each; returns the cursor
    /// after the last of each.
    pub fn run(
        mut self,
        mut each: impl FnMut(&str, &EventRow) -> std::io::Result<bool>,
        mut each_gap: impl FnMut(&str, &GapRow) -> std::io::Result<bool>,
    ) -> Result<(FleetCursor, u64, u64), FleetError> {
        let limit = self.filter.limit.unwrap_or(u64::MAX);
        let settings = [("max_result_rows", "0")];
        let mut events = 0u64;
        'events: while events < limit {
            let want = (limit - events).min(PAGE_ROWS);
            let body = self.client.run(
                &self.events_sql(self.cursor.events.as_ref(), want),
                &settings,
            )?;
            let mut reader = Reader::new(&body);
            let mut got = 0;
            while !reader.is_empty() {
                let (host, row) = reader.event()?;
                got += 1;
                events += 1;
                self.cursor.events = Some((row.ts, host.clone(), row.cpu, row.seq, row.ring_epoch));
                if !each(&host, &row).unwrap_or(false) {
                    break 'events;
                }
            }
            if got < want {
                break;
            }
        }
        let mut gaps = 0u64;
        'gaps: while gaps < limit {
            let want = (limit - gaps).min(PAGE_ROWS);
            let body = self
                .client
                .run(&self.gaps_sql(self.cursor.gaps.as_ref(), want), &settings)?;
            let mut reader = Reader::new(&body);
            let mut got = 0;
            while !reader.is_empty() {
                let (host, row) = reader.gap()?;
                got += 1;
                gaps += 1;
                self.cursor.gaps = Some((
                    row.detected_at,
                    host.clone(),
                    row.cpu,
                    row.from_seq,
                    row.ring_epoch,
                ));
                if !each_gap(&host, &row).unwrap_or(false) {
                    break 'gaps;
                }
            }
            if got < want {
                break;
            }
        }
        Ok((self.cursor, events, gaps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_cursors_round_trip_with_any_host_name() {
        let c = FleetCursor {
            events: Some((17, "web-1.example:a".to_string(), 3, 99, -4)),
            gaps: None,
        };
        let t = c.token();
        assert!(!t.contains("example"), "the host is hex: {t}");
        assert_eq!(FleetCursor::parse(&t), Some(c));
        assert_eq!(FleetCursor::parse("_:_"), None);
        assert_eq!(FleetCursor::parse("1.2.3.4"), None);
        assert_eq!(FleetCursor::parse("1.2.3.4.zz:_"), None);
    }

    #[test]
    fn keyset_terms_compare_term_by_term() {
        assert_eq!(
            after(&["a", "b"], &["1".into(), "2".into()], ">"),
            "(a > 1 OR (a = 1 AND b > 2))"
        );
        let filter = Filter {
            provider: Some("it's".into()),
            fields: vec![("k".into(), "v".into())],
            level: Some(3),
            ..Filter::default()
        };
        let client = Client::new(
            super::super::clickhouse::Endpoint {
                url: "http://127.0.0.1:1/".into(),
                user: None,
                password: None,
                tls: None,
            },
            std::time::Duration::from_secs(1),
        );
        let q = FleetQuery {
            client: &client,
            database: "eventd",
            filter: &filter,
            hosts: &["a".to_string()],
            cursor: FleetCursor::default(),
        };
        let sql = q.events_sql(None, 10);
        assert!(sql.contains("provider = 'it\\'s'"), "{sql}");
        assert!(sql.contains("level <= 3"), "{sql}");
        assert!(sql.contains("host IN ('a')"), "{sql}");
        assert!(
            sql.contains("visitParamExtractString(fields, 'k') = 'v'"),
            "{sql}"
        );
        assert!(sql.ends_with("LIMIT 10 FORMAT RowBinary"), "{sql}");
        let filter = Filter {
            level: Some(4),
            level_min: Some(3),
            units: vec!["nginx.service".into(), "web-*".into()],
            kernel: true,
            grep: Some("(?i)disk".into()),
            providers: vec!["a".into(), "b".into()],
            ..Filter::default()
        };
        let q = FleetQuery {
            filter: &filter,
            ..q
        };
        let sql = q.events_sql(None, 10);
        for term in [
            "level <= 4",
            "level >= 3",
            "provider IN ('a', 'b')",
            "cpu >= 1048576",
            "(visitParamExtractString(fields, 'unit') = 'nginx.service' OR \
             match(visitParamExtractString(fields, 'unit'), '^web\\\\-.*$'))",
            "provider = 'kernel'",
            "visitParamExtractString(fields, 'transport') = 'kernel'",
            "match(message, '(?i)disk')",
        ] {
            assert!(sql.contains(term), "{term} not in {sql}");
        }
    }

    #[test]
    fn globs_become_anchored_regular_expressions() {
        assert_eq!(glob_regex("nginx*"), "^nginx.*$");
        assert_eq!(glob_regex("a?.service"), "^a.\\.service$");
        assert_eq!(glob_regex("[^ab]x"), "^[^ab]x$");
        assert_eq!(glob_regex("[ab"), "^$.");
    }
}
