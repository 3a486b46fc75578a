//! The timestamps syslog senders write, read from the start of a text:
//! RFC 3339 (RFC 5424's TIMESTAMP, which many senders also put in a BSD
//! header) and the BSD form of RFC 3164 with the variants devices write
//! (a year before or after the date or before the time, months in any
//! case, unpadded days, fractions of a second).
//!
//! Only a timestamp that names its offset is an instant: a BSD timestamp
//! names neither year nor zone, and eventd does not guess them.

/// An RFC 3339 timestamp at the start of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339 {
    /// Its length in bytes.
    pub len: usize,
    /// Nanoseconds since the Unix epoch, when it names its offset.
    pub instant: Option<i64>,
    /// Whether it is what RFC 5424 allows: a `T`, a fraction (if any) of
    /// one to six digits after a dot, an offset.
    pub strict: bool,
}

/// The years a BSD timestamp may carry: another four-digit number where a
/// year could be is not taken for one.
const YEARS: std::ops::RangeInclusive<u32> = 1970..=2099;

/// Reads fixed-width numbers and separators off the start of a text.
struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    /// Takes `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        let next = self.peek() == Some(b);
        self.at += usize::from(next);
        next
    }

    /// Exactly `n` digits, taken if they make a number within `range`.
    fn number(&mut self, n: usize, range: std::ops::RangeInclusive<u32>) -> Option<u32> {
        let digits = self.s.get(self.at..self.at + n)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let value = digits.iter().fold(0, |v, d| v * 10 + u32::from(d - b'0'));
        if !range.contains(&value) {
            return None;
        }
        self.at += n;
        Some(value)
    }

    /// `hh:mm:ss` (a leap second allowed).
    fn clock(&mut self) -> Option<u32> {
        let hour = self.number(2, 0..=23)?;
        self.eat(b':').then_some(())?;
        let minute = self.number(2, 0..=59)?;
        self.eat(b':').then_some(())?;
        let second = self.number(2, 0..=60)?;
        Some(hour * 3600 + minute * 60 + second)
    }

    /// `.digits` or `,digits` if next: the nanoseconds (digits past the
    /// ninth are read and dropped) and how many digits were written. A dot
    /// with no digits after it is taken too (syslog-ng does).
    fn fraction(&mut self) -> Option<(u32, usize)> {
        let mark = self.peek()?;
        if !matches!(mark, b'.' | b',') {
            return None;
        }
        let digits = self.s[self.at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 && mark == b',' {
            return None;
        }
        let first = &self.s[self.at + 1..self.at + 1 + digits.min(9)];
        let nanos = first.iter().fold(0, |v, d| v * 10 + u32::from(d - b'0'))
            * 10u32.pow(9 - first.len() as u32);
        self.at += 1 + digits;
        Some((nanos, digits))
    }

    /// `Z` or `+hh:mm`/`-hh:mm` if next, in seconds east of UTC; `Err` for
    /// a sign without a whole offset after it.
    fn offset(&mut self) -> Result<Option<i64>, ()> {
        let sign = match self.peek() {
            Some(b'Z' | b'z') => {
                self.at += 1;
                return Ok(Some(0));
            }
            Some(b'+') => 1,
            Some(b'-') => -1,
            _ => return Ok(None),
        };
        self.at += 1;
        let hours = self.number(2, 0..=23).ok_or(())?;
        self.eat(b':').then_some(()).ok_or(())?;
        let minutes = self.number(2, 0..=59).ok_or(())?;
        Ok(Some(sign * i64::from(hours * 3600 + minutes * 60)))
    }
}

/// `YYYY-MM-DD(T|t| )hh:mm:ss[(.|,)frac][Z|z|+hh:mm|-hh:mm]` at the start
/// of `s` (syslog-ng's reading: a space for the `T`, a comma for the dot
/// and no offset are what some senders write; they make it not `strict`).
#[inline]
pub fn rfc3339(s: &[u8]) -> Option<Rfc3339> {
    let mut c = Cursor { s, at: 0 };
    let year = c.number(4, 0..=9999)?;
    c.eat(b'-').then_some(())?;
    let month = c.number(2, 1..=12)?;
    c.eat(b'-').then_some(())?;
    let day = c.number(2, 1..=days_in_month(year, month))?;
    let t = matches!(c.peek(), Some(b'T' | b't'));
    if !(t || c.peek() == Some(b' ')) {
        return None;
    }
    c.at += 1;
    let seconds = c.clock()?;
    let dot = c.peek() == Some(b'.');
    let fraction = c.fraction();
    let offset = c.offset().ok()?;
    let nanos = fraction.map_or(0, |(nanos, _)| nanos);
    let instant = offset.and_then(|offset| {
        let local = days_from_civil(year, month, day) * 86_400 + i64::from(seconds);
        (local - offset)
            .checked_mul(1_000_000_000)?
            .checked_add(i64::from(nanos))
    });
    Some(Rfc3339 {
        len: c.at,
        instant,
        strict: t
            && fraction.is_none_or(|(_, digits)| dot && (1..=6).contains(&digits))
            && offset.is_some(),
    })
}

