//! An event as producers hand it to a ring and as the reader gives it back,
//! and its encoding in a ring record.

use super::format::*;
use super::typed::{self, FLAGS_KNOWN, FLAG_TYPED_FIELDS};
use std::fmt;
use std::str::FromStr;

/// Syslog severity, 0 (emerg) to 7 (debug).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Level {
    Emerg = 0,
    Alert = 1,
    Crit = 2,
    Err = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
    Debug = 7,
}

impl Level {
    pub const ALL: [Level; 8] = [
        Level::Emerg,
        Level::Alert,
        Level::Crit,
        Level::Err,
        Level::Warning,
        Level::Notice,
        Level::Info,
        Level::Debug,
    ];

    pub fn from_u8(value: u8) -> Option<Level> {
        Self::ALL.get(usize::from(value)).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Emerg => "emerg",
            Level::Alert => "alert",
            Level::Crit => "crit",
            Level::Err => "err",
            Level::Warning => "warning",
            Level::Notice => "notice",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A level name or number that is not a syslog severity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown level {0:?}: expected one of emerg, alert, crit, err, warning, notice, info, debug (or 0-7)")]
pub struct LevelError(pub String);

impl FromStr for Level {
    type Err = LevelError;

    fn from_str(s: &str) -> Result<Self, LevelError> {
        let lower = s.to_ascii_lowercase();
        let found = match lower.as_str() {
            "emerg" | "panic" => Some(Level::Emerg),
            "alert" => Some(Level::Alert),
            "crit" | "critical" => Some(Level::Crit),
            "err" | "error" => Some(Level::Err),
            "warning" | "warn" => Some(Level::Warning),
            "notice" => Some(Level::Notice),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            n => n.parse::<u8>().ok().and_then(Level::from_u8),
        };
        found.ok_or_else(|| LevelError(s.to_string()))
    }
}

/// One event. Producers fill it with borrowed strings; the reader returns
/// one borrowed from its copy of the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// Nanoseconds since the Unix epoch (realtime clock).
    pub ts_ns: i64,
    pub pid: u32,
    pub tid: u32,
    pub uid: u32,
    pub level: Level,
    /// At most 255 bytes.
    pub provider: &'a str,
    /// At most 255 bytes.
    pub name: &'a str,
    pub message: &'a str,
    /// Structured fields as a JSON object text, or empty.
    pub fields: &'a str,
}

/// Why an event cannot go into a ring.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error("provider is {0} bytes; at most 255")]
    ProviderTooLong(usize),
    #[error("name is {0} bytes; at most 255")]
    NameTooLong(usize),
    #[error("event payload is {len} bytes; a record of this ring holds at most {max}")]
    TooLarge { len: usize, max: usize },
}

