//! One shard file as the export stage reads it: read-only (R8), by id, in
//! id order. A batch is the rows of one table with ids in a range, so that
//! reading the same range again gives the same rows in the same order (a
//! row can only have gone since, deleted by retention).

use super::format::{self, Format, Origin};
use super::state::Table;
use crate::store::raw_select::RawSelect;
use crate::store::rows::{
    Columns, EventView, GapRow, EVENT_COLUMNS, EVENT_COLUMN_COUNT, GAP_COLUMNS,
};
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

/// The most events one statement reads, under one read snapshot: a batch
/// is read in runs of this many, each a statement of its own. A snapshot
/// holds the shard's WAL back (no checkpoint copies past it, and the WAL
/// cannot start over while it lives); an export thread at niceness 19 on a
/// CPU that ingestion keeps busy was seen to hold one for seconds, through
/// hundreds of MB of WAL, when it read a 50,000-row batch in one. Between
/// runs the caller may wait (see `walroom`). Rows are only ever added
/// above the highest id, so the runs together are the rows one statement
/// would have read (less any that retention deleted meanwhile, as with a
/// later read).
pub const RUN_ROWS: i64 = 1024;

/// What names one row whatever file or id it has: see [`Batch::identities`].
pub type Identity = (i64, u32, u64, u64);

/// What the worker needs to know of one row of a batch besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    id: i64,
    identity: Identity,
    /// `ts` of an event, `ts_before` of a gap (the events it is about).
    recheck_time: i64,
    /// The column ClickHouse orders by after the host: `ts` of an event,
    /// `detected_at` of a gap.
    order_time: i64,
}

/// Rows of one table of one shard, in id order, encoded: each row's key
/// and the batch body, so that a batch is read and encoded in one pass
/// without a copy of each row's strings. Every row's bytes stand alone in
/// both formats, so dropping rows (see [`Batch::retain`]) leaves the body
/// the encoding of the rows that are left: the same rows always give the
/// same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    keys: Vec<Key>,
    /// Where each row's bytes end in `body`.
    ends: Vec<usize>,
    body: Vec<u8>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn first_id(&self) -> Option<i64> {
        self.keys.first().map(|k| k.id)
    }

    pub fn last_id(&self) -> Option<i64> {
        self.keys.last().map(|k| k.id)
    }

    /// The insert's body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The smallest and largest value of the column the ClickHouse table
    /// is ordered by after the host (`ts` for events, `detected_at` for
    /// gaps): a check of what landed reads only that range.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let mut times = self.keys.iter().map(|k| k.order_time);
        let first = times.next()?;
        Some(times.fold((first, first), |(lo, hi), t| (lo.min(t), hi.max(t))))
    }

    /// Each row's id and identity: (ring_epoch, cpu, seq) of an event,
    /// (ring_epoch, cpu, from_seq, to_seq) of a gap (0 for the last part
    /// of an event's); and its time: `ts` of an event, `ts_before` of a
    /// gap (the events it is about).
    pub fn identities(&self) -> Vec<(i64, Identity, i64)> {
        self.keys
            .iter()
            .map(|k| (k.id, k.identity, k.recheck_time))
            .collect()
    }

    /// Ends the row whose bytes were just appended to `body`.
    fn push(&mut self, key: Key) {
        self.keys.push(key);
        self.ends.push(self.body.len());
    }

    /// Keeps the rows whose id `keep` says, and their bytes.
    pub fn retain(&mut self, mut keep: impl FnMut(i64) -> bool) {
        let (mut keys, mut ends, mut body) = (Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        for (key, &end) in self.keys.iter().zip(&self.ends) {
            if keep(key.id) {
                body.extend_from_slice(&self.body[start..end]);
                keys.push(*key);
                ends.push(body.len());
            }
            start = end;
        }
        *self = Batch { keys, ends, body };
    }
}

/// What a batch is encoded for: its format and the rows' origin.
#[derive(Debug, Clone, Copy)]
pub struct Encoding<'a> {
    pub format: Format,
    pub host: &'a str,
}

/// A shard file opened for export.
pub struct ShardSource {
    pub path: PathBuf,
    /// The file's name (shown in status).
    pub file: String,
    /// Its instance id (the cursors' key, the rows' `source` in ClickHouse).
    pub instance: String,
    conn: Connection,
}

/// A row whose column is not what the schema says.
#[derive(Debug)]
pub struct BadRow {
    pub path: PathBuf,
    pub table: &'static str,
    pub id: i64,
    pub column: String,
    pub source: rusqlite::Error,
}

