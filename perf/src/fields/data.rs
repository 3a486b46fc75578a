//! The day of events the fields scenario stores and queries: seeded rows, their
//! providers, units and words, and where the rare ones are.

use crate::load::Sizes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Rows a drain writes to one shard before moving to the next, and rows
/// per transaction here.
const STRIPE: u64 = 4096;
pub(super) const DAY_NS: i64 = 86_400_000_000_000;
pub(super) const MINUTE_NS: i64 = 60_000_000_000;
/// CPUs (rings) the rows come from.
const CPUS: u64 = 16;
/// The rare provider and the rare word each come in exactly one row of
/// this many, at different offsets.
const RARE_EVERY: u64 = 100_000;
pub(super) const RARE_PROVIDER_AT: u64 = RARE_EVERY / 2;
pub(super) const RARE_WORD_AT: u64 = RARE_EVERY / 4;
pub(super) const RARE_PROVIDER: &str = "backup";
pub(super) const RARE_WORD: &str = "checksum-mismatch";
/// The most frequent provider of the Zipf-like distribution.
pub(super) const COMMON_PROVIDER: &str = "svc-000";
const PROVIDERS: usize = 100;
/// Each provider's event names are these, prefixed with its own name.
const NAMES: &[&str] = &[
    "request",
    "response",
    "connect",
    "disconnect",
    "retry",
    "timeout",
    "flush",
    "reload",
];
/// `fields.unit` takes this many values, uniformly.
const UNITS: u32 = 1000;
pub(super) const UNIT_QUERIED: &str = "u042";
const UIDS: [u32; 20] = [
    0, 1, 2, 33, 100, 101, 102, 103, 104, 105, 106, 107, 108, 111, 996, 997, 998, 1000, 1001, 1002,
];
/// Message vocabulary, separated by spaces. No word holds a `-`, so only
/// the rare rows contain [`RARE_WORD`].
const WORDS: &str = "connection accepted closed served cache miss hit upstream latency retry \
     scheduled worker queue depth flushed bytes written session token refreshed \
     timeout after ms client handshake completed disk usage above threshold backend \
     healthy degraded reload config applied job finished started user login from \
     port buffer resized snapshot taken compaction pending lease renewed peer \
     unreachable checksum verified block mounted volume sync slow query rebuilt";
/// Message bytes, uniform (also the ceiling's, so both insert alike).
pub(super) const MESSAGE_BYTES: Sizes = Sizes { min: 60, max: 200 };
const SEED: u64 = 0x00f1_e1d5;
/// One events row; provider and name are indexes into [`Day`]'s lists.
pub(super) struct Row {
    pub(super) ts: i64,
    pub(super) cpu: i64,
    pub(super) seq: i64,
    pub(super) ring_epoch: i64,
    pub(super) pid: u32,
    pub(super) tid: u32,
    pub(super) uid: u32,
    pub(super) level: u8,
    pub(super) provider: u16,
    pub(super) name: u16,
    pub(super) message: String,
    pub(super) fields: String,
}

/// The deterministic generator of a day of events: row `i` depends only
/// on `i` and the seed (each stripe of rows has its own random stream), so
/// any thread can make any stripe, and a store of N rows is the same
/// whoever builds it.
pub(super) struct Day {
    pub(super) events: u64,
    /// The time of row 0; the rows end just before `t0 + DAY_NS`.
    pub(super) t0: i64,
    /// The common providers, then the rare one.
    pub(super) providers: Vec<String>,
    /// `NAMES.len()` names per provider, in provider order.
    pub(super) names: Vec<String>,
    /// Cumulative probabilities of the common providers (weight 1/k^1.1).
    pub(super) zipf: Vec<f64>,
    /// One ring epoch per CPU.
    pub(super) epochs: Vec<i64>,
    pub(super) words: Vec<&'static str>,
}

impl Day {
    /// A day of `events` rows ending at `end_ns`.
    pub(super) fn new(events: u64, end_ns: i64) -> Day {
        let providers: Vec<String> = (0..PROVIDERS)
            .map(|k| format!("svc-{k:03}"))
            .chain([RARE_PROVIDER.to_string()])
            .collect();
        let names = providers
            .iter()
            .flat_map(|p| NAMES.iter().map(move |n| format!("{p}.{n}")))
            .collect();
        let weights: Vec<f64> = (1..=PROVIDERS)
            .map(|k| 1.0 / (k as f64).powf(1.1))
            .collect();
        let total: f64 = weights.iter().sum();
        let zipf = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        let mut rng = SmallRng::seed_from_u64(SEED);
        Day {
            events: events.max(1),
            t0: end_ns - DAY_NS,
            providers,
            names,
            zipf,
            epochs: (0..CPUS).map(|_| rng.random()).collect(),
            words: WORDS.split_whitespace().collect(),
        }
    }

    pub(super) fn stripes(&self) -> u64 {
        self.events.div_ceil(STRIPE)
    }