impl Event<'_> {
    /// Payload bytes after the record header.
    pub fn payload_len(&self) -> usize {
        self.provider.len() + self.name.len() + self.message.len() + self.fields.len()
    }

    /// The record's length in words, header included, if it fits `geometry`.
    pub fn record_words(&self, geometry: Geometry) -> Result<u32, EncodeError> {
        self.record_words_with(self.fields.len(), geometry)
    }

    /// The record's length in words with `fields_len` bytes of fields (the
    /// text of `self.fields`, or typed entries in its place).
    pub fn record_words_with(
        &self,
        fields_len: usize,
        geometry: Geometry,
    ) -> Result<u32, EncodeError> {
        if self.provider.len() > 255 {
            return Err(EncodeError::ProviderTooLong(self.provider.len()));
        }
        if self.name.len() > 255 {
            return Err(EncodeError::NameTooLong(self.name.len()));
        }
        let len = self.payload_len() - self.fields.len() + fields_len;
        let max = geometry.payload_bytes_max();
        if len > max {
            return Err(EncodeError::TooLarge { len, max });
        }
        Ok((RECORD_HEADER_WORDS + len.div_ceil(8)) as u32)
    }

    /// The header words after the checksum (R_TS..R_LENGTHS).
    pub(super) fn header_words(&self) -> [u64; RECORD_HEADER_WORDS - R_TS] {
        self.header_words_with(self.fields.len(), 0)
    }

    /// The header words with `fields_len` bytes of fields and `flags` in
    /// the high byte of word 4 (see [`super::typed::FLAG_TYPED_FIELDS`]).
    #[inline(always)]
    pub(super) fn header_words_with(
        &self,
        fields_len: usize,
        flags: u8,
    ) -> [u64; RECORD_HEADER_WORDS - R_TS] {
        [
            self.ts_ns as u64,
            u64::from(self.pid) | (u64::from(self.tid) << 32),
            u64::from(self.uid)
                | (u64::from(self.level as u8) << 32)
                | ((self.provider.len() as u64) << 40)
                | ((self.name.len() as u64) << 48)
                | (u64::from(flags) << 56),
            self.message.len() as u64 | ((fields_len as u64) << 32),
        ]
    }

    /// Calls `put` with every payload word (the four strings back to back,
    /// zero-padded to a whole word), in order.
    pub(super) fn for_each_payload_word(&self, mut put: impl FnMut(u64)) {
        let mut word = [0u8; 8];
        let mut filled = 0;
        for part in [self.provider, self.name, self.message, self.fields] {
            let mut bytes = part.as_bytes();
            if filled > 0 {
                let take = (8 - filled).min(bytes.len());
                word[filled..filled + take].copy_from_slice(&bytes[..take]);
                filled += take;
                bytes = &bytes[take..];
                if filled < 8 {
                    continue;
                }
                put(u64::from_le_bytes(word));
            }
            // Whole words straight from the slice (`filled` is 0 here).
            let mut chunks = bytes.chunks_exact(8);
            for chunk in &mut chunks {
                let mut w = [0u8; 8];
                w.copy_from_slice(chunk);
                put(u64::from_le_bytes(w));
            }
            let tail = chunks.remainder();
            word[..tail.len()].copy_from_slice(tail);
            filled = tail.len();
        }
        if filled > 0 {
            word[filled..].fill(0);
            put(u64::from_le_bytes(word));
        }
    }
}

/// Why a record copied out of a ring was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFault {
    Checksum,
    Level(u8),
    Lengths,
    Utf8,
    /// A flag this version does not know.
    Flags(u8),
    /// Typed fields that do not parse.
    Fields,
}

impl fmt::Display for RecordFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordFault::Checksum => f.write_str("checksum mismatch"),
            RecordFault::Level(l) => write!(f, "level {l} is not 0-7"),
            RecordFault::Lengths => f.write_str("field lengths do not match the record length"),
            RecordFault::Utf8 => f.write_str("a text field is not UTF-8"),
            RecordFault::Flags(flags) => write!(f, "unknown record flags {flags:#04x}"),
            RecordFault::Fields => f.write_str("the typed fields do not parse"),
        }
    }
}

/// A record copied out of the ring and validated: where its fields are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLayout {
    ts_ns: i64,
    pid: u32,
    tid: u32,
    uid: u32,
    level: Level,
    provider_len: usize,
    name_len: usize,
    message_len: usize,
    fields_len: usize,
    /// The fields are typed entries ([`super::typed`]), not JSON text.
    typed: bool,
}

