//! Shard count, descriptor planning, shard assignment and stripe routing:
//! the seed's sharding rules R1–R5, as pure functions computed once at
//! start-up (nothing here is persisted; receipts are the recovery authority).

use std::num::NonZeroU32;

/// Largest explicit `StorageShards` value.
pub const STORAGE_SHARDS_MAX: i64 = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RoutingError {
    #[error(
        "StorageShards = {0} is out of range: 0 (one shard per attached ring, the default) \
         or an explicit count in 1..={STORAGE_SHARDS_MAX}"
    )]
    StorageShards(i64),
    #[error("no KMES ring could be attached, so there is nothing to drain")]
    NoRings,
    #[error(
        "eventd needs about {needed} file descriptors ({detail}) but the soft \
         RLIMIT_NOFILE is {limit}; raise LimitNOFILE in the service unit (the \
         shipped unit sets 262144) or lower StorageShards / MaxConcurrentQueries"
    )]
    Descriptors {
        needed: u64,
        limit: u64,
        detail: String,
    },
}

/// R1: the number of shards to write. `storage_shards` is the configured
/// value: 0 means one shard per attached ring (not capped at 256); 1..=256 is
/// an explicit count; anything else is a configuration error.
pub fn shard_count(storage_shards: i64, attached: usize) -> Result<usize, RoutingError> {
    match storage_shards {
        0 if attached == 0 => Err(RoutingError::NoRings),
        0 => Ok(attached),
        1..=STORAGE_SHARDS_MAX => Ok(storage_shards as usize),
        other => Err(RoutingError::StorageShards(other)),
    }
}

/// R2: the descriptor planning allowance
/// `4·Q·max(E,1) + 4·Q + 3·(E+3) + 2·C + 256` for `q` concurrent queries,
/// `e` query-visible databases and `c` attached rings. Saturates instead of
/// overflowing.
pub fn descriptor_allowance(q: u64, e: u64, c: u64) -> u64 {
    4u64.saturating_mul(q)
        .saturating_mul(e.max(1))
        .saturating_add(4u64.saturating_mul(q))
        .saturating_add(3u64.saturating_mul(e.saturating_add(3)))
        .saturating_add(2u64.saturating_mul(c))
        .saturating_add(256)
}

/// R2: refuses to start when the allowance exceeds the soft descriptor limit.
/// eventd never raises its own limit.
pub fn check_descriptors(q: u64, e: u64, c: u64, soft_limit: u64) -> Result<u64, RoutingError> {
    let needed = descriptor_allowance(q, e, c);
    if needed > soft_limit {
        return Err(RoutingError::Descriptors {
            needed,
            limit: soft_limit,
            detail: format!("{q} concurrent queries, {e} shard databases, {c} rings"),
        });
    }
    Ok(needed)
}

/// R2 for the default query count: the most concurrent queries, at most
/// `q`, whose allowance fits `soft_limit` (`None` if not even one does).
/// Used when MaxConcurrentQueries is not set: eventd still never raises
/// its own limit, it serves fewer queries at once instead.
pub fn queries_that_fit(q: u64, e: u64, c: u64, soft_limit: u64) -> Option<u64> {
    if descriptor_allowance(q, e, c) <= soft_limit {
        return Some(q);
    }
    // The allowance grows with q by 4·max(E,1) + 4 per query.
    let fixed = descriptor_allowance(0, e, c);
    let per_query = 4u64.saturating_mul(e.max(1)).saturating_add(4);
    let fit = soft_limit.checked_sub(fixed)? / per_query;
    (fit >= 1).then_some(fit.min(q))
}

/// The soft RLIMIT_NOFILE of this process.
pub fn soft_descriptor_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit.rlim_cur)
}

/// R3: `x mod n`, with a bit mask when `n` is a power of two. Neither is
/// required of `n`; the mask is only faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modulus {
    Mask(u64),
    Modulo(u64),
}

