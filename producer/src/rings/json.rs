//! The structured-fields object of an event as JSON text, written straight
//! into a reused buffer (by clients that format their fields, and by the
//! reader that turns a record's typed fields back into text, see
//! [`super::typed`]):
//! numbers stay numbers, booleans booleans, everything else a JSON string.
//! Keys already written are remembered by their byte range, so a key seen
//! twice (an event's field and a span's of the same name) is kept once,
//! the first time.

use std::fmt::{self, Write};
use std::ops::Range;

/// A JSON object being written.
#[derive(Default)]
pub struct Fields {
    out: String,
    keys: Vec<Range<usize>>,
    /// The writer promised no key repeats ([`Fields::assume_unique_keys`]):
    /// keys are not compared.
    unique: bool,
}

impl Fields {
    pub fn clear(&mut self) {
        self.out.clear();
        self.keys.clear();
        self.unique = false;
    }

    /// Until the next [`Fields::clear`], the keys written are known to be
    /// unique (the caller left repeats out itself, with a hash set): they
    /// are not compared with the ones before, which costs time in the
    /// square of their number.
    pub fn assume_unique_keys(&mut self) {
        self.unique = true;
    }

    /// Whether no entry was written.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// The text written so far (after [`Fields::finish`]: the object's).
    pub fn text(&self) -> &str {
        &self.out
    }

    /// The object's text, `""` when it has no key (eventd stores NULL).
    pub fn finish(&mut self) -> &str {
        if !self.out.is_empty() {
            self.out.push('}');
        }
        &self.out
    }

    /// Starts the entry of `key`, or returns false if the object has it.
    fn key(&mut self, key: &str) -> bool {
        // Written to compare; no allocation: the key goes into the buffer
        // and is taken back if it is a repeat.
        let mark = self.out.len();
        self.out.push(if mark == 0 { '{' } else { ',' });
        let start = self.out.len() + 1;
        self.out.push('"');
        let _ = Escaping(&mut self.out).write_str(key);
        let end = self.out.len();
        let repeat = !self.unique
            && self
                .keys
                .iter()
                .any(|r| self.out[r.clone()] == self.out[start..end]);
        if repeat {
            self.out.truncate(mark);
            return false;
        }
        self.keys.push(start..end);
        self.out.push_str("\":");
        true
    }

    pub fn str(&mut self, key: &str, value: &str) {
        if self.key(key) {
            self.out.push('"');
            let _ = Escaping(&mut self.out).write_str(value);
            self.out.push('"');
        }
    }

    /// A value shown with `Display` or `Debug` (`format_args!`), as a string.
    pub fn fmt(&mut self, key: &str, value: fmt::Arguments<'_>) {
        if self.key(key) {
            self.out.push('"');
            let _ = Escaping(&mut self.out).write_fmt(value);
            self.out.push('"');
        }
    }

    pub fn i64(&mut self, key: &str, value: i64) {
        if self.key(key) {
            let _ = write!(self.out, "{value}");
        }
    }

    pub fn u64(&mut self, key: &str, value: u64) {
        if self.key(key) {
            let _ = write!(self.out, "{value}");
        }
    }

    pub fn i128(&mut self, key: &str, value: i128) {
        if self.key(key) {
            let _ = write!(self.out, "{value}");
        }
    }

    pub fn u128(&mut self, key: &str, value: u128) {
        if self.key(key) {
            let _ = write!(self.out, "{value}");
        }
    }

    /// A number; NaN and the infinities, which JSON has no number for, as
    /// the strings "NaN", "inf" and "-inf".
    pub fn f64(&mut self, key: &str, value: f64) {
        if !value.is_finite() {
            let text = if value.is_nan() {
                "NaN"
            } else if value > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            return self.str(key, text);
        }
        if self.key(key) {
            let _ = write!(self.out, "{value:?}");
        }
    }

    pub fn bool(&mut self, key: &str, value: bool) {
        if self.key(key) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }

    /// Copies the entries of `other` (not finished) whose keys this object
    /// lacks.
    pub fn merge(&mut self, other: &Fields) {
        for (i, key) in other.keys.iter().enumerate() {
            let value_start = key.end + 2; // past `":`
            let value_end = other
                .keys
                .get(i + 1)
                .map_or(other.out.len(), |next| next.start - 2);
            let repeat = self
                .keys
                .iter()
                .any(|r| self.out[r.clone()] == other.out[key.clone()]);
            if repeat {
                continue;
            }
            self.out.push(if self.out.is_empty() { '{' } else { ',' });
            self.out.push('"');
            let start = self.out.len();
            self.out.push_str(&other.out[key.clone()]);
            self.keys.push(start..self.out.len());
            self.out.push_str("\":");
            self.out.push_str(&other.out[value_start..value_end]);
        }
    }
}

/// A `fmt::Write` that escapes what it is given for a JSON string.
struct Escaping<'a>(&'a mut String);

impl Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, c) in s.char_indices() {
            let escape = match c {
                '"' => "\\\"",
                '\\' => "\\\\",
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                c if (c as u32) < 0x20 => "",
                _ => continue,
            };
            self.0.push_str(&s[plain..i]);
            if escape.is_empty() {
                write!(self.0, "\\u{:04x}", c as u32)?;
            } else {
                self.0.push_str(escape);
            }
            plain = i + c.len_utf8();
        }
        self.0.push_str(&s[plain..]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(f: &mut Fields) -> String {
        f.finish().to_string()
    }

    #[test]
    fn types_are_kept_and_strings_escaped() {
        let mut f = Fields::default();
        f.i64("a", -3);
        f.u64("b", 7);
        f.f64("c", 1.5);
        f.bool("d", true);
        f.str("e", "quote \" backslash \\ newline \n bell \u{7}");
        f.fmt("g", format_args!("{:?}", vec![1, 2]));
        f.f64("h", f64::NAN);
        assert_eq!(
            parse(&mut f),
            r#"{"a":-3,"b":7,"c":1.5,"d":true,"e":"quote \" backslash \\ newline \n bell \u0007","g":"[1, 2]","h":"NaN"}"#
        );
    }

    #[test]
    fn a_repeated_key_is_kept_once_the_first_time() {
        let mut f = Fields::default();
        f.u64("k", 1);
        f.str("k", "again");
        f.u64("j", 2);
        assert_eq!(parse(&mut f), r#"{"k":1,"j":2}"#);
    }

    #[test]
    fn merge_adds_only_new_keys() {
        let mut span = Fields::default();
        span.str("user", "ann");
        span.u64("k", 9);
        span.f64("ratio", 0.25);
        let mut f = Fields::default();
        f.u64("k", 1);
        f.merge(&span);
        assert_eq!(parse(&mut f), r#"{"k":1,"user":"ann","ratio":0.25}"#);
        let mut empty = Fields::default();
        assert_eq!(empty.finish(), "");
        let mut only = Fields::default();
        only.merge(&span);
        assert_eq!(parse(&mut only), r#"{"user":"ann","k":9,"ratio":0.25}"#);
    }
}
