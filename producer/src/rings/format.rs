//! The KMES ring file format: geometry, header words, and the packed words
//! producers and the reader exchange. `docs/design/rings.md` has the byte-level table.
//!
//! A ring file is `512 + page_count × page_size` bytes: a 512-byte header,
//! then `page_count` data pages. Everything is little-endian and 8-byte aligned, and
//! every field that changes after creation is a 64-bit word accessed atomically.

/// "KMESRNG1" read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"KMESRNG1");
pub const VERSION: u32 = 1;

pub const PAGE_SIZE_MIN: usize = 64;
pub const PAGE_SIZE_MAX: usize = 32 * 1024;
pub const PAGE_COUNT_MIN: usize = 2;
pub const PAGE_COUNT_MAX: usize = 1 << 20;
/// Default data page size: big enough for a 16 KiB event.
pub const PAGE_SIZE_DEFAULT: usize = 16 * 1024;
/// Default ring size (data pages only): 4 MiB.
pub const RING_BYTES_DEFAULT: usize = 4 << 20;

// Header words (index of the u64 word from the start of the file).
pub const H_MAGIC: usize = 0;
/// version (low 32 bits) | header words in use (high 32 bits)
pub const H_VERSION: usize = 1;
pub const H_EPOCH: usize = 2;
/// page_size (low 32) | page_count (high 32)
pub const H_GEOMETRY: usize = 3;
/// logical cpu id (low 32)
pub const H_CPU: usize = 4;
pub const H_CREATED_NS: usize = 5;
/// The reservation word (see [`Reserve`]); alone on its 128-byte line.
pub const H_RESERVE: usize = 16;
/// The reader's published position ([`Reserve`] layout without flags) and the
/// sequence number it expects next; on their own line.
pub const H_READ_POS: usize = 32;
pub const H_READ_SEQ: usize = 33;
/// The reader's futex word (low 32 bits of this word's address).
pub const H_FUTEX: usize = 34;
/// Events producers refused before they got a sequence number (the ring
/// stayed contended or inconsistent for the whole bounded retry).
pub const H_PRODUCER_REFUSED: usize = 48;
/// The daemon's rate limit, for producers' own budgets to follow
/// ([`RateLimitWord`]); 0 until a daemon publishes one.
pub const H_RATE_LIMIT: usize = 49;
pub const HEADER_WORDS_USED: u32 = 50;
/// The header's size in words (512 bytes).
pub const HEADER_WORDS: usize = 64;
const _: () = assert!(HEADER_WORDS_USED as usize <= HEADER_WORDS);

/// Record header words (from the record's first word).
pub const R_STATE: usize = 0;
pub const R_CHECKSUM: usize = 1;
pub const R_TS: usize = 2;
/// pid (low 32) | tid (high 32)
pub const R_PID_TID: usize = 3;
/// uid (low 32) | level (8) | provider_len (8) | name_len (8) | flags (8, see `typed`)
pub const R_UID_LEVEL: usize = 4;
/// message_len (low 32) | fields_len (high 32)
pub const R_LENGTHS: usize = 5;
pub const RECORD_HEADER_WORDS: usize = 6;

/// Tickets (free-running page numbers) are 40-bit and compared modulo 2^40.
pub const TICKET_BITS: u32 = 40;
pub const TICKET_MASK: u64 = (1 << TICKET_BITS) - 1;
/// Sequence numbers are stored as their low 40 bits; the reader rebuilds the
/// full value from the one it expects.
pub const SEQ_LOW_BITS: u32 = 40;
pub const SEQ_LOW_MASK: u64 = (1 << SEQ_LOW_BITS) - 1;
/// Page tickets kept in a page's meta word: low 24 bits.
const META_TICKET_BITS: u32 = 24;
const META_TICKET_MASK: u64 = (1 << META_TICKET_BITS) - 1;

/// Most records one page may hold.
pub const RECORDS_PER_PAGE_MAX: u32 = (1 << 10) - 1;