impl Modulus {
    /// `n` must be positive.
    pub fn new(n: NonZeroU32) -> Self {
        let n = u64::from(n.get());
        if n.is_power_of_two() {
            Modulus::Mask(n - 1)
        } else {
            Modulus::Modulo(n)
        }
    }

    #[inline(always)]
    pub fn reduce(self, x: u64) -> u64 {
        match self {
            Modulus::Mask(mask) => x & mask,
            Modulus::Modulo(n) => x % n,
        }
    }
}

/// R4: for each attached ordinal `c` in `0..attached`, the shards it owns:
/// every `j` in `0..shards` with `j % attached == c`, or, when that is none
/// (fewer shards than rings), shard `c % shards`. Every ordinal gets at least
/// one shard. Both counts must be positive.
pub fn assign(attached: usize, shards: usize) -> Vec<Vec<usize>> {
    assert!(attached > 0 && shards > 0, "assign needs rings and shards");
    let rings = Modulus::new(NonZeroU32::new(attached as u32).unwrap_or(NonZeroU32::MIN));
    (0..attached)
        .map(|c| {
            let owned: Vec<usize> = (0..shards)
                .filter(|&j| rings.reduce(j as u64) == c as u64)
                .collect();
            if owned.is_empty() {
                vec![c % shards]
            } else {
                owned
            }
        })
        .collect()
}

/// R5: routes a drain thread's events in stripes: `stripe_len` consecutive
/// events to one owned shard, then the next owned shard, round and round.
#[derive(Debug, Clone)]
pub struct StripeRouter {
    owned: Vec<usize>,
    stripe_len: u32,
    /// Events left in the current stripe.
    left: u32,
    /// Index into `owned` of the current stripe's shard.
    at: usize,
}

impl StripeRouter {
    /// `owned` must not be empty (R4 guarantees at least one shard).
    pub fn new(owned: Vec<usize>, stripe_len: NonZeroU32) -> Self {
        assert!(!owned.is_empty(), "a drain thread owns at least one shard");
        StripeRouter {
            owned,
            stripe_len: stripe_len.get(),
            left: stripe_len.get(),
            at: 0,
        }
    }

    /// The shard the next event goes to.
    #[inline]
    pub fn next_shard(&mut self) -> usize {
        if self.left == 0 {
            self.left = self.stripe_len;
            self.at += 1;
            if self.at == self.owned.len() {
                self.at = 0;
            }
        }
        self.left -= 1;
        self.owned[self.at]
    }

