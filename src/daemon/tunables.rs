//! The internal sizes the daemon runs with: chosen by measurement, not
//! operator settings (tests and the load harness set them).

use crate::channel::Capacity;
#[cfg(test)]
use crate::channel::HandoffChannel;
#[cfg(test)]
use crate::drain::Handoff;
use std::num::NonZeroU32;
use std::time::Duration;

/// Internal sizes chosen by measurement with the load harness
/// (docs/performance.md#end-to-end), not operator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    /// R5 stripe length L: consecutive events a drain sends to one shard.
    pub stripe_len: NonZeroU32,
    /// Capacity of each shard's handoff channel (R9); `None` sizes it from
    /// the shard count ([`Tunables::channel_for`]).
    pub channel: Option<Capacity>,
    /// Time between two passes of the retention coordinator.
    pub retention_interval: Duration,
    /// The export stage's HTTP deadline, batch format and worker count.
    pub export: crate::export::ExportTunables,
    /// Attach the rings of CPUs `0..N` instead of the online CPUs: the load
    /// harness's way to run eventd as on a machine with more CPUs than this
    /// one has (`eventd-perf scale`). Never set in production: the rings of
    /// CPUs that do not exist are written only by the harness's producers.
    pub simulated_cpus: Option<u32>,
}

/// All channels together hold at most about this many payload bytes.
const CHANNEL_BYTES_TOTAL: u64 = 64 << 20;
const CHANNEL_BYTES_PER_SHARD: (u64, u64) = (256 << 10, 4 << 20);
/// Slots per KiB of byte budget: events average a few hundred bytes.
const CHANNEL_SLOT_BYTES: u64 = 1024;
/// Slots of a channel, at least. A writer's batch is a few channel-fulls
/// (it commits once a look brings less than half a channel), and with two
/// drains striping over 256 shards the 256 slots that 256 KiB gave held
/// batches near 1,070 events and ingestion at 0.53-0.65 of the ceiling;
/// 512 gave 1,396 and 0.73, for about 26 MiB more at 256 shards (each slot
/// keeps its payload buffer; `eventd-perf scale`,
/// perf/runs/notebook.md#at-server-scale-simulated-rings-eventd-perf-scale-2026-12-02).
const CHANNEL_SLOTS_MIN: u64 = 512;

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            // 4096 > 0, so this is never the None branch.
            stripe_len: NonZeroU32::new(4096).unwrap_or(NonZeroU32::MIN),
            channel: None,
            retention_interval: Duration::from_secs(30),
            export: crate::export::ExportTunables::default(),
            simulated_cpus: None,
        }
    }
}

impl Tunables {
    /// The CPUs whose rings are attached: the online ones, or `0..N` when
    /// simulated.
    pub fn cpus(&self) -> Vec<u32> {
        match self.simulated_cpus {
            Some(n) => (0..n.max(1)).collect(),
            None => crate::rings::online_cpus(),
        }
    }

    /// The channel capacity for `shards` shards: 4 MiB and 4096 slots each
    /// (a writer's batch is about one channel-full, and bigger commits are
    /// cheaper), shrinking with many shards so that all channels together
    /// stay near 64 MiB of payload (256 KiB and 512 slots each at 256
    /// shards).
    pub fn channel_for(&self, shards: usize) -> Capacity {
        if let Some(c) = self.channel {
            return c;
        }
        let (lo, hi) = CHANNEL_BYTES_PER_SHARD;
        let bytes = (CHANNEL_BYTES_TOTAL / shards.max(1) as u64)
            .clamp(lo, hi)
            .next_power_of_two()
            .min(hi);
        Capacity {
            slots: (bytes / CHANNEL_SLOT_BYTES).max(CHANNEL_SLOTS_MIN) as usize,
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_sizes_follow_the_shard_count_and_stay_valid() {
        let t = Tunables::default();
        for (shards, slots, bytes) in [
            (1, 4096, 4 << 20),
            (2, 4096, 4 << 20),
            (16, 4096, 4 << 20),
            (64, 1024, 1 << 20),
            (128, 512, 512 << 10),
            (256, 512, 256 << 10),
            (1000, 512, 256 << 10),
        ] {
            let c = t.channel_for(shards);
            assert_eq!((c.slots, c.bytes), (slots, bytes), "{shards} shards");
            assert!(HandoffChannel::<Handoff>::new(c).is_ok());
        }
        let fixed = Capacity {
            slots: 64,
            bytes: 1 << 16,
        };
        let t = Tunables {
            channel: Some(fixed),
            ..t
        };
        assert_eq!(t.channel_for(2), fixed);
    }
}
