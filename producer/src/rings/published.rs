//! The header words the daemon and the producers publish to each other:
//! what producers refused, the limit they follow, where the reader is.

use super::format::{H_PRODUCER_REFUSED, H_RATE_LIMIT, H_READ_POS, H_READ_SEQ};
use super::{RateLimitWord, ReadPosition, Ring};
use crate::sync::Ordering;

impl Ring {
    /// Events producers refused before they got a sequence number (so no
    /// gap accounts for them).
    pub fn producer_refusals(&self) -> u64 {
        // Relaxed: a statistic.
        self.mem.word(H_PRODUCER_REFUSED).load(Ordering::Relaxed)
    }

    /// The rate limit the daemon published for this ring's producers.
    pub fn rate_limit(&self) -> Option<RateLimitWord> {
        // Relaxed: a setting read on its own; it orders nothing.
        RateLimitWord::unpack(self.mem.word(H_RATE_LIMIT).load(Ordering::Relaxed))
    }

    /// Publishes the daemon's rate limit for this ring's producers (they
    /// look at it about once a second); a no-op when it is already there.
    pub fn publish_rate_limit(&self, limit: RateLimitWord) {
        let word = self.mem.word(H_RATE_LIMIT);
        // Relaxed: see `rate_limit`.
        if word.load(Ordering::Relaxed) != limit.pack() {
            word.store(limit.pack(), Ordering::Relaxed);
        }
    }

    /// The position the reader last published and the sequence it expects
    /// next there.
    pub fn published_read_position(&self) -> ReadPosition {
        // Relaxed: monitoring only.
        ReadPosition::from_words(
            self.mem.word(H_READ_POS).load(Ordering::Relaxed),
            self.mem.word(H_READ_SEQ).load(Ordering::Relaxed),
        )
    }
}