/// A shard file that cannot be exported now.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("shard database {path}: {source}")]
    Read {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "shard database {}, {} row id {}: column {}: {}",
        .0.path.display(), .0.table, .0.id, .0.column, .0.source
    )]
    Row(Box<BadRow>),
    #[error(
        "shard database {path} has no instance id (schema older than this eventd's, not \
         migrated): it is not exported"
    )]
    NoInstance { path: PathBuf },
}

impl ShardSource {
    /// Opens `path` read-only and reads its instance id.
    pub fn open(path: &Path) -> Result<ShardSource, SourceError> {
        let err = |source| SourceError::Read {
            path: path.to_path_buf(),
            source,
        };
        let conn = crate::store::open_read_only(path).map_err(err)?;
        let instance = crate::store::schema::instance(&conn)
            .map_err(err)?
            .ok_or_else(|| SourceError::NoInstance {
                path: path.to_path_buf(),
            })?;
        Ok(ShardSource {
            path: path.to_path_buf(),
            file: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            instance,
            conn,
        })
    }

    fn err(&self, source: rusqlite::Error) -> SourceError {
        SourceError::Read {
            path: self.path.clone(),
            source,
        }
    }

    /// An event row (`id`, the current row of `r`) whose column the error
    /// names is not what the schema says (only something other than
    /// eventd can have written it). The column's name comes from the
    /// statement, for the errors that carry only its index.
    fn bad_event(&self, r: &RawSelect<'_>, id: i64, source: rusqlite::Error) -> SourceError {
        use rusqlite::Error as E;
        let column = match &source {
            E::InvalidColumnType(_, name, _) => name.clone(),
            E::Utf8Error(i, _) | E::IntegralValueOutOfRange(i, _) => r.name(*i),
            _ => "?".to_string(),
        };
        SourceError::Row(Box::new(BadRow {
            path: self.path.clone(),
            table: Table::Events.name(),
            id,
            column,
            source,
        }))
    }

    /// Rows of `table` with ids in `lo..=hi`, in id order, at most
    /// `limit`, encoded as `encoding` says.
    pub fn select(
        &self,
        table: Table,
        range: (i64, i64),
        limit: u64,
        encoding: Encoding<'_>,
    ) -> Result<Batch, SourceError> {
        self.select_paced(table, range, limit, encoding, &mut || {})
    }

    /// [`Self::select`], calling `between` between two runs of
    /// [`RUN_ROWS`] events, with no read snapshot open.
    pub fn select_paced(
        &self,
        table: Table,
        range: (i64, i64),
        limit: u64,
        encoding: Encoding<'_>,
        between: &mut dyn FnMut(),
    ) -> Result<Batch, SourceError> {
        let limit = limit.min(i64::MAX as u64) as i64;
        let mut batch = Batch {
            keys: Vec::new(),
            ends: Vec::new(),
            body: Vec::with_capacity((limit.clamp(0, 1 << 16) as usize) * 256),
        };
        match table {
            Table::Events => self.select_events(range, limit, encoding, &mut batch, between)?,
            Table::Gaps => self
                .select_gaps(range, limit, encoding, &mut batch)
                .map_err(|e| self.err(e))?,
        }
        Ok(batch)
    }

    /// Events, the bulk of every export: stepped through SQLite's C
    /// interface ([`RawSelect`]), which reads a batch in about four fifths
    /// of the time rusqlite's rows take; in runs of [`RUN_ROWS`].
    fn select_events(
        &self,
        (mut lo, hi): (i64, i64),
        limit: i64,
        encoding: Encoding<'_>,
        batch: &mut Batch,
        between: &mut dyn FnMut(),
    ) -> Result<(), SourceError> {
        let sql = format!(
            "SELECT {EVENT_COLUMNS}, id FROM events WHERE id BETWEEN ?1 AND ?2 ORDER BY id \
             LIMIT ?3"
        );
        let mut stmt = RawSelect::prepare(&self.conn, &sql).map_err(|e| self.err(e))?;
        let mut left = limit;
        while left > 0 {
            let run = left.min(RUN_ROWS);
            for (index, value) in [(1, lo), (2, hi), (3, run)] {
                stmt.bind_i64(index, value).map_err(|e| self.err(e))?;
            }
            let read = self.run_of_events(&mut stmt, encoding, batch)?;
            stmt.reset();
            left -= read;
            match batch.last_id() {
                Some(last) if read == run && left > 0 && last < hi => lo = last + 1,
                _ => break,
            }
            between();
        }
        Ok(())
    }