/// Validates a record copied out of the ring: `words` is the whole record
/// from its state word on. Checks the checksum, the level, that the field
/// lengths add up to the record length and that every text field is UTF-8;
/// never trusts a length.
pub fn validate(words: &[u64]) -> Result<RecordLayout, RecordFault> {
    if words.len() < RECORD_HEADER_WORDS {
        return Err(RecordFault::Lengths);
    }
    if checksum(words[R_STATE], &words[R_TS..]) != words[R_CHECKSUM] {
        return Err(RecordFault::Checksum);
    }
    let uid_level = words[R_UID_LEVEL];
    let level_raw = (uid_level >> 32) as u8;
    let level = Level::from_u8(level_raw).ok_or(RecordFault::Level(level_raw))?;
    let flags = (uid_level >> 56) as u8;
    if flags & !FLAGS_KNOWN != 0 {
        return Err(RecordFault::Flags(flags));
    }
    let layout = RecordLayout {
        ts_ns: words[R_TS] as i64,
        pid: words[R_PID_TID] as u32,
        tid: (words[R_PID_TID] >> 32) as u32,
        uid: uid_level as u32,
        level,
        provider_len: ((uid_level >> 40) & 0xFF) as usize,
        name_len: ((uid_level >> 48) & 0xFF) as usize,
        message_len: (words[R_LENGTHS] & 0xFFFF_FFFF) as usize,
        fields_len: (words[R_LENGTHS] >> 32) as usize,
        typed: flags & FLAG_TYPED_FIELDS != 0,
    };
    let payload = as_bytes(&words[RECORD_HEADER_WORDS..]);
    let total = layout.provider_len + layout.name_len + layout.message_len + layout.fields_len;
    // The padding is less than a word, so the lengths pin the record size.
    if total > payload.len() || payload.len() - total >= 8 {
        return Err(RecordFault::Lengths);
    }
    // Typed fields are binary: the text is what comes before them, and the
    // entries are checked on their own.
    let text_len = if layout.typed {
        total - layout.fields_len
    } else {
        total
    };
    if layout.typed && typed::validate(&payload[text_len..total]).is_err() {
        return Err(RecordFault::Fields);
    }
    if std::str::from_utf8(&payload[..text_len]).is_err() {
        // Each field must be UTF-8 on its own too; checked per field below
        // only when the whole is, which keeps the common case one pass.
        return Err(RecordFault::Utf8);
    }
    let mut at = 0;
    for len in [layout.provider_len, layout.name_len, layout.message_len] {
        at += len;
        if !payload_is_char_boundary(&payload[..text_len], at) {
            return Err(RecordFault::Utf8);
        }
    }
    Ok(layout)
}

fn payload_is_char_boundary(text: &[u8], at: usize) -> bool {
    // A UTF-8 continuation byte is 0b10xx_xxxx.
    at == text.len() || text[at] & 0xC0 != 0x80
}

impl RecordLayout {
    /// Whether the record's fields are typed entries: [`RecordLayout::view`]
    /// then leaves `fields` empty, and [`RecordLayout::typed_fields`] has
    /// them (the reader gives them as JSON).
    pub fn typed(&self) -> bool {
        self.typed
    }

    /// The typed entries of the record in `words` (empty for a JSON one).
    pub fn typed_fields<'a>(&self, words: &'a [u64]) -> &'a [u8] {
        if !self.typed {
            return &[];
        }
        let payload = as_bytes(&words[RECORD_HEADER_WORDS..]);
        let start = self.provider_len + self.name_len + self.message_len;
        payload.get(start..start + self.fields_len).unwrap_or(&[])
    }

    /// The event inside `words`, which must be the words `validate` accepted;
    /// a typed record's `fields` are `typed_json` (the reader's decoding).
    pub fn view_with<'a>(&self, words: &'a [u64], typed_json: &'a str) -> Event<'a> {
        let mut event = self.view(words);
        if self.typed {
            event.fields = typed_json;
        }
        event
    }

    /// The event inside `words`, which must be the words `validate` accepted.
    pub fn view<'a>(&self, words: &'a [u64]) -> Event<'a> {
        let payload = as_bytes(&words[RECORD_HEADER_WORDS..]);
        let fields_text = if self.typed { 0 } else { self.fields_len };
        let total = self.provider_len + self.name_len + self.message_len + fields_text;
        let text = &payload[..total];
        // `validate` checked the whole text is UTF-8 and every field boundary
        // is a character boundary, so each part is UTF-8; the fallback is
        // unreachable for words that `validate` accepted.
        let mut rest = std::str::from_utf8(text).unwrap_or("");
        let mut take = |n: usize| match (rest.get(..n), rest.get(n..)) {
            (Some(head), Some(tail)) => {
                rest = tail;
                head
            }
            _ => "",
        };
        Event {
            ts_ns: self.ts_ns,
            pid: self.pid,
            tid: self.tid,
            uid: self.uid,
            level: self.level,
            provider: take(self.provider_len),
            name: take(self.name_len),
            message: take(self.message_len),
            fields: take(fields_text),
        }
    }
}