/// Sizes of a ring, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub page_size: usize,
    pub page_count: usize,
}

impl Geometry {
    /// Checks the sizes; `None` if outside the format's limits.
    pub fn new(page_size: usize, page_count: usize) -> Option<Self> {
        let ok = page_size.is_power_of_two()
            && (PAGE_SIZE_MIN..=PAGE_SIZE_MAX).contains(&page_size)
            && page_count.is_power_of_two()
            && (PAGE_COUNT_MIN..=PAGE_COUNT_MAX).contains(&page_count);
        ok.then_some(Self {
            page_size,
            page_count,
        })
    }

    /// Geometry for about `ring_bytes` of data in pages of `page_size`.
    pub fn for_ring_bytes(ring_bytes: usize, page_size: usize) -> Option<Self> {
        let pages = (ring_bytes / page_size.max(1)).max(PAGE_COUNT_MIN);
        Self::new(page_size, pages.checked_next_power_of_two()?)
    }

    pub fn file_bytes(&self) -> usize {
        HEADER_WORDS * 8 + self.page_count * self.page_size
    }

    pub fn file_words(&self) -> usize {
        self.file_bytes() / 8
    }

    pub fn page_words(&self) -> usize {
        self.page_size / 8
    }

    /// Words of a page available to records (the first holds the meta word).
    pub fn data_words(&self) -> u32 {
        (self.page_words() - 1) as u32
    }

    /// Word index of the meta word of page `ticket`.
    pub fn meta_index(&self, ticket: u64) -> usize {
        let slot = (ticket as usize) & (self.page_count - 1);
        HEADER_WORDS + slot * self.page_words()
    }

    /// Word index of data word `offset` of page `ticket` (`offset <
    /// data_words()`).
    pub fn data_index(&self, ticket: u64, offset: u32) -> usize {
        debug_assert!(offset < self.data_words());
        self.meta_index(ticket) + 1 + offset as usize
    }

    /// Largest payload (provider + name + message + fields bytes) one record
    /// can carry.
    pub fn payload_bytes_max(&self) -> usize {
        (self.data_words() as usize - RECORD_HEADER_WORDS) * 8
    }
}

/// The reservation word, `H_RESERVE`:
///
/// | bits   | field  | meaning                                              |
/// |--------|--------|------------------------------------------------------|
/// | 24..64 | ticket | page being filled (free-running, mod 2^40)           |
/// | 11..24 | offset | next free data word in that page; `CLOSED` when full |
/// | 1..11  | count  | records reserved in that page                        |
/// | 0      | WAIT   | the reader sleeps and wants a wake after the next commit |
///
/// The reader's published position uses the same layout (WAIT clear).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    pub ticket: u64,
    pub offset: u32,
    pub count: u32,
    pub wait: bool,
}

impl Reserve {
    /// Offset value that marks a page closed to new reservations.
    pub const CLOSED: u32 = (1 << 13) - 1;
    /// Offset value that marks the whole ring given up by the daemon (it
    /// made a new ring in its place): producers stop and reopen the file.
    /// Beyond every real offset (a page holds at most 4095 data words).
    pub const RETIRED: u32 = Self::CLOSED - 1;

    pub fn pack(self) -> u64 {
        debug_assert!(self.offset <= Self::CLOSED && self.count <= RECORDS_PER_PAGE_MAX);
        ((self.ticket & TICKET_MASK) << 24)
            | (u64::from(self.offset) << 11)
            | (u64::from(self.count) << 1)
            | u64::from(self.wait)
    }

    pub fn unpack(word: u64) -> Self {
        Self {
            ticket: word >> 24,
            offset: ((word >> 11) & 0x1FFF) as u32,
            count: ((word >> 1) & 0x3FF) as u32,
            wait: word & 1 != 0,
        }
    }

    pub fn closed(&self) -> bool {
        self.offset == Self::CLOSED
    }
}

