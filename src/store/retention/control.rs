//! Requests the retention coordinator makes of a shard writer.
//!
//! An active shard has one writer (R8), so retention's deletions run on the
//! writer's own connection, between two of its commits. The coordinator
//! leaves one request in the writer's [`WriterControl`], which the writer
//! looks for (under its lock) after every commit. An idle writer sleeps on
//! its channel, so the coordinator also puts a [`Kind::Control`] item there
//! to wake it (no second wakeup path, no polling); a channel too full for
//! that item means the writer is busy, and its next commit is soon. The writer runs the
//! request and leaves the answer; the coordinator waits for it with a
//! deadline. Under a load that keeps the channel full, retention is served
//! once per commit and never waits for room the drains take first.
//!
//! Historical shards have no writer: the coordinator runs the same
//! [`Request`]s on its own connection with [`execute`].

use super::trim::{self, ShardUsage, Trimmed};
use crate::channel::{Sender, TrySendError};
use crate::drain::{Handoff, Kind};
use rusqlite::Connection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One thing retention asks of a shard's only writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// [`trim::measure`].
    Measure,
    /// [`trim::cutoff_after`].
    CutoffAfter { k: u64 },
    /// [`trim::trim`]; with `live_epochs` `None`, no receipt is deleted.
    Trim {
        older: trim::Older,
        max_rows: u64,
        live_epochs: Option<Vec<u64>>,
        keep: trim::Keep,
    },
    /// [`trim::compact_receipts`] for each of `epochs` (one bounded
    /// transaction each), of the receipts committed before
    /// `committed_before_ns` by eventd's reckoning (the commit marks).
    Compact {
        epochs: Vec<u64>,
        committed_before_ns: i64,
        min_rows: u64,
        max_rows: u64,
    },
    /// [`trim::vacuum`].
    Vacuum { max_bytes: u64 },
}

/// The answer to a [`Request`] of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Usage(ShardUsage),
    Cutoff(Option<i64>),
    Trimmed(Trimmed),
    /// Receipt rows replaced by summaries.
    Compacted(u64),
    /// Pages given back to the filesystem.
    Vacuumed(u64),
}

/// Runs `request` on `conn`, which must be the database's only writer, of
/// the file at `path`. A trim that may store `unexported` gap rows marks
/// the file in `zones` first, so that no query passes over it for gaps.
pub fn execute(
    conn: &mut Connection,
    request: &Request,
    path: &std::path::Path,
    zones: &crate::store::zones::ZoneMaps,
) -> rusqlite::Result<Reply> {
    if let Request::Trim { keep, .. } = request {
        if keep.forced && keep.exported.is_some() {
            zones.mark_gaps(path);
        }
    }
    Ok(match request {
        Request::Measure => Reply::Usage(trim::measure(conn)?),
        Request::CutoffAfter { k } => Reply::Cutoff(trim::cutoff_after(conn, *k)?),
        Request::Trim {
            older,
            max_rows,
            live_epochs,
            keep,
        } => Reply::Trimmed(trim::trim(
            conn,
            *older,
            *max_rows,
            live_epochs.as_deref(),
            *keep,
        )?),
        Request::Compact {
            epochs,
            committed_before_ns,
            min_rows,
            max_rows,
        } => {
            let old = super::marks::through(conn, *committed_before_ns)?.receipts;
            let mut removed = 0;
            for &epoch in epochs {
                removed += trim::compact_receipts(conn, epoch, old, *min_rows, *max_rows)?;
            }
            Reply::Compacted(removed)
        }
        Request::Vacuum { max_bytes } => Reply::Vacuumed(trim::vacuum(conn, *max_bytes)?),
    })
}

/// Why a call to an active shard's writer got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("the writer did not answer within {0:?} (is it retrying a failing commit?)")]
    Timeout(Duration),
    #[error("the writer has stopped")]
    Disconnected,
    #[error("eventd is stopping")]
    Stopping,
    #[error("{0}")]
    Failed(String),
}

#[derive(Default)]
struct State {
    last_id: u64,
    request: Option<(u64, Request)>,
    reply: Option<(u64, Result<Reply, String>)>,
}