/// A BSD timestamp at the start of `s`: its length. `Mmm dd hh:mm:ss` with
/// the month in any case, the day padded with a space, a zero or nothing,
/// and optionally a fraction of a second, a year before the month
/// (`2024 Mar  7 19:06:53`), before the time (`Apr 15 2007 21:28:13`, as
/// Cisco writes it) or after it (`Aug 10 22:18:24 2021 `, followed by a
/// space), and the `*` or `.` Cisco puts first to say whether its clock is
/// synchronized.
#[inline]
pub fn bsd(s: &[u8]) -> Option<usize> {
    common_bsd(s).or_else(|| any_bsd(s))
}

/// The form nearly every sender writes, `Mmm dd hh:mm:ss` with the day
/// padded, read by position; `None` for anything else, and when a
/// fraction or a year follows.
fn common_bsd(s: &[u8]) -> Option<usize> {
    let t: &[u8; 15] = s.get(..15)?.try_into().ok()?;
    let digit = |i: usize| t[i].is_ascii_digit();
    let two = |i: usize| u32::from(t[i] - b'0') * 10 + u32::from(t[i + 1] - b'0');
    let shape = month(&t[..3])
        && t[3] == b' '
        && (t[4] == b' ' || digit(4))
        && digit(5)
        && t[6] == b' '
        && digit(7)
        && digit(8)
        && t[9] == b':'
        && digit(10)
        && digit(11)
        && t[12] == b':'
        && digit(13)
        && digit(14);
    if !shape {
        return None;
    }
    let day = if t[4] == b' ' {
        u32::from(t[5] - b'0')
    } else {
        two(4)
    };
    let in_range = (1..=31).contains(&day) && two(7) <= 23 && two(10) <= 59 && two(13) <= 60;
    let extended = match s.get(15) {
        Some(b'.' | b',') => true,
        Some(b' ') => s.get(16).is_some_and(u8::is_ascii_digit),
        _ => false,
    };
    (in_range && !extended).then_some(15)
}

/// Every BSD form, read field by field.
fn any_bsd(s: &[u8]) -> Option<usize> {
    let mut c = Cursor { s, at: 0 };
    if !(c.eat(b'*') || c.eat(b'.')) {
        year_and_space(&mut c);
    }
    month(s.get(c.at..c.at + 3)?).then_some(())?;
    c.at += 3;
    c.eat(b' ').then_some(())?;
    c.eat(b' ');
    c.number(2, 1..=31).or_else(|| c.number(1, 1..=9))?;
    c.eat(b' ').then_some(())?;
    year_and_space(&mut c);
    c.clock()?;
    c.fraction();
    let end = c.at;
    if c.eat(b' ') && year_and_space(&mut c) {
        // The space after that year is not part of the timestamp.
        c.at -= 1;
    } else {
        c.at = end;
    }
    Some(c.at)
}

/// Whether `name` is a month's three letters, in any case.
#[inline]
fn month(name: &[u8]) -> bool {
    let &[a, b, c] = name else {
        return false;
    };
    // `| 0x20` lowers ASCII letters and maps no other byte onto one.
    let lower = [a | 0x20, b | 0x20, c | 0x20];
    matches!(
        &lower,
        b"jan"
            | b"feb"
            | b"mar"
            | b"apr"
            | b"may"
            | b"jun"
            | b"jul"
            | b"aug"
            | b"sep"
            | b"oct"
            | b"nov"
            | b"dec"
    )
}

/// Takes `YYYY ` (a year in [`YEARS`] and a space) if next.
fn year_and_space(c: &mut Cursor<'_>) -> bool {
    let start = c.at;
    if c.number(4, YEARS).is_some() && c.eat(b' ') {
        return true;
    }
    c.at = start;
    false
}

