//! The plan: which files a query opens now, which once the merge reaches
//! the time their maps give, and which never (`store::zones`).

use super::merge::Lane;
use super::pool::open_event_database;
use super::{ConnectionPool, FanOut, ShardStream};
use crate::query::filter::{Filter, Order};
use crate::store::zones::{FileId, Plan, TimeMap, ZoneMaps};
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file the query has not opened yet (see [`FanOut::pending`]).
pub(super) struct Pending {
    pub(super) path: PathBuf,
    pub(super) file: Option<FileId>,
    pub(super) id_max: Option<i64>,
    /// The time of its next event at the soonest, in the listing's order.
    pub(super) at: i64,
    /// Whether it has gap rows.
    pub(super) gaps: bool,
}
impl FanOut {
    /// Like [`open`](Self::open), taking connections from `pool` and giving
    /// them back when the query is dropped. With `zones` (the daemon's time
    /// maps), a file is opened only once the merge reaches the earliest
    /// time it may hold an event at (files it knows nothing of are opened
    /// at once, and their maps read into it).
    pub fn open_pooled(
        store_dir: &Path,
        filter: Filter,
        bounds: Option<&HashMap<PathBuf, i64>>,
        pool: Option<Arc<ConnectionPool>>,
        zones: Option<&ZoneMaps>,
    ) -> std::io::Result<FanOut> {
        let (paths, ids): (Vec<PathBuf>, Vec<Option<FileId>>) =
            crate::store::list_database_files(store_dir)
                .map_err(std::io::Error::other)?
                .into_iter()
                .map(|(p, id)| (p, Some(id)))
                .unzip();
        if let Some(pool) = &pool {
            pool.retain(&paths);
        }
        let sql = filter.sql();
        let mut fan = FanOut {
            shards: Vec::new(),
            heap: BinaryHeap::new(),
            gap_heap: BinaryHeap::new(),
            gaps_started: false,
            filter,
            where_sql: sql.clause,
            params: sql.params,
            returned: 0,
            gaps_returned: 0,
            pool,
            pending: Vec::new(),
            gaps_pending: Vec::new(),
            listed: paths.len(),
            warnings: Vec::new(),
            damaged: Vec::new(),
        };
        let plans = match zones {
            Some(z) => {
                let files: Vec<(&Path, Option<FileId>)> = paths
                    .iter()
                    .map(PathBuf::as_path)
                    .zip(ids.iter().copied())
                    .collect();
                z.plan(&files, |m| next_in(&fan.filter, m))
            }
            None => vec![Plan::Unknown; paths.len()],
        };
        for ((path, file), plan) in paths.into_iter().zip(ids).zip(plans) {
            let id_max = bounds.map(|b| b.get(&path).copied().unwrap_or(0));
            match plan {
                Plan::Unknown => {
                    let Some(i) = fan.attach(path, file, id_max, true, true) else {
                        continue;
                    };
                    if let Some(z) = zones {
                        let s = &fan.shards[i];
                        if !z.knows(&s.path, s.file) {
                            match crate::store::zones::load(&s.conn, &s.path) {
                                Ok(loaded) => z.learn(&s.path, loaded),
                                Err(_) => z.unreadable(&s.path),
                            }
                        }
                    }
                }
                // Nothing in it the query can list.
                Plan::Known {
                    next: None,
                    gaps: false,
                } => {}
                Plan::Known { next, gaps } => {
                    let p = Pending {
                        path,
                        file,
                        id_max,
                        at: next.unwrap_or_default(),
                        gaps,
                    };
                    match next {
                        Some(_) => fan.pending.push(p),
                        None => fan.gaps_pending.push(p),
                    }
                }
            }
        }
        // The soonest last.
        match fan.filter.order {
            Order::OldestFirst => fan.pending.sort_by_key(|p| std::cmp::Reverse(p.at)),
            Order::NewestFirst => fan.pending.sort_by_key(|p| p.at),
        }
        for i in 0..fan.shards.len() {
            fan.refill(i);
        }
        Ok(fan)
    }

    /// Opens `path` for the query (a connection from the pool if one is
    /// kept): its index among the shards, or `None` if it cannot be read
    /// (named in the warnings) or is not an event database. `events` and
    /// `gaps` say which listings it takes part in.
    pub(super) fn attach(
        &mut self,
        path: PathBuf,
        file: Option<FileId>,
        id_max: Option<i64>,
        events: bool,
        gaps: bool,
    ) -> Option<usize> {
        // A kept connection was checked when it was opened.
        let kept = self.pool.as_ref().and_then(|p| p.take(&path, file));
        let conn = match kept.map_or_else(|| open_event_database(&path), |c| Ok(Some(c))) {
            Ok(Some(conn)) => conn,
            Ok(None) => return None,
            Err(e) => {
                if crate::store::is_damage(&e) {
                    self.damaged.push((path.clone(), e.to_string()));
                }
                self.warnings
                    .push(format!("{}: not read: {e}", path.display()));
                return None;
            }
        };
        let mut stream = ShardStream {
            id_max,
            file,
            path,
            conn,
            events: Lane::new(self.filter.after),
            gaps: Lane::new(self.filter.gaps_after),
        };
        stream.events.exhausted = !events;
        stream.gaps.exhausted = !gaps;
        self.shards.push(stream);
        Some(self.shards.len() - 1)
    }

    /// Opens the pending files whose next event may come before (or with)
    /// the merge's next row: after this, no file left unopened can hold a
    /// row that belongs before the heap's top.
    pub(super) fn open_due(&mut self) {
        while let Some(p) = self.pending.last() {
            let due = match self.heap.peek() {
                None => true,
                Some(top) => match self.filter.order {
                    Order::OldestFirst => p.at <= top.key.ts,
                    Order::NewestFirst => p.at >= top.key.ts,
                },
            };
            if !due {
                break;
            }
            let Some(p) = self.pending.pop() else { break };
            self.open_pending(p);
        }
    }

    pub(super) fn open_pending(&mut self, p: Pending) {
        if let Some(i) = self.attach(p.path, p.file, p.id_max, true, p.gaps) {
            self.refill(i);
            if self.gaps_started {
                self.refill_gaps(i);
            }
        }
    }
}

/// The time at which a file with map `m` may hold its first event for
/// `filter` (its window, and the cursor it continues after), in the
/// listing's order; `None` if it holds none the query can list.
fn next_in(filter: &Filter, m: &TimeMap) -> Option<i64> {
    let after = filter.after.map(|c| c.ts);
    match filter.order {
        Order::OldestFirst => {
            let from = filter
                .since_ns
                .unwrap_or(i64::MIN)
                .max(after.unwrap_or(i64::MIN));
            m.first_at_or_after(from)
                .filter(|&t| filter.until_ns.is_none_or(|u| t < u))
        }
        Order::NewestFirst => {
            let to = filter
                .until_ns
                .map_or(i64::MAX, |u| u.saturating_sub(1))
                .min(after.unwrap_or(i64::MAX));
            m.last_at_or_before(to)
                .filter(|&t| filter.since_ns.is_none_or(|s| t >= s))
        }
    }
}