    /// The rows `stmt` (bound) gives, encoded into `batch`; how many.
    fn run_of_events(
        &self,
        stmt: &mut RawSelect<'_>,
        encoding: Encoding<'_>,
        batch: &mut Batch,
    ) -> Result<i64, SourceError> {
        let mut read = 0;
        while stmt.step().map_err(|e| self.err(e))? {
            read += 1;
            let r = &*stmt;
            let id = r.int(EVENT_COLUMN_COUNT).map_err(|e| self.err(e))?;
            let e = EventView::from_columns(r).map_err(|e| self.bad_event(r, id, e))?;
            let origin = Origin {
                host: encoding.host,
                source: &self.instance,
                id,
            };
            match encoding.format {
                Format::RowBinary => format::event_row_binary(&mut batch.body, &origin, &e),
                Format::JsonEachRow => format::event_json(&mut batch.body, &origin, &e),
            }
            batch.push(Key {
                id,
                identity: (e.ring_epoch, e.cpu, e.seq, 0),
                recheck_time: e.ts,
                order_time: e.ts,
            });
        }
        Ok(read)
    }

    fn select_gaps(
        &self,
        (lo, hi): (i64, i64),
        limit: i64,
        encoding: Encoding<'_>,
        batch: &mut Batch,
    ) -> rusqlite::Result<()> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {GAP_COLUMNS}, id FROM gaps WHERE id BETWEEN ?1 AND ?2 ORDER BY id LIMIT ?3"
        ))?;
        let id_at = GAP_COLUMNS.split(", ").count();
        let mut rows = stmt.query(params![lo, hi, limit])?;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(id_at)?;
            let origin = Origin {
                host: encoding.host,
                source: &self.instance,
                id,
            };
            let g = GapRow::from_row(r)?;
            match encoding.format {
                Format::RowBinary => format::gap_row_binary(&mut batch.body, &origin, &g),
                Format::JsonEachRow => format::gap_json(&mut batch.body, &origin, &g),
            }
            batch.push(Key {
                id,
                identity: (g.ring_epoch, g.cpu, g.from_seq, g.to_seq),
                recheck_time: g.ts_before,
                order_time: g.detected_at,
            });
        }
        Ok(())
    }

    /// The first `max` rows of `table` with ids above `after`, encoded.
    pub fn after(
        &self,
        table: Table,
        after: i64,
        max: u64,
        encoding: Encoding<'_>,
    ) -> Result<Batch, SourceError> {
        self.after_paced(table, after, max, encoding, &mut || {})
    }

    /// [`Self::after`], calling `between` between runs (see
    /// [`Self::select_paced`]).
    pub fn after_paced(
        &self,
        table: Table,
        after: i64,
        max: u64,
        encoding: Encoding<'_>,
        between: &mut dyn FnMut(),
    ) -> Result<Batch, SourceError> {
        let range = (after.saturating_add(1), i64::MAX);
        self.select_paced(table, range, max, encoding, between)
    }

    /// The highest id of `table` (0 when empty).
    pub fn max_id(&self, table: Table) -> Result<i64, SourceError> {
        self.conn
            .query_row(
                &format!("SELECT coalesce(max(id), 0) FROM {}", table.name()),
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    /// The oldest time (`ts` or `detected_at`) among the first `max` rows
    /// of `table` above `after`: where a batch that may have been sent
    /// starts, for the check against the cluster.
    pub fn first_time_after(
        &self,
        table: Table,
        after: i64,
        max: u64,
    ) -> Result<Option<i64>, SourceError> {
        let time = match table {
            Table::Events => "ts",
            Table::Gaps => "detected_at",
        };
        self.conn
            .query_row(
                &format!(
                    "SELECT min({time}) FROM (SELECT {time} FROM {} WHERE id > ?1 \
                     ORDER BY id LIMIT ?2)",
                    table.name()
                ),
                params![after, max.min(i64::MAX as u64) as i64],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open_shard, shard_path};

    fn filled(dir: &Path) -> PathBuf {
        let path = shard_path(dir, 0);
        let conn = open_shard(&path).unwrap();
        for seq in 1..=20i64 {
            let fields = (seq % 3 == 0).then(|| format!(r#"{{"n":{seq}}}"#));
            conn.execute(
                crate::store::rows::INSERT_EVENT,
                params![
                    1_000 + (seq * 7) % 11,
                    seq % 2,
                    seq,
                    9,
                    10,
                    11,
                    0,
                    6,
                    "prov",
                    "name",
                    "é".repeat(seq as usize),
                    fields
                ],
            )
            .unwrap();
        }
        path
    }

    /// A row that is not what the schema says (written by something other
    /// than eventd) stops the batch with an error naming the file and the
    /// column; the rows before it read as before.
    #[test]
    fn a_damaged_row_is_an_error_naming_the_file_and_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = filled(dir.path());
        let conn = open_shard(&path).unwrap();
        conn.execute(
            "UPDATE events SET message = CAST(x'c328' AS TEXT) WHERE id = 5",
            [],
        )
        .unwrap();
        conn.execute("UPDATE events SET cpu = 'x' WHERE id = 9", [])
            .unwrap();
        drop(conn);
        let source = ShardSource::open(&path).unwrap();
        let enc = Encoding {
            format: Format::RowBinary,
            host: "h",
        };
        assert_eq!(source.after(Table::Events, 0, 4, enc).unwrap().len(), 4);
        let err = source.after(Table::Events, 0, 100, enc).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains("events row id 5: column message: invalid utf-8"),
            "{text}"
        );
        let err = source.after(Table::Events, 5, 100, enc).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("events row id 9: column cpu:"), "{text}");
        assert!(text.contains("Text"), "{text}");
        assert_eq!(source.after(Table::Events, 9, 100, enc).unwrap().len(), 11);
    }

    #[test]
    fn a_batch_encodes_as_it_reads_and_keeps_its_bytes_whole_when_rows_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let source = ShardSource::open(&filled(dir.path())).unwrap();
        for format in [Format::RowBinary, Format::JsonEachRow] {
            let enc = Encoding { format, host: "h" };
            let all = source.after(Table::Events, 0, 100, enc).unwrap();
            assert_eq!(
                (all.len(), all.first_id(), all.last_id()),
                (20, Some(1), Some(20))
            );
            // Limits and ranges: the same rows, the same bytes.
            let first = source.after(Table::Events, 0, 8, enc).unwrap();
            let rest = source.after(Table::Events, 8, 100, enc).unwrap();
            assert_eq!([first.body(), rest.body()].concat(), all.body());
            // Dropping rows leaves exactly the encoding of those left.
            let mut odd = all.clone();
            odd.retain(|id| id % 2 == 1);
            let one_by_one: Vec<u8> = (1..=20)
                .step_by(2)
                .flat_map(|id| {
                    source
                        .select(Table::Events, (id, id), 1, enc)
                        .unwrap()
                        .body()
                        .to_vec()
                })
                .collect();
            assert_eq!(odd.body(), &one_by_one[..]);
            assert_eq!(odd.len(), 10);
            // Identities and times come with the rows.
            let ids = odd.identities();
            assert_eq!(ids[1], (3, (9, 1, 3, 0), 1_000 + 21 % 11));
            let times: Vec<i64> = (1..=20i64).map(|s| 1_000 + (s * 7) % 11).collect();
            assert_eq!(
                all.time_range(),
                Some((*times.iter().min().unwrap(), *times.iter().max().unwrap()))
            );
        }
    }

    /// A batch longer than a run is read in runs, each its own snapshot:
    /// between them no reader holds the WAL (a checkpoint that must copy
    /// all of it back succeeds there), rows committed meanwhile above the
    /// batch's end do not change it, and the bytes are those of the same
    /// rows read in pieces.
    #[test]
    fn a_long_batch_is_read_in_runs_with_no_snapshot_between_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard_path(dir.path(), 0);
        let writer = open_shard(&path).unwrap();
        let insert = |seq: i64| {
            writer
                .execute(
                    crate::store::rows::INSERT_EVENT,
                    params![
                        seq,
                        0,
                        seq,
                        9,
                        10,
                        11,
                        0,
                        6,
                        "p",
                        "n",
                        "m".repeat(50),
                        None::<String>
                    ],
                )
                .unwrap();
        };
        let total = RUN_ROWS * 3;
        for seq in 1..=total {
            insert(seq);
        }
        let source = ShardSource::open(&path).unwrap();
        let enc = Encoding {
            format: Format::RowBinary,
            host: "h",
        };
        let limit = (RUN_ROWS * 2 + RUN_ROWS / 2) as u64;
        let mut betweens = 0;
        let mut seq = total;
        let paced = source
            .after_paced(Table::Events, 0, limit, enc, &mut || {
                betweens += 1;
                // TRUNCATE must have every reader out of the WAL.
                let (busy, log, copied): (i64, i64, i64) = writer
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .unwrap();
                assert_eq!((busy, log, copied), (0, 0, 0), "a reader held the WAL");
                seq += 1;
                insert(seq);
            })
            .unwrap();
        assert_eq!(betweens, 2);
        assert_eq!(
            (paced.len() as u64, paced.first_id(), paced.last_id()),
            (limit, Some(1), Some(limit as i64))
        );
        let first = source.after(Table::Events, 0, 1000, enc).unwrap();
        let rest = source
            .after(Table::Events, 1000, limit - 1000, enc)
            .unwrap();
        assert_eq!([first.body(), rest.body()].concat(), paced.body());
        // A batch that ends on a run's end: no wait after the last run.
        let mut betweens = 0;
        let exact = source
            .after_paced(Table::Events, 0, RUN_ROWS as u64, enc, &mut || {
                betweens += 1
            })
            .unwrap();
        assert_eq!((exact.len() as i64, betweens), (RUN_ROWS, 0));
    }
}
