//! The rate limits as they run: the global `RateLimitInterval` and
//! `RateLimitBurst`, and the overrides for some sources, shared by every
//! drain's [`Limiter`](super::limit::Limiter) and set again by a reload.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `RateLimitInterval` and `RateLimitBurst` as they run, in one word
/// (milliseconds in the high half, the burst in the low half), so a reload
/// changes both at once and each drain reads one atomic per event; and
/// the overrides, which a drain copies when their generation changes.
#[derive(Debug)]
pub struct RateLimits {
    word: AtomicU64,
    overrides: Mutex<Arc<[SourceLimit]>>,
    /// Bumped by every [`RateLimits::set_overrides`].
    generation: AtomicU64,
}

/// Which sources an override is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matches {
    /// Events whose provider is this (a producer's, or a syslog tag).
    Provider(String),
    /// Sources keyed on this unit (eventd's own rings).
    Unit(String),
    /// Events of this uid.
    Uid(u32),
}

/// An override: its sources get `burst` events per `interval_ms` (either
/// 0: never limited) instead of the global limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLimit {
    pub matches: Matches,
    pub interval_ms: u64,
    pub burst: u64,
}

impl SourceLimit {
    pub(super) fn limit(&self) -> Option<(u64, u64)> {
        (self.interval_ms > 0 && self.burst > 0).then_some((self.interval_ms, self.burst))
    }
}

impl RateLimits {
    /// `interval_ms` and `burst` cut to 32 bits (the configuration's
    /// ranges are well inside); either 0 turns limiting off.
    pub fn new(interval_ms: u64, burst: u64) -> Self {
        RateLimits {
            word: AtomicU64::new(pack(interval_ms, burst)),
            overrides: Mutex::new(Arc::new([])),
            generation: AtomicU64::new(0),
        }
    }

    pub fn set(&self, interval_ms: u64, burst: u64) {
        // Relaxed: the drains only need the new budget eventually; the
        // word guards nothing else.
        self.word.store(pack(interval_ms, burst), Ordering::Relaxed);
    }

    /// The interval in ms and the burst; `None` when limiting is off.
    pub fn get(&self) -> Option<(u64, u64)> {
        // Relaxed: see `set`.
        let w = self.word.load(Ordering::Relaxed);
        let (interval, burst) = (w >> 32, w & 0xffff_ffff);
        (interval > 0 && burst > 0).then_some((interval, burst))
    }

    /// Replaces the overrides (the first that matches a source wins).
    pub fn set_overrides(&self, list: Vec<SourceLimit>) {
        let mut held = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        if *held.as_ref() == list[..] {
            return;
        }
        *held = list.into();
        // Relaxed: the list itself is read under the mutex; a drain that
        // sees the new generation takes the lock and gets this list or a
        // newer one, and one that does not yet sees it at a later event.
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The overrides and their generation.
    pub(super) fn overrides(&self) -> (u64, Arc<[SourceLimit]>) {
        let held = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        // Relaxed: read under the lock that `set_overrides` bumps it under.
        (self.generation.load(Ordering::Relaxed), held.clone())
    }

    pub(super) fn generation(&self) -> u64 {
        // Relaxed: see `set_overrides`.
        self.generation.load(Ordering::Relaxed)
    }
}

fn pack(interval_ms: u64, burst: u64) -> u64 {
    (interval_ms.min(u32::MAX.into()) << 32) | burst.min(u32::MAX.into())
}
