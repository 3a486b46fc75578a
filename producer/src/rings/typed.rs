//! Typed fields: an event's structured fields in binary, as producers write
//! them on the fast path (no number formatting, no escaping), and their
//! decoding into the same JSON object text the formatted path stores.
//!
//! A record whose word 4 has [`FLAG_TYPED_FIELDS`] in its high byte holds,
//! in place of the fields' JSON text, a run of entries back to back:
//!
//! | bytes | what |
//! |---|---|
//! | 1 | key length k (u8) |
//! | k | key, UTF-8 |
//! | 1 | kind: 1 i64, 2 u64, 3 f64, 4 bool, 5 str |
//! | 8 / 8 / 8 / 1 / 4 + n | the value: little-endian integer, f64 bits, 0 or 1, or a u32 length n and n bytes of UTF-8 |
//!
//! The reader checks every length, kind and string before it trusts one
//! ([`entries`]); a payload that does not parse is a corrupt record. The
//! drain turns the entries into JSON with [`to_json`] (a key seen twice is
//! kept the first time, as the formatted path does), so what is stored
//! does not depend on which path wrote the event.

use super::json::Fields;
use std::mem::MaybeUninit;

/// The high byte of a record's word 4: its fields are typed entries.
pub const FLAG_TYPED_FIELDS: u8 = 1;
/// Every flag this version knows; a record with another bit set is corrupt.
pub const FLAGS_KNOWN: u8 = FLAG_TYPED_FIELDS;

pub const KIND_I64: u8 = 1;
pub const KIND_U64: u8 = 2;
pub const KIND_F64: u8 = 3;
pub const KIND_BOOL: u8 = 4;
pub const KIND_STR: u8 = 5;

/// The longest key an entry holds, in bytes; longer keys are cut at a
/// character boundary.
pub const KEY_BYTES_MAX: usize = 255;

/// One field's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
    Str(&'a str),
}

/// One field: a key and its typed value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field<'a> {
    pub key: &'a str,
    pub value: Value<'a>,
}

impl<'a> Field<'a> {
    pub fn new(key: &'a str, value: Value<'a>) -> Self {
        Field { key, value }
    }

    /// Bytes this entry takes.
    #[inline]
    fn encoded_len(&self) -> usize {
        1 + truncate(self.key, KEY_BYTES_MAX).len()
            + 1
            + match self.value {
                Value::I64(_) | Value::U64(_) | Value::F64(_) => 8,
                Value::Bool(_) => 1,
                Value::Str(s) => 4 + truncate(s, u32::MAX as usize).len(),
            }
    }