    pub fn owned(&self) -> &[usize] {
        &self.owned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r1_shard_count() {
        assert_eq!(shard_count(0, 2), Ok(2));
        assert_eq!(
            shard_count(0, 300),
            Ok(300),
            "automatic count is not capped at 256"
        );
        assert_eq!(shard_count(1, 8), Ok(1));
        assert_eq!(shard_count(256, 8), Ok(256));
        assert_eq!(shard_count(257, 8), Err(RoutingError::StorageShards(257)));
        assert_eq!(shard_count(-1, 8), Err(RoutingError::StorageShards(-1)));
        assert_eq!(shard_count(0, 0), Err(RoutingError::NoRings));
        let msg = shard_count(300, 1).unwrap_err().to_string();
        assert!(
            msg.contains("StorageShards = 300") && msg.contains("1..=256"),
            "{msg}"
        );
    }

    #[test]
    fn r2_descriptor_allowance_matches_the_seed() {
        assert_eq!(descriptor_allowance(128, 256, 256), 133_129);
        assert!(descriptor_allowance(128, 256, 256) < 262_144);
        // E = 0 still plans for one database per query.
        assert_eq!(descriptor_allowance(1, 0, 0), 4 + 4 + 9 + 256);
        assert_eq!(descriptor_allowance(u64::MAX, u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn r2_refuses_with_the_numbers_and_the_hint() {
        let err = check_descriptors(128, 256, 2, 1024).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("1024") && msg.contains("LimitNOFILE"), "{msg}");
        assert!(matches!(err, RoutingError::Descriptors { needed, .. } if needed > 1024));
        assert!(check_descriptors(128, 256, 256, 262_144).is_ok());
        assert!(soft_descriptor_limit().unwrap() > 0);
    }

    #[test]
    fn r2_the_default_query_count_shrinks_to_the_most_that_fit() {
        // The README's quick start on 2 CPUs under `ulimit -n 1024`: 1813
        // descriptors at 128 queries.
        assert_eq!(descriptor_allowance(128, 2, 3), 1813);
        let q = queries_that_fit(128, 2, 3, 1024).unwrap();
        assert!(descriptor_allowance(q, 2, 3) <= 1024);
        assert!(descriptor_allowance(q + 1, 2, 3) > 1024);
        assert_eq!(q, 62);
        // A default that fits is kept; never more than asked for.
        assert_eq!(queries_that_fit(128, 256, 256, 262_144), Some(128));
        assert_eq!(queries_that_fit(4, 2, 3, 1 << 20), Some(4));
        // Not even one query fits: refused as before.
        assert_eq!(queries_that_fit(128, 256, 257, 1024), None);
        assert_eq!(queries_that_fit(128, 0, 0, 100), None);
        for e in [0, 1, 2, 7, 64, 200] {
            for limit in [300, 1024, 4096, 65_536] {
                if let Some(q) = queries_that_fit(128, e, e + 1, limit) {
                    assert!(descriptor_allowance(q, e, e + 1) <= limit);
                    assert!(q == 128 || descriptor_allowance(q + 1, e, e + 1) > limit);
                } else {
                    assert!(descriptor_allowance(1, e, e + 1) > limit);
                }
            }
        }
    }

    #[test]
    fn r3_mask_for_powers_of_two_modulo_otherwise() {
        let nz = |n| NonZeroU32::new(n).unwrap();
        assert_eq!(Modulus::new(nz(8)), Modulus::Mask(7));
        assert_eq!(Modulus::new(nz(6)), Modulus::Modulo(6));
        assert_eq!(Modulus::new(nz(1)), Modulus::Mask(0));
        for n in 1..=20u32 {
            let m = Modulus::new(nz(n));
            for x in 0..100u64 {
                assert_eq!(m.reduce(x), x % u64::from(n));
            }
        }
    }

    #[test]
    fn r4_assignment_cases() {
        // More shards than rings, a multiple: even.
        assert_eq!(assign(2, 4), vec![vec![0, 2], vec![1, 3]]);
        // More shards, not a multiple: one ring carries one more.
        assert_eq!(assign(3, 4), vec![vec![0, 3], vec![1], vec![2]]);
        // Equal.
        assert_eq!(assign(4, 4), vec![vec![0], vec![1], vec![2], vec![3]]);
        // Fewer shards than rings: c % shards, shards shared by rings.
        assert_eq!(
            assign(5, 2),
            vec![vec![0], vec![1], vec![0], vec![1], vec![0]]
        );
        assert_eq!(assign(3, 1), vec![vec![0], vec![0], vec![0]]);
        // Every shard is owned by someone, every ring owns something.
        for rings in 1..=12 {
            for shards in 1..=40 {
                let table = assign(rings, shards);
                assert!(table.iter().all(|owned| !owned.is_empty()));
                let mut all: Vec<_> = table.concat();
                all.sort_unstable();
                all.dedup();
                assert_eq!(
                    all,
                    (0..shards).collect::<Vec<_>>(),
                    "{rings} rings, {shards} shards"
                );
            }
        }
    }

    #[test]
    fn r5_stripes_of_fixed_length_rotate_over_owned_shards() {
        let mut router = StripeRouter::new(vec![1, 4, 7], NonZeroU32::new(3).unwrap());
        let got: Vec<_> = (0..12).map(|_| router.next_shard()).collect();
        assert_eq!(got, vec![1, 1, 1, 4, 4, 4, 7, 7, 7, 1, 1, 1]);
        let mut single = StripeRouter::new(vec![5], NonZeroU32::new(1).unwrap());
        assert!((0..10).all(|_| single.next_shard() == 5));
    }
}
