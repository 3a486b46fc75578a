//! Query indexes (`QueryIndexes`): which events columns and structured
//! fields each shard indexes beside the time (`events_ts`).
//!
//! Every query filters on time and reads in time order, so each index is
//! `(key, ts)`: a query with `key = value` then reads the matching rows
//! already in time order and stops at its limit, instead of walking every
//! row of the time range. What each costs at insert and saves at query is
//! measured by `eventd-perf fields` (docs/performance.md#a-day-of-events);
//! the default is what paid for itself there.
//!
//! The indexes eventd makes are named `events_by_*`. A shard gets the
//! configured ones when it is made (empty: no cost), and an existing file
//! gets the missing ones, and loses the `events_by_*` ones no longer
//! configured, from the one thread that writes it: its writer before its
//! first batch, or the retention coordinator for a historical file (R8).
//! Building an index on a file of millions of rows takes seconds (the
//! writer's intake waits meanwhile; the ring absorbs): [`sync`] logs each.

use rusqlite::Connection;
use std::time::Instant;

/// The columns a `QueryIndexes` entry may name: the filters of `eventctl
/// query` that test equality, so that the matching rows lie in time order
/// in the index. `level` is not one: `--level` is a range of levels, which
/// SQLite can only read from a `(level, ts)` index out of time order and
/// then sort; over 1M-100M events that made `--level err` 30-70x slower
/// than walking the time index, besides halving the insert rate.
pub const COLUMNS: &[&str] = &["provider", "name", "pid", "uid", "cpu"];

/// The prefix of a structured field's entry: `fields.KEY`.
pub const FIELD_PREFIX: &str = "fields.";

/// The longest field key an index may name.
pub const FIELD_KEY_BYTES_MAX: usize = 64;

/// The prefix of the names of the indexes eventd makes for queries.
const NAME_PREFIX: &str = "events_by_";

/// One entry of `QueryIndexes`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(into = "String")]
pub enum QueryIndex {
    /// One of [`COLUMNS`].
    Column(&'static str),
    /// A key of the structured fields (letters, digits, `_`, `-`).
    Field(String),
}

impl From<QueryIndex> for String {
    fn from(q: QueryIndex) -> String {
        q.label()
    }
}

/// Whether `key` can be indexed: plain enough to stand in SQL and in a
/// JSON path as it is, so the filter can repeat the index's expression
/// word for word (SQLite uses an expression index only then).
pub fn plain_field_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= FIELD_KEY_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The value of field `key` as the filter compares it, for a plain key
/// (see [`plain_field_key`]): the text of `fields.key`, NULL when the
/// fields are not JSON (a damaged or foreign row then matches nothing
/// instead of failing the query or, in an index, the insert).
pub fn field_expr(key: &str) -> String {
    debug_assert!(plain_field_key(key), "{key}");
    format!(
        "CASE WHEN json_valid(fields) THEN CAST(json_extract(fields, '$.\"{key}\"') AS TEXT) END"
    )
}

impl QueryIndex {
    /// Parses an entry: a column of [`COLUMNS`] or `fields.KEY`.
    pub fn parse(entry: &str) -> Result<QueryIndex, String> {
        if let Some(key) = entry.strip_prefix(FIELD_PREFIX) {
            return if plain_field_key(key) {
                Ok(QueryIndex::Field(key.to_string()))
            } else {
                Err(format!(
                    "a field key of 1 to {FIELD_KEY_BYTES_MAX} letters, digits, '_' or '-'"
                ))
            };
        }
        COLUMNS
            .iter()
            .find(|c| **c == entry)
            .map(|c| QueryIndex::Column(c))
            .ok_or_else(|| format!("one of {} or \"fields.KEY\"", COLUMNS.join(", ")))
    }

    /// As written in the configuration.
    pub fn label(&self) -> String {
        match self {
            QueryIndex::Column(c) => (*c).to_string(),
            QueryIndex::Field(k) => format!("{FIELD_PREFIX}{k}"),
        }
    }

    /// The index's name in every shard: `events_by_provider`,
    /// `events_by_field_` and the key's bytes in hex (a key may hold `-`).
    pub fn index_name(&self) -> String {
        match self {
            QueryIndex::Column(c) => format!("{NAME_PREFIX}{c}"),
            QueryIndex::Field(k) => {
                let hex: String = k.bytes().map(|b| format!("{b:02x}")).collect();
                format!("{NAME_PREFIX}field_{hex}")
            }
        }
    }

    /// The statement that makes this index (`IF NOT EXISTS`), word for
    /// word what [`sync`] runs.
    pub fn create_sql(&self) -> String {
        let key = match self {
            QueryIndex::Column(c) => (*c).to_string(),
            QueryIndex::Field(k) => field_expr(k),
        };
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON events ({key}, ts)",
            self.index_name()
        )
    }
}

/// What [`sync`] changed in one file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Synced {
    pub created: Vec<String>,
    pub dropped: Vec<String>,
}

