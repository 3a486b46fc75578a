//! C strings as Rust text, checked, on the path of every emit.

use crate::EVENTD_E_INVALID;
use std::ffi::{c_char, c_int, CStr};

/// `p` as a string: None for NULL, Err for text that is not UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and
/// unchanged for `'a`.
#[inline(always)]
pub(crate) unsafe fn text<'a>(p: *const c_char) -> Result<Option<&'a str>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // Keys, values and names are mostly short ASCII: one pass over at most
    // SHORT_TEXT bytes finds both the end and that it is UTF-8, where
    // strlen and then a UTF-8 check are two calls. Anything longer, or not
    // ASCII, goes the general way.
    const SHORT_TEXT: usize = 24;
    for len in 0..SHORT_TEXT {
        // SAFETY: bytes before the terminating NUL, and the NUL itself, are
        // readable by the caller's promise; the loop stops at the NUL.
        let b = unsafe { *p.cast::<u8>().add(len) };
        if b == 0 {
            // SAFETY: the `len` bytes before the NUL are readable (above)
            // and unchanged for 'a (the caller's promise).
            let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
            // SAFETY: each of them was below 0x80 (the loop leaves at
            // the first that is not), and ASCII is UTF-8.
            return Ok(Some(unsafe { std::str::from_utf8_unchecked(bytes) }));
        }
        if b >= 0x80 {
            break;
        }
    }
    // SAFETY: non-null, and NUL-terminated and live by the caller's promise.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| EVENTD_E_INVALID)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(bytes: &[u8]) -> Result<Option<String>, c_int> {
        let mut owned = bytes.to_vec();
        owned.push(0);
        // SAFETY: NUL-terminated, alive for the call.
        unsafe { text(owned.as_ptr().cast()) }.map(|t| t.map(str::to_owned))
    }

    #[test]
    fn ascii_of_every_length_around_the_short_pass() {
        for len in 0..60 {
            let s: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            assert_eq!(check(s.as_bytes()), Ok(Some(s.clone())), "length {len}");
        }
    }

    #[test]
    fn utf8_anywhere_is_kept_and_anything_else_refused() {
        for prefix in ["", "short", "a prefix longer than the short pass"] {
            let good = format!("{prefix}h\u{e9}llo \u{1f600}");
            assert_eq!(check(good.as_bytes()), Ok(Some(good.clone())));
            let mut bad = prefix.as_bytes().to_vec();
            bad.extend_from_slice(b"\xff\xfe tail");
            assert_eq!(check(&bad), Err(EVENTD_E_INVALID), "{prefix:?}");
            // A multi-byte character cut short by the NUL.
            let mut cut = prefix.as_bytes().to_vec();
            cut.push(0xc3);
            assert_eq!(check(&cut), Err(EVENTD_E_INVALID), "{prefix:?}");
        }
    }

    #[test]
    fn null_is_none() {
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { text(std::ptr::null()) }, Ok(None));
    }
}