/// Validates and views a record in one go.
pub fn decode(words: &[u64]) -> Result<Event<'_>, RecordFault> {
    validate(words).map(|layout| layout.view(words))
}

fn as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and any byte pattern is a valid u8; the
    // length covers exactly the words' bytes and the borrow is the same.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(message: &str) -> Event<'_> {
        Event {
            ts_ns: 1_700_000_000_123_456_789,
            pid: 42,
            tid: 43,
            uid: 1000,
            level: Level::Warning,
            provider: "kernel",
            name: "oom",
            message,
            fields: r#"{"k":"v"}"#,
        }
    }

    fn encode(event: &Event<'_>, seq: u64) -> Vec<u64> {
        let geometry = Geometry::new(4096, 2).unwrap();
        let words = event.record_words(geometry).unwrap();
        let mut out = vec![0u64; RECORD_HEADER_WORDS];
        out[R_STATE] = RecordState {
            seq_low: seq,
            words,
            state: STATE_COMMITTED,
        }
        .pack();
        out[R_TS..RECORD_HEADER_WORDS].copy_from_slice(&event.header_words());
        event.for_each_payload_word(|w| out.push(w));
        assert_eq!(out.len(), words as usize);
        out[R_CHECKSUM] = checksum(out[R_STATE], &out[R_TS..]);
        out
    }

    #[test]
    fn round_trip() {
        for message in ["", "x", "exactly8", "a longer message with ünïcode"] {
            let event = sample(message);
            let words = encode(&event, 7);
            assert_eq!(decode(&words), Ok(event));
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let words = encode(&sample("hello world"), 9);
        for i in 0..words.len() {
            for bit in 0..64 {
                if i == R_STATE && bit < 2 {
                    // The state bits are the reader's to check (it only copies
                    // COMMITTED records); the checksum covers the rest.
                    continue;
                }
                let mut bad = words.clone();
                bad[i] ^= 1 << bit;
                assert!(decode(&bad).is_err(), "word {i} bit {bit}");
            }
        }
    }

    #[test]
    fn lengths_are_checked_not_trusted() {
        let mut words = encode(&sample("hi"), 1);
        words[R_LENGTHS] = u64::MAX;
        words[R_CHECKSUM] = checksum(words[R_STATE], &words[R_TS..]);
        assert_eq!(decode(&words), Err(RecordFault::Lengths));
        assert_eq!(decode(&words[..3]), Err(RecordFault::Lengths));
    }

    #[test]
    fn levels_parse_by_name_and_number() {
        assert_eq!("warning".parse::<Level>(), Ok(Level::Warning));
        assert_eq!("ERR".parse::<Level>(), Ok(Level::Err));
        assert_eq!("7".parse::<Level>(), Ok(Level::Debug));
        assert!("8".parse::<Level>().is_err());
        assert!("loud".parse::<Level>().is_err());
    }

    #[test]
    fn oversize_fields_are_refused() {
        let g = Geometry::new(256, 2).unwrap();
        let long = "x".repeat(300);
        let mut e = sample(&long);
        assert!(matches!(
            e.record_words(g),
            Err(EncodeError::TooLarge { .. })
        ));
        e.message = "";
        let provider = "p".repeat(256);
        e.provider = &provider;
        assert_eq!(e.record_words(g), Err(EncodeError::ProviderTooLong(256)));
    }
}