    #[inline(always)]
    fn encode(&self, out: &mut impl Sink) {
        let key = truncate(self.key, KEY_BYTES_MAX).as_bytes();
        match self.value {
            Value::I64(v) => out.entry(key, KIND_I64, &v.to_le_bytes(), &[]),
            Value::U64(v) => out.entry(key, KIND_U64, &v.to_le_bytes(), &[]),
            Value::F64(v) => out.entry(key, KIND_F64, &v.to_bits().to_le_bytes(), &[]),
            Value::Bool(v) => out.entry(key, KIND_BOOL, &[u8::from(v)], &[]),
            Value::Str(s) => {
                let s = truncate(s, u32::MAX as usize).as_bytes();
                out.entry(key, KIND_STR, &(s.len() as u32).to_le_bytes(), s)
            }
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary (every client
/// cuts names, keys and text this one way).
#[inline]
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Where encoded bytes go.
trait Sink {
    /// Appends `bytes`.
    fn put(&mut self, bytes: &[u8]);
    /// Appends one entry: `key` (at most [`KEY_BYTES_MAX`] bytes) after
    /// its length, `kind`, then `head` (the value, or a string's length)
    /// and `tail` (a string's bytes). One room check for all of it.
    fn entry(&mut self, key: &[u8], kind: u8, head: &[u8], tail: &[u8]);
}

/// Writes an entry (see [`Sink::entry`]) at `dst`; returns its length.
///
/// # Safety
/// `dst` is valid for writing [`entry_len`] bytes and overlaps none of the
/// slices.
#[inline(always)]
unsafe fn write_entry(dst: *mut u8, key: &[u8], kind: u8, head: &[u8], tail: &[u8]) -> usize {
    let k = key.len();
    // SAFETY: the caller makes room for all 2 + k + head + tail bytes;
    // each write below lands in its own part of that room.
    unsafe {
        dst.write(k as u8);
        copy_short(key, dst.add(1));
        dst.add(1 + k).write(kind);
        copy_short(head, dst.add(2 + k));
        copy_short(tail, dst.add(2 + k + head.len()));
    }
    entry_len(key, head, tail)
}

#[inline(always)]
fn entry_len(key: &[u8], head: &[u8], tail: &[u8]) -> usize {
    2 + key.len() + head.len() + tail.len()
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    #[inline(always)]
    fn entry(&mut self, key: &[u8], kind: u8, head: &[u8], tail: &[u8]) {
        debug_assert!(key.len() <= KEY_BYTES_MAX);
        let n = entry_len(key, head, tail);
        self.reserve(n);
        // SAFETY: `reserve` made room for `n` bytes past the length, which
        // `write_entry` fills (slices we were given cannot overlap the
        // vector we hold mutably); then all of them are initialised.
        unsafe {
            let len = self.len();
            write_entry(self.as_mut_ptr().add(len), key, kind, head, tail);
            self.set_len(len + n);
        }
    }
}

/// Typed fields a ring can write: a slice of [`Field`]s, or the bytes an
/// [`Encoder`] built.
pub trait TypedFields {
    /// Bytes the entries take.
    fn encoded_len(&self) -> usize;
    /// Writes exactly `encoded_len()` bytes into `out`.
    #[doc(hidden)]
    fn write_to(&self, out: &mut Staging<'_>);
}

impl TypedFields for [Field<'_>] {
    #[inline]
    fn encoded_len(&self) -> usize {
        self.iter().map(Field::encoded_len).sum()
    }

    #[inline]
    fn write_to(&self, out: &mut Staging<'_>) {
        for f in self {
            f.encode(out);
        }
    }
}

impl<const N: usize> TypedFields for [Field<'_>; N] {
    #[inline]
    fn encoded_len(&self) -> usize {
        self.as_slice().encoded_len()
    }

    #[inline]
    fn write_to(&self, out: &mut Staging<'_>) {
        self.as_slice().write_to(out);
    }
}

/// Entries encoded already (by an [`Encoder`]).
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a>(pub &'a [u8]);

impl TypedFields for Encoded<'_> {
    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn write_to(&self, out: &mut Staging<'_>) {
        out.put(self.0);
    }
}

/// Builds typed entries in a reused buffer, for callers that learn their
/// fields one by one (a `tracing` visitor, a Python dict). No formatting:
/// numbers are copied as bytes.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The entries written so far.
    pub fn encoded(&self) -> Encoded<'_> {
        Encoded(&self.buf)
    }

    #[inline]
    pub fn field(&mut self, key: &str, value: Value<'_>) {
        Field::new(key, value).encode(&mut self.buf);
    }

    /// Whether an entry has `key` (cut as entries cut it): a walk over
    /// the entries, for callers that add to a set of fields more than once
    /// (a span recording a field again).
    pub fn has_key(&self, key: &str) -> bool {
        let key = truncate(key, KEY_BYTES_MAX);
        entries(&self.buf).any(|e| e.is_ok_and(|f| f.key == key))
    }

    /// Appends the entries of `other` (a key both have is kept as this
    /// one's when the entries are read: the first one wins).
    pub fn extend(&mut self, other: &Encoder) {
        self.buf.extend_from_slice(&other.buf);
    }

    /// Appends the entries of `other` whose keys this one does not have
    /// (a span recording fields again).
    pub fn extend_new(&mut self, other: &Encoder) {
        // `other`'s entries were written by an Encoder: each parses.
        for field in entries(&other.buf).flatten() {
            if !self.has_key(field.key) {
                self.field(field.key, field.value);
            }
        }
    }

    pub fn i64(&mut self, key: &str, value: i64) {
        self.field(key, Value::I64(value));
    }

    pub fn u64(&mut self, key: &str, value: u64) {
        self.field(key, Value::U64(value));
    }

    pub fn f64(&mut self, key: &str, value: f64) {
        self.field(key, Value::F64(value));
    }

    pub fn bool(&mut self, key: &str, value: bool) {
        self.field(key, Value::Bool(value));
    }

    pub fn str(&mut self, key: &str, value: &str) {
        self.field(key, Value::Str(value));
    }
}

/// A typed payload that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The entries of a typed payload, each checked before it is returned: a
/// length past the end, an unknown kind, a bool other than 0 or 1 or text
/// that is not UTF-8 ends the walk with [`Malformed`].
pub fn entries(bytes: &[u8]) -> impl Iterator<Item = Result<Field<'_>, Malformed>> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let item = next_entry(&mut rest);
        if item.is_err() {
            rest = &[];
        }
        Some(item)
    })
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], Malformed> {
    if n > rest.len() {
        return Err(Malformed);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn word(rest: &mut &[u8]) -> Result<[u8; 8], Malformed> {
    let mut w = [0u8; 8];
    w.copy_from_slice(take(rest, 8)?);
    Ok(w)
}

fn text<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a str, Malformed> {
    std::str::from_utf8(take(rest, n)?).map_err(|_| Malformed)
}

fn next_entry<'a>(rest: &mut &'a [u8]) -> Result<Field<'a>, Malformed> {
    let key_len = take(rest, 1)?[0];
    let key = text(rest, usize::from(key_len))?;
    let value = match take(rest, 1)?[0] {
        KIND_I64 => Value::I64(i64::from_le_bytes(word(rest)?)),
        KIND_U64 => Value::U64(u64::from_le_bytes(word(rest)?)),
        KIND_F64 => Value::F64(f64::from_bits(u64::from_le_bytes(word(rest)?))),
        KIND_BOOL => match take(rest, 1)?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            _ => return Err(Malformed),
        },
        KIND_STR => {
            let mut n = [0u8; 4];
            n.copy_from_slice(take(rest, 4)?);
            Value::Str(text(rest, u32::from_le_bytes(n) as usize)?)
        }
        _ => return Err(Malformed),
    };
    Ok(Field { key, value })
}