/// The request slot between the coordinator and one shard writer. One
/// caller at a time (the coordinator is one thread).
#[derive(Default)]
pub struct WriterControl {
    state: Mutex<State>,
    answered: Condvar,
    /// Calls whose wakeup item found the channel full: the writer was busy
    /// and took the request after a commit.
    busy_calls: std::sync::atomic::AtomicU64,
}
/// How often a waiting caller looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl WriterControl {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a whole assignment: a poisoned lock still holds a
        // consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves `request` for the writer behind `tx`, wakes it and waits at
    /// most `timeout` for the answer. Gives up early when `stop` is set.
    pub fn call(
        &self,
        tx: &Sender<Handoff>,
        request: Request,
        timeout: Duration,
        stop: &AtomicBool,
    ) -> Result<Reply, CallError> {
        let deadline = Instant::now() + timeout;
        let id = {
            let mut s = self.lock();
            s.last_id += 1;
            s.request = Some((s.last_id, request));
            s.reply = None;
            s.last_id
        };
        let wake = Handoff {
            kind: Kind::Control,
            ..Handoff::default()
        };
        match tx.try_send(wake, &[]) {
            Ok(()) => {}
            // Full: items wait, so the writer is awake and will look for the
            // request (under the lock it was left under) after the commit it
            // is making or about to make.
            Err(TrySendError::Full | TrySendError::TooLarge(_)) => {
                // Relaxed: a statistic.
                self.busy_calls.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected) => {
                return Err(self.withdraw(id, CallError::Disconnected))
            }
        }
        let mut s = self.lock();
        loop {
            if s.reply
                .as_ref()
                .is_some_and(|(answered, _)| *answered == id)
            {
                if let Some((_, result)) = s.reply.take() {
                    return result.map_err(CallError::Failed);
                }
            }
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) {
                drop(s);
                return Err(self.withdraw(id, CallError::Stopping));
            }
            if now >= deadline {
                drop(s);
                return Err(self.withdraw(id, CallError::Timeout(timeout)));
            }
            let wait = (deadline - now).min(STOP_CHECK);
            s = self
                .answered
                .wait_timeout(s, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Takes back an unanswered request, so the writer does not run it late.
    fn withdraw(&self, id: u64, error: CallError) -> CallError {
        let mut s = self.lock();
        if s.request.as_ref().is_some_and(|(r, _)| *r == id) {
            s.request = None;
        }
        error
    }

    /// Calls that found the writer's channel full (served after a commit
    /// rather than woken).
    pub fn busy_calls(&self) -> u64 {
        self.busy_calls.load(Ordering::Relaxed)
    }

    /// Writer side: the waiting request, if any.
    pub fn take(&self) -> Option<(u64, Request)> {
        self.lock().request.take()
    }

    /// Writer side: the answer to request `id`.
    pub fn answer(&self, id: u64, result: Result<Reply, String>) {
        self.lock().reply = Some((id, result));
        self.answered.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{Capacity, HandoffChannel};
    use std::sync::Arc;

    #[test]
    fn a_call_is_answered_by_the_thread_that_receives_the_wakeup() {
        let (tx, mut rx) = HandoffChannel::<Handoff>::new(Capacity {
            slots: 4,
            bytes: 4096,
        })
        .unwrap();
        let control = Arc::new(WriterControl::default());
        let writer = {
            let control = control.clone();
            std::thread::spawn(move || {
                let mut woken = 0;
                while rx
                    .recv_batch(1, |h, _| {
                        assert_eq!(h.kind, Kind::Control);
                        woken += 1;
                    })
                    .is_ok()
                {
                    if let Some((id, Request::Vacuum { max_bytes })) = control.take() {
                        control.answer(id, Ok(Reply::Vacuumed(max_bytes * 2)));
                    }
                }
                woken
            })
        };
        let stop = AtomicBool::new(false);
        for pages in 1..=3 {
            let reply = control.call(
                &tx,
                Request::Vacuum { max_bytes: pages },
                Duration::from_secs(30),
                &stop,
            );
            assert_eq!(reply, Ok(Reply::Vacuumed(pages * 2)));
        }
        drop(tx);
        assert_eq!(writer.join().unwrap(), 3);
    }

    #[test]
    fn an_unanswered_call_times_out_and_is_withdrawn() {
        let (tx, _rx) = HandoffChannel::<Handoff>::new(Capacity {
            slots: 1,
            bytes: 4096,
        })
        .unwrap();
        let control = WriterControl::default();
        let stop = AtomicBool::new(false);
        let r = control.call(&tx, Request::Measure, Duration::from_millis(50), &stop);
        assert_eq!(r, Err(CallError::Timeout(Duration::from_millis(50))));
        assert!(control.take().is_none(), "withdrawn");
        // The channel is now full (one slot): the next call cannot even wake.
        stop.store(true, Ordering::Relaxed);
        let r = control.call(&tx, Request::Measure, Duration::from_secs(30), &stop);
        assert_eq!(r, Err(CallError::Stopping));
    }
}
