//! Starting the drains: one thread per drained ring, each owning the
//! shards its assignment gives it (R4) and striping over them (R5).

use super::{CommitTracker, DrainParts, DrainStats, DrainThread, Handoff, RingMaker, RingPlan};
use crate::channel::Sender;
use crate::rings::drops::Drops;
use crate::rings::{is_own_ring, ring_name, CurrentRing, Ring, RingReader};
use crate::routing::StripeRouter;
use crate::threads::{join_all, spawn_watched, FailureHook, Watched};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One ring to drain, with what it starts from.
pub struct DrainSpec {
    pub ring: Arc<Ring>,
    pub plan: RingPlan,
    /// The shards it sends to (R4).
    pub shards: Vec<usize>,
    /// How it makes a new ring in place of one it gives up.
    pub maker: RingMaker,
    /// For eventd's own syslog ring: the messages dropped before they
    /// reached it, reported into it.
    pub drops: Option<Arc<Drops>>,
}

/// Every drain, started.
pub struct Drains {
    /// By ordinal: where the ring each drain reads is now, and its counters.
    pub rings: Vec<(Arc<CurrentRing>, Arc<DrainStats>)>,
    pub threads: Vec<Watched>,
}

/// What every drain shares.
pub struct Shared<'a> {
    /// Every shard's sender, by shard index.
    pub senders: &'a [Sender<Handoff>],
    pub stripe_len: NonZeroU32,
    /// Set at shutdown (the drains stop reading).
    pub stop: &'a Arc<AtomicBool>,
    /// By ordinal.
    pub trackers: &'a Arc<[CommitTracker]>,
    pub hook: &'a FailureHook,
    /// The rate limits as they run, and the drains' account of what they
    /// suppressed.
    pub limits: &'a Arc<super::RateLimits>,
    pub suppression: &'a Arc<super::Suppression>,
}

/// Starts one drain per spec, in ordinal order. If one cannot be started,
/// those already running are stopped and joined before the error is
/// returned.
pub fn spawn_drains(specs: Vec<DrainSpec>, shared: &Shared<'_>) -> std::io::Result<Drains> {
    let mut drains = Drains {
        rings: Vec::with_capacity(specs.len()),
        threads: Vec::with_capacity(specs.len()),
    };
    for (ordinal, spec) in specs.into_iter().enumerate() {
        let ring = spec.ring.clone();
        match spawn_drain(ordinal, spec, shared) {
            Ok((current, stats, thread)) => {
                drains.rings.push((current, stats));
                drains.threads.push(thread);
            }
            Err(e) => {
                // Relaxed: as the daemon's own stop.
                shared.stop.store(true, Ordering::Relaxed);
                for (current, _) in &drains.rings {
                    current.get().wake_reader();
                }
                ring.wake_reader();
                join_all(drains.threads, &mut Vec::new());
                return Err(e);
            }
        }
    }
    Ok(drains)
}

type Started = (Arc<CurrentRing>, Arc<DrainStats>, Watched);

fn spawn_drain(ordinal: usize, spec: DrainSpec, shared: &Shared<'_>) -> std::io::Result<Started> {
    let mut mine = vec![None; shared.senders.len()];
    for &j in &spec.shards {
        mine[j] = Some(shared.senders[j].clone());
    }
    let current = Arc::new(CurrentRing::new(spec.ring.clone()));
    let stats = Arc::new(DrainStats::default());
    let cpu = spec.ring.cpu();
    let parts = DrainParts {
        senders: mine,
        stop: shared.stop.clone(),
        stats: stats.clone(),
        current: current.clone(),
        trackers: shared.trackers.clone(),
        maker: spec.maker,
        drops: spec.drops,
        limiter: super::limit::Limiter::new(
            shared.limits.clone(),
            shared.suppression.clone(),
            is_own_ring(cpu),
        ),
    };
    let drain = DrainThread::new(
        ordinal as u32,
        RingReader::resume(spec.ring, spec.plan.resume),
        StripeRouter::new(spec.shards, shared.stripe_len),
        &spec.plan,
        parts,
    );
    let (name, what) = if is_own_ring(cpu) {
        let ring = ring_name(cpu);
        (format!("drain-{ring}"), format!("drain of the {ring} ring"))
    } else {
        (format!("drain-{cpu:03}"), format!("drain of cpu {cpu}"))
    };
    let thread = spawn_watched(name, what, shared.hook, move || drain.run())?;
    Ok((current, stats, thread))
}