/// Checks a typed payload whole.
pub fn validate(bytes: &[u8]) -> Result<(), Malformed> {
    entries(bytes).try_for_each(|e| e.map(drop))
}

/// Entries past which [`to_json`] finds repeated keys with a hash set
/// rather than by comparing each key with those before it: a record may
/// hold thousands of entries, and its producer may be hostile.
const KEYS_COMPARED_MAX: usize = 64;

/// Writes a typed payload as the JSON object text the formatted path would
/// have stored (into `out`, cleared first; finished). One walk over the
/// entries: a malformed one ends it with an error and `out` partly
/// written (the reader has validated the record before; it drops `out`).
pub fn to_json(bytes: &[u8], out: &mut Fields) -> Result<(), Malformed> {
    out.clear();
    // Up to KEYS_COMPARED_MAX entries `out` finds repeats itself, by
    // comparing; past them a hash set of the keys so far takes over.
    let mut seen: Option<std::collections::HashSet<&str>> = None;
    for (i, entry) in entries(bytes).enumerate() {
        let Field { key, value } = entry?;
        if i == KEYS_COMPARED_MAX {
            // The entries before this one parsed already.
            let before = entries(bytes).take(i).filter_map(|e| e.ok().map(|f| f.key));
            seen = Some(before.collect());
            out.assume_unique_keys();
        }
        if seen.as_mut().is_some_and(|seen| !seen.insert(key)) {
            continue;
        }
        match value {
            Value::I64(v) => out.i64(key, v),
            Value::U64(v) => out.u64(key, v),
            Value::F64(v) => out.f64(key, v),
            Value::Bool(v) => out.bool(key, v),
            Value::Str(v) => out.str(key, v),
        }
    }
    out.finish();
    Ok(())
}

/// Words of a record's payload staged on the stack before they go into the
/// ring: 4 KiB, which holds every common event; a larger one is staged on
/// the heap.
pub(super) const STAGE_WORDS: usize = 512;

/// A payload being staged: bytes written front to back into words that
/// start uninitialised, with a count of how many are written.
#[doc(hidden)]
pub struct Staging<'a> {
    words: &'a mut [MaybeUninit<u64>],
    /// Bytes written from the start; every byte before it is initialised.
    at: usize,
    /// Set when a write would not fit: nothing more is written.
    overflow: bool,
}