/// A page's meta word: which ticket it holds and the sequence number of its
/// first record. `ticket_low` (24 bits) | `first_seq_low` (40 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub ticket_low: u64,
    pub first_seq_low: u64,
}

impl Meta {
    pub fn new(ticket: u64, first_seq: u64) -> Self {
        Self {
            ticket_low: ticket & META_TICKET_MASK,
            first_seq_low: first_seq & SEQ_LOW_MASK,
        }
    }

    pub fn pack(self) -> u64 {
        (self.ticket_low << SEQ_LOW_BITS) | self.first_seq_low
    }

    pub fn unpack(word: u64) -> Self {
        Self {
            ticket_low: word >> SEQ_LOW_BITS,
            first_seq_low: word & SEQ_LOW_MASK,
        }
    }

    pub fn holds(&self, ticket: u64) -> bool {
        self.ticket_low == ticket & META_TICKET_MASK
    }

    /// Whether the page holds a ticket later than `ticket` (it was reused).
    pub fn holds_later_than(&self, ticket: u64) -> bool {
        let diff = self.ticket_low.wrapping_sub(ticket) & META_TICKET_MASK;
        diff != 0 && diff < (1 << (META_TICKET_BITS - 1))
    }
}

/// States of a record's state word.
pub const STATE_RESERVED: u64 = 1;
pub const STATE_COMMITTED: u64 = 2;
pub const STATE_ABANDONED: u64 = 3;

/// A record's state word: `seq_low` (bits 24..64) | `words` (bits 11..24, the
/// record's length in 8-byte words, header included) | state (bits 0..2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordState {
    pub seq_low: u64,
    pub words: u32,
    pub state: u64,
}

impl RecordState {
    pub fn pack(self) -> u64 {
        ((self.seq_low & SEQ_LOW_MASK) << 24) | (u64::from(self.words & 0x1FFF) << 11) | self.state
    }

    pub fn unpack(word: u64) -> Self {
        Self {
            seq_low: word >> 24,
            words: ((word >> 11) & 0x1FFF) as u32,
            state: word & 0b11,
        }
    }
}

/// `a - b` for 40-bit tickets, as a signed distance.
pub fn ticket_distance(a: u64, b: u64) -> i64 {
    let diff = a.wrapping_sub(b) & TICKET_MASK;
    if diff >= 1 << (TICKET_BITS - 1) {
        diff as i64 - (1i64 << TICKET_BITS)
    } else {
        diff as i64
    }
}

/// The full sequence number whose low 40 bits are `low`, nearest at or after
/// `reference` (a record is never older than what the reader expects next);
/// `None` past `u64::MAX`.
pub fn seq_from_low(low: u64, reference: u64) -> Option<u64> {
    reference.checked_add(low.wrapping_sub(reference) & SEQ_LOW_MASK)
}

/// Checksum of a record: seeded with its state word's sequence and length,
/// then every word after the checksum word, alternating between two lanes so
/// the two multiply chains run in parallel. Each step is a bijection of its
/// lane for a given input word, and the lanes are combined so that a change
/// in either changes the result: any single changed word is always caught,
/// and a torn or scribbled record fails it with overwhelming probability.
#[derive(Debug, Clone, Copy)]
pub struct Checksum {
    /// The lane the next word goes into, and the other one.
    a: u64,
    b: u64,
}

impl Checksum {
    /// Seeded with the state word's sequence and length (not its state bits,
    /// which go from RESERVED to COMMITTED after the checksum is written).
    pub fn new(state: u64) -> Self {
        let seed = (state & !0b11) ^ 0x9E37_79B9_7F4A_7C15;
        Self {
            a: seed,
            b: seed.rotate_left(32) ^ 0xC2B2_AE3D_27D4_EB4F,
        }
    }