    /// Evenly spread over the day, in increasing order.
    pub(super) fn ts(&self, i: u64) -> i64 {
        self.t0 + (i128::from(i) * i128::from(DAY_NS) / i128::from(self.events)) as i64
    }

    /// Rows of stripe `k`.
    pub(super) fn stripe(&self, k: u64) -> Vec<Row> {
        let mut rng = SmallRng::seed_from_u64(SEED ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        (k * STRIPE..((k + 1) * STRIPE).min(self.events))
            .map(|i| self.row(i, &mut rng))
            .collect()
    }

    fn row(&self, i: u64, rng: &mut SmallRng) -> Row {
        let cpu = i % CPUS;
        let provider = if i % RARE_EVERY == RARE_PROVIDER_AT {
            PROVIDERS
        } else {
            let u: f64 = rng.random();
            self.zipf.partition_point(|&c| c < u).min(PROVIDERS - 1)
        };
        let level = level(rng.random_range(0..1000));
        let request = rng.random_range(100_000..1_000_000u32);
        let unit = rng.random_range(0..UNITS);
        let pid = 300 + provider as u32 * 17 + rng.random_range(0..4);
        Row {
            ts: self.ts(i),
            cpu: cpu as i64,
            seq: (i / CPUS + 1) as i64,
            ring_epoch: self.epochs[cpu as usize],
            pid,
            tid: pid + rng.random_range(0..16),
            uid: UIDS[rng.random_range(0..UIDS.len())],
            level,
            provider: provider as u16,
            name: (provider * NAMES.len() + rng.random_range(0..NAMES.len())) as u16,
            message: message(rng, &self.words, request, i % RARE_EVERY == RARE_WORD_AT),
            fields: format!(
                r#"{{"unit":"u{unit:03}","req":{request},"ok":{}}}"#,
                level > 3
            ),
        }
    }

    /// Rows at offset `at` of every [`RARE_EVERY`]: how many rare rows
    /// the day holds.
    pub(super) fn rare_rows(&self, at: u64) -> u64 {
        if self.events > at {
            (self.events - at - 1) / RARE_EVERY + 1
        } else {
            0
        }
    }
}

/// A syslog level from a number in 0..1000: info 80 %, debug 12 %,
/// notice 4 %, warning 2 %, err 1.9 %, crit 0.1 %.
pub(super) fn level(per_mille: u32) -> u8 {
    match per_mille {
        0..800 => 6,
        800..920 => 7,
        920..960 => 5,
        960..980 => 4,
        980..999 => 3,
        _ => 2,
    }
}

/// 60 to 200 bytes of words after a request number; the rare rows start
/// with [`RARE_WORD`] (before any cut, so it is never cut).
pub(super) fn message(rng: &mut SmallRng, words: &[&str], request: u32, rare: bool) -> String {
    let len = rng.random_range(MESSAGE_BYTES.min..=MESSAGE_BYTES.max);
    let mut m = if rare {
        format!("{RARE_WORD} on block {request}: ")
    } else {
        format!("request {request}: ")
    };
    while m.len() < len {
        m.push_str(words[rng.random_range(0..words.len())]);
        m.push(' ');
    }
    m.truncate(len);
    m
}

/// Where the rows of a fill come from: made stripe by stripe as they are
/// inserted, or made before the clock started (`built`).
pub(super) struct Rows<'a> {
    pub(super) day: &'a Day,
    pub(super) built: Option<&'a [Vec<Row>]>,
}

impl Rows<'_> {
    pub(super) fn with_stripe<R>(&self, k: u64, f: impl FnOnce(&[Row]) -> R) -> R {
        match self.built {
            Some(built) => f(&built[k as usize]),
            None => f(&self.day.stripe(k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_ordered_and_rare_rows_are_where_counted() {
        let day = Day::new(250_000, 1_700_000_000_000_000_000);
        let a = day.stripe(12);
        let b = day.stripe(12);
        assert_eq!(a.len(), STRIPE as usize);
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.message == y.message && x.ts == y.ts));
        assert!(a.windows(2).all(|w| w[0].ts < w[1].ts));
        let all: Vec<Row> = (0..day.stripes()).flat_map(|k| day.stripe(k)).collect();
        let rare = all
            .iter()
            .filter(|r| day.providers[usize::from(r.provider)] == RARE_PROVIDER)
            .count();
        let word = all.iter().filter(|r| r.message.contains(RARE_WORD)).count();
        assert_eq!(rare as u64, day.rare_rows(RARE_PROVIDER_AT));
        assert_eq!(word as u64, day.rare_rows(RARE_WORD_AT));
        assert_eq!(rare, 2);
        let err = all.iter().filter(|r| r.level <= 3).count() as f64 / all.len() as f64;
        assert!((0.015..0.025).contains(&err), "{err}");
        assert!(all.iter().all(|r| (60..=200).contains(&r.message.len())));
    }
}