impl Sink for Staging<'_> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        let cap = self.words.len() * 8;
        if self.overflow || bytes.len() > cap - self.at {
            self.overflow = true;
            return;
        }
        // SAFETY: `at + bytes.len() <= cap` (checked above), so the copy
        // stays inside `words`; u8 has no alignment, `bytes` cannot overlap
        // a buffer we hold mutably, and writing bytes into MaybeUninit
        // memory is always allowed.
        unsafe {
            let dst = self.words.as_mut_ptr().cast::<u8>().add(self.at);
            copy_short(bytes, dst);
        }
        self.at += bytes.len();
    }

    #[inline(always)]
    fn entry(&mut self, key: &[u8], kind: u8, head: &[u8], tail: &[u8]) {
        let cap = self.words.len() * 8;
        let n = entry_len(key, head, tail);
        if self.overflow || key.len() > KEY_BYTES_MAX || n > cap - self.at {
            self.overflow = true;
            return;
        }
        // SAFETY: `at + n <= cap` (checked above), so the entry stays
        // inside `words`; the slices cannot overlap a buffer we hold
        // mutably, and bytes may be written into MaybeUninit memory.
        unsafe {
            let dst = self.words.as_mut_ptr().cast::<u8>().add(self.at);
            write_entry(dst, key, kind, head, tail);
        }
        self.at += n;
    }
}

/// Copies `src` to `dst`: the short strings of an event (names, keys,
/// numbers) inline, with two loads and two stores that overlap when the
/// length is not a power of two, rather than a call to `memcpy`.
///
/// # Safety
/// `dst` is valid for writing `src.len()` bytes and does not overlap `src`.
#[inline(always)]
unsafe fn copy_short(src: &[u8], dst: *mut u8) {
    let n = src.len();
    let p = src.as_ptr();
    // SAFETY: in every arm, each read is of `src`'s own bytes (offsets below
    // `n`), each write of `dst`'s first `n` bytes; unaligned reads and
    // writes are used, so no alignment is assumed.
    unsafe {
        match n {
            8..=16 => {
                let a = p.cast::<u64>().read_unaligned();
                let b = p.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            }
            4..=7 => {
                let a = p.cast::<u32>().read_unaligned();
                let b = p.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            }
            1..=3 => {
                // First, middle (or first again) and last byte.
                *dst = *p;
                *dst.add(n / 2) = *p.add(n / 2);
                *dst.add(n - 1) = *p.add(n - 1);
            }
            0 => {}
            _ => std::ptr::copy_nonoverlapping(p, dst, n),
        }
    }
}

/// Stages an event's payload with `fields` typed (`texts`: provider, name
/// and message, then the entries, zero-padded to a word) in `words`, which
/// must hold exactly the payload's words; returns them initialised, or
/// `None` when the payload does not fill exactly those words.
pub(super) fn stage<'w, F: TypedFields + ?Sized>(
    texts: [&str; 3],
    fields: &F,
    fields_len: usize,
    words: &'w mut [MaybeUninit<u64>],
) -> Option<&'w [u64]> {
    let payload = texts.iter().map(|t| t.len()).sum::<usize>() + fields_len;
    let n = words.len();
    // The padding: the last word zeroed first, its front then overwritten
    // by the payload's last bytes (padding is under a word, so all of it
    // lies in the last word).
    if let Some(last) = words.last_mut() {
        last.write(0);
    }
    let mut s = Staging {
        words,
        at: 0,
        overflow: false,
    };
    for text in texts {
        s.put(text.as_bytes());
    }
    fields.write_to(&mut s);
    if s.overflow || s.at != payload || payload > n * 8 || n * 8 - payload >= 8 {
        return None;
    }
    // SAFETY: bytes 0..payload were written front to back without gaps,
    // and the rest (under a word) lies in the last word, zeroed first: so
    // each of the `n` words is an initialised u64; the slice borrows
    // `words` for as long as the result lives.
    Some(unsafe { std::slice::from_raw_parts(s.words.as_ptr().cast::<u64>(), n) })
}

#[cfg(test)]
mod tests;
