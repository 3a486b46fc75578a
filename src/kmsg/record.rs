//! One record of `/dev/kmsg`, as one `read` returns it
//! (Documentation/ABI/testing/dev-kmsg):
//!
//! ```text
//! 6,1042,8123456,-,caller=T1;usb 1-1: new high-speed USB device\n
//!  SUBSYSTEM=usb\n
//!  DEVICE=c189:2\n
//! ```
//!
//! A prefix of comma-separated fields (priority, sequence number,
//! microseconds since boot, flags, then `key=value` fields of newer
//! kernels), a `;`, the message on one line, then continuation lines, each
//! starting with a space, holding `KEY=value`. In the message and the
//! values the kernel writes every byte below 32, from 127 on, and `\`
//! itself as `\xHH`; they are unescaped here (a UTF-8 character arrives as
//! its escaped bytes), and what is not UTF-8 becomes U+FFFD.

/// A parsed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Facility and level: `facility << 3 | level`.
    pub priority: u32,
    /// The kernel's sequence number (from 0 at boot, one per record).
    pub seq: u64,
    /// Microseconds since boot on the kernel's log clock.
    pub usec: u64,
    /// `caller=` of the prefix (the thread or CPU that logged), if given.
    pub caller: Option<String>,
    pub message: String,
    /// The continuation lines, keys lower-cased (`subsystem`, `device`).
    pub dict: Vec<(String, String)>,
}

impl Record {
    pub fn level(&self) -> u8 {
        (self.priority & 7) as u8
    }

    pub fn facility(&self) -> u8 {
        u8::try_from(self.priority >> 3).unwrap_or(u8::MAX)
    }
}

/// What is wrong with a record that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadRecord {
    #[error("no ';' after the prefix")]
    NoPrefixEnd,
    #[error("the prefix has no {0}")]
    Missing(&'static str),
    #[error("the {0} in the prefix is not a number")]
    NotANumber(&'static str),
}

/// Parses one record as read from `/dev/kmsg`.
pub fn parse(bytes: &[u8]) -> Result<Record, BadRecord> {
    let semi = bytes
        .iter()
        .position(|&b| b == b';')
        .ok_or(BadRecord::NoPrefixEnd)?;
    let prefix = String::from_utf8_lossy(&bytes[..semi]);
    let mut fields = prefix.split(',');
    let mut number = |what: &'static str| -> Result<u64, BadRecord> {
        fields
            .next()
            .ok_or(BadRecord::Missing(what))?
            .trim()
            .parse()
            .map_err(|_| BadRecord::NotANumber(what))
    };
    let priority = number("priority")?;
    let seq = number("sequence number")?;
    let usec = number("timestamp")?;
    let _flags = fields.next();
    let caller = fields
        .find_map(|f| f.strip_prefix("caller="))
        .map(str::to_string);
    let rest = &bytes[semi + 1..];
    let (line, continuation) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    let dict = continuation
        .split(|&b| b == b'\n')
        .filter_map(|l| l.strip_prefix(b" "))
        .filter_map(|l| {
            let eq = l.iter().position(|&b| b == b'=')?;
            let key = String::from_utf8_lossy(&l[..eq]).to_ascii_lowercase();
            (!key.is_empty()).then(|| (key, unescape(&l[eq + 1..])))
        })
        .collect();
    Ok(Record {
        priority: u32::try_from(priority).unwrap_or(u32::MAX),
        seq,
        usec,
        caller,
        message: unescape(line),
        dict,
    })
}

/// `\xHH` back to the byte it stands for; the rest as it is.
fn unescape(text: &[u8]) -> String {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if text[i] == b'\\' && text.get(i + 1) == Some(&b'x') {
            if let (Some(h), Some(l)) = (
                text.get(i + 2).copied().and_then(hex),
                text.get(i + 3).copied().and_then(hex),
            ) {
                // Two hex digits make at most 255.
                out.push((h * 16 + l) as u8);
                i += 4;
                continue;
            }
        }
        out.push(text[i]);
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_continuation_lines_is_read_whole() {
        let r = parse(
            b"6,1042,8123456,-,caller=T1;usb 1-1: new high-speed USB device\n \
              SUBSYSTEM=usb\n DEVICE=c189:2\n",
        )
        .unwrap();
        assert_eq!((r.priority, r.seq, r.usec), (6, 1042, 8_123_456));
        assert_eq!((r.level(), r.facility()), (6, 0));
        assert_eq!(r.caller.as_deref(), Some("T1"));
        assert_eq!(r.message, "usb 1-1: new high-speed USB device");
        assert_eq!(
            r.dict,
            vec![
                ("subsystem".to_string(), "usb".to_string()),
                ("device".to_string(), "c189:2".to_string())
            ]
        );
    }

    #[test]
    fn escaped_bytes_are_unescaped_and_bad_records_named() {
        // A record written by a program: facility user, a tab, UTF-8
        // bytes escaped one by one, an escaped backslash.
        let r = parse(b"11,7,5,-;app:\\x09caf\\xc3\\xa9 a\\x5cb \\xzz\n").unwrap();
        assert_eq!((r.level(), r.facility()), (3, 1));
        assert_eq!(r.message, "app:\tcafé a\\b \\xzz");
        assert_eq!(parse(b"6,1,2,-;\\xff\n").unwrap().message, "\u{fffd}");
        assert_eq!(
            parse(b"6,x,5,-;m\n"),
            Err(BadRecord::NotANumber("sequence number"))
        );
        assert_eq!(parse(b"6;m\n"), Err(BadRecord::Missing("sequence number")));
        assert_eq!(parse(b"6,1,2,- m\n"), Err(BadRecord::NoPrefixEnd));
    }
}
