//! Record ids: UUIDv7 whose bucket characters are random.
//!
//! Layout (RFC 9562): 48 bits of Unix milliseconds, the version (7), 12 bits
//! `rand_a`, the variant (`10`), 62 bits `rand_b`. The canonical text is
//! `tttttttt-tttt-7aaa-Vbbb-bbbbbbbbbbbb`; characters 24–25 (the start of the
//! last group) are the record's bucket.
//!
//! Common generators keep ids of one millisecond in order with a counter in
//! the top of `rand_b`, which is where the bucket characters are: a burst
//! then lands in one bucket for hundreds of ids. Here the counter is
//! `rand_a` (4096 ids per millisecond; past that the timestamp moves on by a
//! millisecond) and all of `rand_b` is random, so a burst spreads over the
//! 256 buckets from its first record, and ids from one generator still sort
//! in creation order.

use std::sync::Mutex;

/// A canonical, lower-case UUID text (36 characters).
pub type Id = String;

/// Where the last id left off: (milliseconds, counter).
static LAST: Mutex<(u64, u16)> = Mutex::new((0, 0));

const COUNTER_MAX: u16 = 0x0fff;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A new id, greater than every id this process made before it.
pub fn new_id() -> Id {
    let (ms, counter) = {
        // A poisoned lock still holds the last (ms, counter) pair, which
        // is all it guards.
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        let now = now_ms();
        *last = if now > last.0 {
            (now, 0)
        } else if last.1 < COUNTER_MAX {
            (last.0, last.1 + 1)
        } else {
            // 4096 ids in one millisecond: borrow the next one (the clock
            // catches up; order is kept).
            (last.0 + 1, 0)
        };
        *last
    };
    format_id(ms, counter, rand::random::<u64>())
}

/// The canonical text of a UUIDv7 from its parts (`random`'s top two bits
/// are replaced by the variant).
fn format_id(ms: u64, counter: u16, random: u64) -> Id {
    let high = (ms & 0xffff_ffff_ffff) << 16 | 0x7000 | u64::from(counter & COUNTER_MAX);
    let low = (random >> 2) | 0x8000_0000_0000_0000;
    let h = format!("{high:016x}");
    let l = format!("{low:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &l[0..4],
        &l[4..16]
    )
}

/// Whether `id` is a canonical lower-case UUID text.
pub fn is_canonical(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// A canonical id as a number. Canonical ids have fixed-width lower-case
/// hex digits, so the numbers sort as the texts do; indexes hold ids this
/// way (16 bytes, no allocation). `None` if `id` is not canonical.
pub fn to_u128(id: &str) -> Option<u128> {
    if !is_canonical(id) {
        return None;
    }
    let mut n = 0u128;
    for b in id.bytes().filter(|&b| b != b'-') {
        // Canonical: only 0-9 and a-f remain.
        let digit = if b.is_ascii_digit() {
            b - b'0'
        } else {
            b - b'a' + 10
        };
        n = n << 4 | u128::from(digit);
    }
    Some(n)
}

/// The canonical text of an id number.
pub fn from_u128(n: u128) -> Id {
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The bucket of a record: characters 24–25 of its canonical id. A pure
/// function of the id text, whoever generated it; `None` if `id` is not a
/// canonical UUID.
pub fn bucket(id: &str) -> Option<&str> {
    is_canonical(id).then(|| &id[24..26])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_numbers_round_trip_and_sort_like_the_texts() {
        let mut ids: Vec<Id> = (0..2000).map(|_| new_id()).collect();
        ids.push("00000000-0000-0000-0000-000000000000".into());
        ids.push("ffffffff-ffff-ffff-ffff-ffffffffffff".into());
        for id in &ids {
            assert_eq!(&from_u128(to_u128(id).unwrap()), id);
        }
        let mut by_text = ids.clone();
        by_text.sort();
        let mut by_number: Vec<u128> = ids.iter().map(|i| to_u128(i).unwrap()).collect();
        by_number.sort();
        let back: Vec<Id> = by_number.into_iter().map(from_u128).collect();
        assert_eq!(back, by_text);
        assert_eq!(to_u128("018BCFE5-6800-7000-8000-2d5dba6274da"), None);
    }

    #[test]
    fn ids_are_v7_canonical_and_ordered() {
        let ids: Vec<Id> = (0..20_000).map(|_| new_id()).collect();
        for id in &ids {
            assert!(is_canonical(id), "{id}");
            assert_eq!(&id[14..15], "7", "version");
            assert!(
                matches!(&id[19..20], "8" | "9" | "a" | "b"),
                "variant: {id}"
            );
        }
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "monotonic");
    }

    #[test]
    fn a_burst_spreads_over_all_buckets_from_the_start() {
        // 4096 ids made as fast as possible (mostly in one millisecond).
        let mut counts = [0u32; 256];
        for _ in 0..4096 {
            let id = new_id();
            let b = u8::from_str_radix(bucket(&id).unwrap(), 16).unwrap();
            counts[b as usize] += 1;
        }
        // 16 per bucket on average; a counter in the bucket bits would put
        // them all in a handful.
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert!(counts.iter().all(|&c| c < 48), "{counts:?}");
        // The first 256 ids already cover most buckets.
        let first: std::collections::BTreeSet<String> = (0..256)
            .map(|_| bucket(&new_id()).unwrap().to_string())
            .collect();
        assert!(first.len() > 140, "{}", first.len());
    }

    #[test]
    fn bucket_is_a_pure_function_of_the_text() {
        let id = "018bcfe5-6800-7000-8000-2d5dba6274da";
        assert_eq!(bucket(id), Some("2d"));
        assert_eq!(bucket("018BCFE5-6800-7000-8000-2D5DBA6274DA"), None);
        assert_eq!(bucket("not-an-id"), None);
        assert_eq!(bucket("018bcfe5-6800-7000-8000-2d5dba6274d"), None);
        let made = format_id(0x018b_cfe5_6800, 0, 0x2d5d_ba62_74da << 2);
        assert_eq!(made, id);
    }
}