fn is_leap(year: u32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian
/// calendar (negative before it).
fn days_from_civil(year: u32, month: u32, day: u32) -> i64 {
    // Years counted from March, so that the leap day ends a year; eras of
    // 400 years repeat exactly.
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = i64::from(month);
    let day_of_year = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_instants_use_the_offset_given() {
        let t = rfc3339(b"2006-11-10T10:43:21.156+02:00 host").unwrap();
        assert_eq!(t.len, 29);
        assert_eq!(t.instant, Some(1_163_148_201_156_000_000));
        assert!(t.strict);
        let z = rfc3339(b"1970-01-01T00:00:00Z").unwrap();
        assert_eq!((z.instant, z.strict), (Some(0), true));
        let before = rfc3339(b"1969-12-31T23:59:59.5-00:30").unwrap();
        assert_eq!(before.instant, Some(1_799_500_000_000));
        // Leap day, lower case, nanoseconds and more.
        let leap = rfc3339(b"2024-02-29t12:00:00.1234567891z").unwrap();
        assert_eq!(leap.instant, Some(1_709_208_000_123_456_789));
        assert!(!leap.strict, "RFC 5424 allows six digits of fraction");
        // No offset: not an instant; a space for the T.
        let local = rfc3339(b"2025-03-14 09:26:53 db1").unwrap();
        assert_eq!((local.len, local.instant, local.strict), (19, None, false));
        let comma = rfc3339(b"2025-03-14T09:26:53,5Z").unwrap();
        assert_eq!(
            (comma.instant, comma.strict),
            (Some(1_741_944_413_500_000_000), false)
        );
        for bad in [
            &b"2025-02-29T00:00:00Z"[..],
            b"2025-13-01T00:00:00Z",
            b"2025-01-01T24:00:00Z",
            b"2025-01-01T10:00",
            b"2025-01-01X10:00:00Z",
            b"2025-01-01T10:00:00+1:00",
            b"2025-01-01T10:00:00+01",
            b"25-01-01T10:00:00Z",
        ] {
            assert_eq!(rfc3339(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_common_form_is_read_as_the_general_reading_reads_it() {
        // Every month, day, hour, minute and second, each way it can be
        // written, and a few bytes after it.
        let mut lines = Vec::new();
        for month in ["Jan", "feb", "MAR", "Dec", "Foo"] {
            for day in ["01", " 1", "1 ", "00", "31", "32", " 0", "x1"] {
                for clock in ["00:00:00", "23:59:60", "24:00:00", "10:60:00", "10:00:61"] {
                    for after in ["", " ", ":", ". ", ".5", ",5", " 2021 ", " 1234 ", " host"] {
                        lines.push(format!("{month} {day} {clock}{after}"));
                    }
                }
            }
        }
        for line in &lines {
            let s = line.as_bytes();
            if let Some(len) = common_bsd(s) {
                assert_eq!(any_bsd(s), Some(len), "{line:?}");
            }
            assert_eq!(bsd(s), any_bsd(s), "{line:?}");
        }
        assert!(lines.iter().any(|l| common_bsd(l.as_bytes()).is_some()));
    }

    #[test]
    fn bsd_timestamps_and_their_variants() {
        for (text, len) in [
            (&b"Nov 30 10:01:02 sshd"[..], 15),
            (b"Feb  5 17:32:18", 15),
            (b"Oct 1 22:14:15 host", 14),
            (b"Feb 05 17:32:18 host", 15),
            (b"NOV 22 00:00:33 host", 15),
            (b"dec  4 10:00:00 host", 15),
            (b"Apr 15 2007 21:28:13: %ASA", 20),
            (b"Mar 7 2008 19:06:53 host", 19),
            (b"2024 Mar  7 19:06:53 sw1", 20),
            (b"AUG 10 22:18:24 2021  fw", 20),
            (b"Aug 10 22:18:24 2021", 15),
            (b"Aug 10 22:18:24 1234 x", 15),
            (b"Aug 29 02:00:00.156 host", 19),
            (b"Aug 29 02:00:00. host", 16),
            (b"*Mar  1 18:48:50.483: %SYS", 20),
            (b".Mar  1 18:48:50: %SYS", 16),
        ] {
            assert_eq!(bsd(text), Some(len), "{}", String::from_utf8_lossy(text));
        }
        for bad in [
            &b"Foo 30 10:01:02"[..],
            b"Aug 32 10:00:00",
            b"Aug 0 10:00:00",
            b"Aug 30 24:00:00",
            b"Aug 30 10:0:00",
            b"Aug30 10:00:00",
            b"**Mar  1 18:48:50",
            b"Aug 30",
            b"",
        ] {
            assert_eq!(bsd(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(days_from_civil(0, 1, 1), -719_528);
    }
}
