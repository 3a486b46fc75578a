//! One shard file as the export stage reads it: read-only (R8), by id, in
//! id order. A batch is the rows of one table with ids in a range, so that
//! reading the same range again gives the same rows in the same order (a
//! row can only have gone since, deleted by retention).

use super::format::{self, Format, Origin};
use super::state::Table;
use crate::store::rows::{EventRow, GapRow, EVENT_COLUMNS, GAP_COLUMNS};
use rusqlite::{params, Connection};
use std::path::{Path, PathBuf};

/// What names one row whatever file or id it has: see [`Rows::identities`].
pub type Identity = (i64, u32, u64, u64);

/// Rows of one table of one shard, each with its id, in id order.
#[derive(Debug, Clone, PartialEq)]
pub enum Rows {
    Events(Vec<(i64, EventRow)>),
    Gaps(Vec<(i64, GapRow)>),
}

impl Rows {
    pub fn len(&self) -> usize {
        match self {
            Rows::Events(v) => v.len(),
            Rows::Gaps(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn ids(&self) -> Vec<i64> {
        match self {
            Rows::Events(v) => v.iter().map(|(id, _)| *id).collect(),
            Rows::Gaps(v) => v.iter().map(|(id, _)| *id).collect(),
        }
    }

    pub fn last_id(&self) -> Option<i64> {
        self.ids().last().copied()
    }

    /// The smallest and largest value of the column the ClickHouse table
    /// is ordered by after the host (`ts` for events, `detected_at` for
    /// gaps): a check of what landed reads only that range.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let times: Vec<i64> = match self {
            Rows::Events(v) => v.iter().map(|(_, e)| e.ts).collect(),
            Rows::Gaps(v) => v.iter().map(|(_, g)| g.detected_at).collect(),
        };
        Some((*times.iter().min()?, *times.iter().max()?))
    }

    /// Each row's id and identity: (ring_epoch, cpu, seq) of an event,
    /// (ring_epoch, cpu, from_seq, to_seq) of a gap (0 for the last part
    /// of an event's); and, for [`Rows::needs_recheck`], its time: `ts`
    /// of an event, `ts_before` of a gap (the events it is about).
    pub fn identities(&self) -> Vec<(i64, Identity, i64)> {
        match self {
            Rows::Events(v) => v
                .iter()
                .map(|(id, e)| (*id, (e.ring_epoch, e.cpu, e.seq, 0), e.ts))
                .collect(),
            Rows::Gaps(v) => v
                .iter()
                .map(|(id, g)| {
                    (
                        *id,
                        (g.ring_epoch, g.cpu, g.from_seq, g.to_seq),
                        g.ts_before,
                    )
                })
                .collect(),
        }
    }

    /// Keeps the rows whose id `keep` says.
    pub fn retain(&mut self, mut keep: impl FnMut(i64) -> bool) {
        match self {
            Rows::Events(v) => v.retain(|(id, _)| keep(*id)),
            Rows::Gaps(v) => v.retain(|(id, _)| keep(*id)),
        }
    }

    /// The batch body: the same rows always give the same bytes.
    pub fn encode(&self, format: Format, host: &str, source: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * 256);
        let origin = |id| Origin { host, source, id };
        match (self, format) {
            (Rows::Events(v), Format::RowBinary) => {
                for (id, e) in v {
                    format::event_row_binary(&mut out, &origin(*id), e);
                }
            }
            (Rows::Events(v), Format::JsonEachRow) => {
                for (id, e) in v {
                    format::event_json(&mut out, &origin(*id), e);
                }
            }
            (Rows::Gaps(v), Format::RowBinary) => {
                for (id, g) in v {
                    format::gap_row_binary(&mut out, &origin(*id), g);
                }
            }
            (Rows::Gaps(v), Format::JsonEachRow) => {
                for (id, g) in v {
                    format::gap_json(&mut out, &origin(*id), g);
                }
            }
        }
        out
    }
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

/// A shard file that cannot be exported now.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("shard database {path}: {source}")]
    Read {
        path: PathBuf,
        source: rusqlite::Error,
    },
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
        let conn = crate::store::recovery::open_read_only(path).map_err(err)?;
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

    /// Rows of `table` with ids in `lo..=hi`, in id order, at most
    /// `limit`.
    fn select(&self, table: Table, lo: i64, hi: i64, limit: u64) -> Result<Rows, SourceError> {
        let columns = match table {
            Table::Events => EVENT_COLUMNS,
            Table::Gaps => GAP_COLUMNS,
        };
        let sql = format!(
            "SELECT {columns}, id FROM {} WHERE id BETWEEN ?1 AND ?2 ORDER BY id LIMIT ?3",
            table.name()
        );
        let (a, b, limit) = (lo, hi, limit.min(i64::MAX as u64) as i64);
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let id_at = columns.split(", ").count();
        let rows = match table {
            Table::Events => Rows::Events(
                stmt.query_map(params![a, b, limit], |r| {
                    Ok((r.get(id_at)?, EventRow::from_row(r)?))
                })
                .and_then(|rows| rows.collect())
                .map_err(|e| self.err(e))?,
            ),
            Table::Gaps => Rows::Gaps(
                stmt.query_map(params![a, b, limit], |r| {
                    Ok((r.get(id_at)?, GapRow::from_row(r)?))
                })
                .and_then(|rows| rows.collect())
                .map_err(|e| self.err(e))?,
            ),
        };
        Ok(rows)
    }

    /// The first `max` rows of `table` with ids above `after`.
    pub fn after(&self, table: Table, after: i64, max: u64) -> Result<Rows, SourceError> {
        self.select(table, after.saturating_add(1), i64::MAX, max)
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