/// The `events_by_*` indexes `conn`'s file has.
pub fn present(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' \
         AND substr(name, 1, length(?1)) = ?1 ORDER BY name",
    )?;
    let names = stmt
        .query_map([NAME_PREFIX], |r| r.get::<_, String>(0))?
        .collect();
    names
}

/// Makes `conn`'s file have exactly the indexes of `wanted` among those
/// named `events_by_*`: creates the missing ones, drops the others (an
/// index nobody asks for still costs every insert). Each change is a
/// transaction of its own and is logged with its time; `file` names the
/// file in the log.
pub fn sync(
    conn: &Connection,
    wanted: &[QueryIndex],
    file: &std::path::Path,
) -> rusqlite::Result<Synced> {
    let have = present(conn)?;
    let mut done = Synced::default();
    for name in &have {
        if wanted.iter().any(|q| &q.index_name() == name) {
            continue;
        }
        let t = Instant::now();
        // The name comes from sqlite_master and has the prefix checked by
        // `present`; quoted all the same.
        conn.execute_batch(&format!(
            "DROP INDEX IF EXISTS \"{}\"",
            name.replace('"', "\"\"")
        ))?;
        tracing::info!(file = %file.display(), index = %name, ms = t.elapsed().as_millis() as u64,
            "query index dropped (no longer in QueryIndexes)");
        done.dropped.push(name.clone());
    }
    // Counted once, for the log, and only when something is built.
    let mut rows: Option<i64> = None;
    for q in wanted {
        let name = q.index_name();
        if have.contains(&name) {
            continue;
        }
        let rows = match rows {
            Some(n) => n,
            None => *rows.insert(conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))?),
        };
        let t = Instant::now();
        if rows > 0 {
            tracing::info!(file = %file.display(), index = %q.label(), rows,
                "building query index; this shard's writes wait until it is done");
        }
        conn.execute_batch(&q.create_sql())?;
        if rows > 0 {
            tracing::info!(file = %file.display(), index = %q.label(), rows,
                ms = t.elapsed().as_millis() as u64, "query index built");
        }
        done.created.push(name);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::schema::migrate(&mut conn).unwrap().unwrap();
        conn
    }

    #[test]
    fn entries_parse_and_bad_ones_say_what_is_allowed() {
        assert_eq!(
            QueryIndex::parse("provider"),
            Ok(QueryIndex::Column("provider"))
        );
        assert_eq!(
            QueryIndex::parse("fields.unit-id"),
            Ok(QueryIndex::Field("unit-id".into()))
        );
        for bad in [
            "message",
            "ts",
            "level",
            "",
            "fields.",
            "fields.a b",
            "fields.a'b",
            "fields.\"x",
        ] {
            let e = QueryIndex::parse(bad).unwrap_err();
            assert!(
                e.contains("one of") || e.contains("field key"),
                "{bad}: {e}"
            );
        }
        let long = format!("fields.{}", "k".repeat(FIELD_KEY_BYTES_MAX + 1));
        assert!(QueryIndex::parse(&long).is_err());
    }

    #[test]
    fn sync_creates_what_is_wanted_and_drops_only_its_own_others() {
        let conn = shard();
        conn.execute_batch("CREATE INDEX my_own ON events (message)")
            .unwrap();
        let path = std::path::Path::new("test.db");
        let wanted = [
            QueryIndex::Column("provider"),
            QueryIndex::Field("unit".into()),
        ];
        let done = sync(&conn, &wanted, path).unwrap();
        assert_eq!(done.created.len(), 2);
        assert_eq!(
            present(&conn).unwrap(),
            vec!["events_by_field_756e6974", "events_by_provider"]
        );
        // Again: nothing to do.
        assert_eq!(sync(&conn, &wanted, path).unwrap(), Synced::default());
        // Fewer: the other one goes, an index eventd did not make stays.
        let done = sync(&conn, &wanted[..1], path).unwrap();
        assert_eq!(done.dropped, vec!["events_by_field_756e6974"]);
        let all: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'my_own'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(all, 1);
    }

    #[test]
    fn a_field_index_takes_rows_whose_fields_are_not_json_and_is_used_by_the_filter() {
        let conn = shard();
        sync(
            &conn,
            &[QueryIndex::Field("unit".into())],
            std::path::Path::new("t"),
        )
        .unwrap();
        for (i, fields) in [
            Some(r#"{"unit":"sda"}"#),
            Some("not json"),
            None,
            Some(r#"{"unit":7}"#),
        ]
        .iter()
        .enumerate()
        {
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                rusqlite::params![i as i64, 0, i as i64, 1, 1, 1, 0, 6, "p", "n", "m", fields],
            )
            .unwrap();
        }
        let sql = format!(
            "SELECT ts FROM events WHERE {} = ?1 ORDER BY ts",
            field_expr("unit")
        );
        let plan: String = conn
            .query_row(&format!("EXPLAIN QUERY PLAN {sql}"), ["sda"], |r| r.get(3))
            .unwrap();
        assert!(plan.contains("events_by_field_756e6974"), "{plan}");
        let ts: Vec<i64> = conn
            .prepare(&sql)
            .unwrap()
            .query_map(["7"], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(ts, vec![3]);
    }
}
