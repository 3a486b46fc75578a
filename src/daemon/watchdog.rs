//! The service manager's watchdog (`WatchdogSec=` in eventd.service): a
//! thread that sends `WATCHDOG=1` only while the drain and writer threads
//! make progress, so that systemd restarts an eventd whose data path hangs
//! (a deadlock, a thread stopped in the kernel) even though the process is
//! still there.
//!
//! "Progress" is judged from the counters the threads already keep, never
//! from a clock in the threads themselves, and only for a thread that has
//! work: an idle daemon is healthy.
//!
//! - A **writer** has work while its channel holds items. It makes progress
//!   when it commits, or tries to (a failed commit is counted and retried:
//!   the thread is responsive, the disk is not; restarting would not help).
//! - A **drain** has work while its ring holds unread pages. It makes
//!   progress when it hands on an event or a gap, or skips one recovery
//!   already committed. A drain waiting for room in a full channel gets it
//!   as soon as the writer commits, so it stalls only if its writer does
//!   (and that writer is then stalled too) or if it is stuck itself.
//!
//! A thread is **stalled** when it had work at two checks in a row and its
//! progress count did not move between them (at least half the watchdog
//! timeout). While any thread is stalled no ping is sent, and the log says
//! once which thread and since when; systemd ends eventd when the timeout
//! runs out, and recovery takes over at the next start. Events producers
//! wrote into a partly filled page are not seen as ring backlog: a drain
//! that hangs on them alone is caught once a page fills.

use super::DaemonState;
use crate::threads::Stop;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What one thread had to do and had done, at one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Items waiting for it (channel slots, ring pages); 0 = idle.
    pub work: u64,
    /// A count that moves whenever it makes progress.
    pub done: u64,
}

/// Every watched thread at one check: drains by ring ordinal, then writers
/// by shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub threads: Vec<(String, Mark)>,
}

impl Snapshot {
    /// Reads the counters of every drain and writer (Relaxed loads: the
    /// counters are monitoring values, and a stale one only delays the
    /// verdict by one check).
    pub fn take(state: &DaemonState) -> Snapshot {
        let mut threads = Vec::with_capacity(state.rings.len() + state.shards.len());
        for r in &state.rings {
            let d = &r.drain;
            let done = d.events.load(Ordering::Relaxed)
                + d.lost.load(Ordering::Relaxed)
                + d.skipped.load(Ordering::Relaxed)
                + d.replacements.load(Ordering::Relaxed);
            let ring = r.ring();
            let name = format!("drain of ring {}", super::ring_label(ring.cpu()));
            let work = ring.backlog_pages();
            threads.push((name, Mark { work, done }));
        }
        for (j, s) in state.shards.iter().enumerate() {
            let w = &s.writer;
            let done = w.commits.load(Ordering::Relaxed) + w.commit_errors.load(Ordering::Relaxed);
            let work = s.channel.stats().occupied_slots;
            threads.push((format!("writer of shard {j}"), Mark { work, done }));
        }
        Snapshot { threads }
    }

    /// The threads that had work at both checks and did nothing between
    /// them.
    pub fn stalled_since(&self, before: &Snapshot) -> Vec<String> {
        self.threads
            .iter()
            .zip(&before.threads)
            .filter(|((_, now), (_, then))| now.work > 0 && then.work > 0 && now.done == then.done)
            .map(|((name, _), _)| name.clone())
            .collect()
    }
}

/// The running watchdog thread; stopped when dropped.
pub struct Watchdog {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

/// Sends one ping (`WATCHDOG=1`); returns false when it could not be sent.
pub type Ping = Box<dyn Fn() -> bool + Send>;

impl Watchdog {
    /// Starts checking `state` every quarter of `timeout` (the service
    /// manager's WATCHDOG_USEC), calling `ping` after each check that
    /// finds no stalled thread (and once at the start).
    pub fn start(
        state: Arc<DaemonState>,
        timeout: Duration,
        ping: Ping,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(Stop::default());
        let every = (timeout / 4).max(Duration::from_millis(10));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || run(&state, every, &ping, &s))?;
        tracing::info!(
            timeout_ms = timeout.as_millis() as u64,
            check_ms = every.as_millis() as u64,
            "watchdog on: pinging the service manager while drains and writers make progress"
        );
        Ok(Watchdog {
            stop,
            thread: Some(thread),
        })
    }
}

fn run(state: &DaemonState, every: Duration, ping: &Ping, stop: &Stop) {
    // The snapshots of the last two checks: a stall is judged against the
    // older one, two checks (half the timeout) before.
    let (mut older, mut old): (Option<Snapshot>, Snapshot) = (None, Snapshot::take(state));
    let mut reported: Vec<String> = Vec::new();
    if !ping() {
        tracing::warn!("watchdog: the first ping could not be sent to the service manager");
    }
    while !stop.sleep(every) {
        let now = Snapshot::take(state);
        let stalled = older
            .as_ref()
            .map_or_else(Vec::new, |o| now.stalled_since(o));
        if stalled.is_empty() {
            if !reported.is_empty() {
                tracing::info!("watchdog: every drain and writer makes progress again; pinging");
                reported.clear();
            }
            let _ = ping();
        } else if stalled != reported {
            tracing::error!(
                stalled = %stalled.join(", "),
                no_progress_for_ms = (2 * every).as_millis() as u64,
                "watchdog: a thread with work made no progress; not pinging the service \
                 manager, which restarts eventd when the watchdog timeout runs out"
            );
            reported = stalled;
        }
        older = Some(std::mem::replace(&mut old, now));
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(marks: &[(u64, u64)]) -> Snapshot {
        Snapshot {
            threads: marks
                .iter()
                .enumerate()
                .map(|(i, &(work, done))| (format!("t{i}"), Mark { work, done }))
                .collect(),
        }
    }

    #[test]
    fn only_a_thread_with_work_and_no_progress_is_stalled() {
        let before = snap(&[(0, 5), (3, 5), (3, 5), (3, 5), (0, 5)]);
        let now = snap(&[(0, 5), (3, 6), (3, 5), (0, 5), (4, 5)]);
        // t0 idle; t1 progressed; t2 had work at both checks and did
        // nothing; t3 ran dry; t4 only just got work.
        assert_eq!(now.stalled_since(&before), vec!["t2".to_string()]);
        assert!(now.stalled_since(&now.clone()).len() == 3);
        assert!(snap(&[(0, 0)]).stalled_since(&snap(&[(0, 0)])).is_empty());
    }
}