    #[inline(always)]
    pub fn add(&mut self, word: u64) {
        let mixed = (self.a ^ word)
            .wrapping_mul(0x100_0000_01B3)
            .rotate_left(29);
        // Swap lanes: the next word mixes into the lane not touched now.
        self.a = self.b;
        self.b = mixed;
    }

    pub fn finish(self) -> u64 {
        // `a` goes through a bijection, then `b` is xored in: the result is
        // a bijection of each lane with the other fixed.
        let a = (self.a ^ (self.a >> 32)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        a ^ self.b
    }
}

pub fn checksum(state: u64, body: &[u64]) -> u64 {
    let mut c = Checksum::new(state);
    for &w in body {
        c.add(w);
    }
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let r = Reserve {
            ticket: TICKET_MASK,
            offset: Reserve::CLOSED,
            count: RECORDS_PER_PAGE_MAX,
            wait: true,
        };
        assert_eq!(Reserve::unpack(r.pack()), r);
        let m = Meta::new(0xABCDEF12, (1 << 45) + 7);
        assert_eq!(Meta::unpack(m.pack()), m);
        assert!(m.holds(0xABCDEF12));
        assert!(m.holds(0x01_00CD_EF12), "only the low 24 bits are kept");
        let s = RecordState {
            seq_low: SEQ_LOW_MASK,
            words: 4095,
            state: STATE_COMMITTED,
        };
        assert_eq!(RecordState::unpack(s.pack()), s);
    }

    #[test]
    fn tickets_and_sequences_wrap() {
        assert_eq!(ticket_distance(0, TICKET_MASK), 1);
        assert_eq!(ticket_distance(TICKET_MASK, 0), -1);
        assert_eq!(seq_from_low(5, 3), Some(5));
        assert_eq!(seq_from_low(2, (1 << 40) - 1), Some((1 << 40) + 2));
        assert_eq!(seq_from_low(0, u64::MAX - 1), None);
        let m = Meta::new(10, 1);
        assert!(m.holds_later_than(9));
        assert!(!m.holds_later_than(10));
        assert!(!m.holds_later_than(11));
    }

    #[test]
    fn geometry_limits() {
        assert!(Geometry::new(100, 4).is_none());
        assert!(Geometry::new(4096, 1).is_none());
        assert!(Geometry::new(64 * 1024, 4).is_none());
        let g = Geometry::for_ring_bytes(RING_BYTES_DEFAULT, PAGE_SIZE_DEFAULT).unwrap();
        assert_eq!(g.page_count, 256);
        assert_eq!(g.file_bytes(), 512 + 256 * 16 * 1024);
        assert_eq!(g.meta_index(256), g.meta_index(0));
        assert!(g.data_index(255, g.data_words() - 1) < g.file_words());
        // Offsets and counts fit their fields at the largest page.
        let big = Geometry::new(PAGE_SIZE_MAX, 2).unwrap();
        assert!(big.data_words() < Reserve::RETIRED);
    }
}

/// The rate limit a daemon publishes in its rings' headers
/// ([`H_RATE_LIMIT`]): bit 63 says it was published; the interval in ms
/// in bits 32..63, the burst in the low 32 bits (either 0: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitWord {
    pub interval_ms: u64,
    pub burst: u64,
}

impl RateLimitWord {
    const PUBLISHED: u64 = 1 << 63;
    const FIELD_MAX: u64 = (1 << 31) - 1;

    /// Both values cut to 31 bits (the configuration's ranges are inside).
    pub fn pack(self) -> u64 {
        Self::PUBLISHED
            | (self.interval_ms.min(Self::FIELD_MAX) << 32)
            | self.burst.min(Self::FIELD_MAX)
    }

    /// `None` when no daemon has published a limit in this word.
    pub fn unpack(word: u64) -> Option<RateLimitWord> {
        (word & Self::PUBLISHED != 0).then_some(RateLimitWord {
            interval_ms: (word >> 32) & Self::FIELD_MAX,
            burst: word & 0xffff_ffff,
        })
    }
}
