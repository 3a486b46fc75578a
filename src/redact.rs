//! Keeping credentials out of the texts eventd shows: the redactions that
//! need no password. A URL's `user:password@`, `password=` parameters,
//! `Authorization` values and the last argument of a ClickHouse `remote()`
//! (its password) are masked wherever they appear; [`url_credentials`]
//! says whether a URL holds credentials at all (`ExportUrl` may not).
//!
//! The configuration uses it for its own error messages; the export stage
//! adds the configured password on top (`export::redact`).

/// What a password, or a text that may hold one, is replaced by.
pub const MASK: &str = "<redacted>";

/// `text` with each byte range of `ranges` (on character boundaries)
/// replaced by [`MASK`]; overlapping and touching ranges become one.
pub fn mask_ranges(text: &str, ranges: &mut [(usize, usize)]) -> String {
    if ranges.is_empty() {
        return text.to_string();
    }
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    let mut current: Option<(usize, usize)> = None;
    for &(lo, hi) in ranges.iter() {
        match current {
            Some((clo, chi)) if lo <= chi => current = Some((clo, chi.max(hi))),
            Some((clo, chi)) => {
                out.push_str(&text[at..clo]);
                out.push_str(MASK);
                at = chi;
                current = Some((lo, hi));
            }
            None => current = Some((lo, hi)),
        }
    }
    if let Some((clo, chi)) = current {
        out.push_str(&text[at..clo]);
        out.push_str(MASK);
        at = chi;
    }
    out.push_str(&text[at..]);
    out
}

/// The redactions that need no password: `remote()` arguments, URL
/// userinfo, `password=` parameters and `Authorization` values.
pub fn patterns(text: &str) -> String {
    let mut ranges = Vec::new();
    remote_arguments(text.as_bytes(), &mut ranges);
    url_userinfo(text.as_bytes(), &mut ranges);
    password_parameters(text.as_bytes(), &mut ranges);
    authorization_values(text.as_bytes(), &mut ranges);
    mask_ranges(text, &mut ranges)
}

/// A URL as it may be shown: its userinfo password and `password=`
/// parameters masked.
pub fn url(url: &str) -> String {
    patterns(url)
}

/// `serde` serializer of a URL as [`url`] shows it.
pub fn serialize_url<S: serde::Serializer>(u: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&url(u))
}

/// What credentials an HTTP URL holds, if any: a userinfo (`user@`,
/// `user:password@`) or a `password=` parameter.
pub fn url_credentials(url: &str) -> Option<&'static str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..end].contains('@') {
        return Some("a user name or password before the host (user:password@)");
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    let query = query.split('#').next().unwrap_or("");
    let password = query.split('&').any(|p| {
        p.split('=')
            .next()
            .is_some_and(|k| k.eq_ignore_ascii_case("password"))
    });
    password.then_some("a password= parameter")
}

fn is_space(b: u8) -> bool {
    b.is_ascii_whitespace()
}

/// Where `needle` (ASCII, lower case) occurs in `text`, ignoring ASCII case.
fn find_all(text: &[u8], needle: &[u8]) -> Vec<usize> {
    if needle.is_empty() || text.len() < needle.len() {
        return Vec::new();
    }
    (0..=text.len() - needle.len())
        .filter(|&i| text[i..i + needle.len()].eq_ignore_ascii_case(needle))
        .collect()
}

/// The index after the quoted text starting at `at` (its opening quote),
/// with backslash escapes and doubled quotes inside; the text's end when
/// it is not closed.
fn skip_quoted(text: &[u8], at: usize) -> usize {
    let quote = text[at];
    let mut i = at + 1;
    while i < text.len() {
        match text[i] {
            b'\\' => i += 2,
            q if q == quote && text.get(i + 1) == Some(&quote) => i += 2,
            q if q == quote => return i + 1,
            _ => i += 1,
        }
    }
    text.len()
}

/// The arguments of a call whose list starts at `at` (after its `(`), as
/// byte ranges, and whether the list is closed.
fn arguments(text: &[u8], at: usize) -> (Vec<(usize, usize)>, bool) {
    let mut args = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, at, at);
    while i < text.len() {
        match text[i] {
            b'\'' | b'"' | b'`' => {
                i = skip_quoted(text, i);
                continue;
            }
            b'(' | b'[' => depth += 1,
            b')' | b']' if depth > 0 => depth -= 1,
            b')' => {
                args.push((start, i));
                return (args, true);
            }
            b',' if depth == 0 => {
                args.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    args.push((start, text.len()));
    (args, false)
}

/// `(lo, hi)` without the white space at either end.
fn trimmed(text: &[u8], (mut lo, mut hi): (usize, usize)) -> (usize, usize) {
    while lo < hi && is_space(text[lo]) {
        lo += 1;
    }
    while hi > lo && is_space(text[hi - 1]) {
        hi -= 1;
    }
    (lo, hi)
}

/// `remote(...)` and `remoteSecure(...)` with four or more arguments:
/// the last (`remote(addresses, db, table, user, password)` or
/// `remote(addresses, db.table, user, password)`); when the text ends
/// inside the list, everything from the fourth on.
fn remote_arguments(text: &[u8], ranges: &mut Vec<(usize, usize)>) {
    for at in find_all(text, b"remote") {
        let mut i = at + b"remote".len();
        if text[i..].len() >= 6 && text[i..i + 6].eq_ignore_ascii_case(b"secure") {
            i += 6;
        }
        while i < text.len() && is_space(text[i]) {
            i += 1;
        }
        if text.get(i) != Some(&b'(') {
            continue;
        }
        let (args, closed) = arguments(text, i + 1);
        if args.len() < 4 {
            continue;
        }
        let (lo, hi) = if closed {
            trimmed(text, args[args.len() - 1])
        } else {
            (trimmed(text, args[3]).0, text.len())
        };
        if lo < hi {
            ranges.push((lo, hi));
        }
    }
}

/// The password of every `scheme://user:password@host`.
fn url_userinfo(text: &[u8], ranges: &mut Vec<(usize, usize)>) {
    for at in find_all(text, b"://") {
        let start = at + 3;
        let end = text[start..]
            .iter()
            .position(|&b| {
                matches!(b, b'/' | b'?' | b'#' | b'\'' | b'"' | b'<' | b'>') || is_space(b)
            })
            .map_or(text.len(), |p| start + p);
        let authority = &text[start..end];
        let Some(user_end) = authority.iter().rposition(|&b| b == b'@') else {
            continue;
        };
        if let Some(colon) = authority[..user_end].iter().position(|&b| b == b':') {
            ranges.push((start + colon + 1, start + user_end));
        }
    }
}

/// The value of every `password=` (a URL parameter, a setting).
fn password_parameters(text: &[u8], ranges: &mut Vec<(usize, usize)>) {
    for at in find_all(text, b"password=") {
        let start = at + b"password=".len();
        let end = text[start..]
            .iter()
            .position(|&b| matches!(b, b'&' | b'#') || is_space(b))
            .map_or(text.len(), |p| start + p);
        if start < end {
            ranges.push((start, end));
        }
    }
}

/// What follows `Authorization:` or `Authorization=` (a header, a
/// field): the scheme's word kept, the credentials masked.
fn authorization_values(text: &[u8], ranges: &mut Vec<(usize, usize)>) {
    let skip = |mut i: usize, also: &[u8]| {
        while i < text.len() && (is_space(text[i]) || also.contains(&text[i])) {
            i += 1;
        }
        i
    };
    for at in find_all(text, b"authorization") {
        let i = skip(at + b"authorization".len(), b"\"'");
        if !matches!(text.get(i), Some(b':' | b'=')) {
            continue;
        }
        let mut i = skip(i + 1, b"\"'");
        for scheme in [&b"basic"[..], b"bearer"] {
            let end = i + scheme.len();
            if text.len() > end && text[i..end].eq_ignore_ascii_case(scheme) && is_space(text[end])
            {
                i = skip(end, b"");
            }
        }
        let end = text[i..]
            .iter()
            .position(|&b| matches!(b, b'"' | b'\'' | b',') || is_space(b))
            .map_or(text.len(), |p| i + p);
        if i < end {
            ranges.push((i, end));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_arguments_are_masked_whatever_the_password() {
        for (text, want) in [
            (
                "remote('a:9000', 'db', 't', 'u', 'p,(w)\\'x')",
                format!("remote('a:9000', 'db', 't', 'u', {MASK})"),
            ),
            (
                "REMOTESECURE ('a', db.t, 'u', 'pw') x",
                format!("REMOTESECURE ('a', db.t, 'u', {MASK}) x"),
            ),
            (
                "remote('a', 'db', 't') x",
                "remote('a', 'db', 't') x".to_string(),
            ),
            (
                "remote('a', 'db', 't', 'u', 'pw is cut",
                format!("remote('a', 'db', 't', {MASK}"),
            ),
            ("remote(", "remote(".to_string()),
            ("remote", "remote".to_string()),
        ] {
            assert_eq!(patterns(text), want, "{text}");
        }
    }

    #[test]
    fn urls_parameters_and_headers_are_masked() {
        assert_eq!(
            url("http://eventd:pw@10.0.0.5:8123/?a=1&password=pw2&b=2"),
            format!("http://eventd:{MASK}@10.0.0.5:8123/?a=1&password={MASK}&b=2")
        );
        assert_eq!(url("http://10.0.0.5:8123/"), "http://10.0.0.5:8123/");
        assert_eq!(url("http://eventd@h/"), "http://eventd@h/");
        assert_eq!(
            patterns("sent Authorization: Basic ZXZlbnRkOnB3 to x"),
            format!("sent Authorization: Basic {MASK} to x")
        );
        assert_eq!(
            patterns(r#"{"authorization":"abc"}"#),
            format!(r#"{{"authorization":"{MASK}"}}"#)
        );
        assert_eq!(patterns("authorization failed"), "authorization failed");
    }

    #[test]
    fn credentials_in_a_url_are_found() {
        assert!(url_credentials("http://u:p@h:8123/").is_some());
        assert!(url_credentials("http://u@h/").is_some());
        assert!(url_credentials("http://h/?user=u&Password=p").is_some());
        assert_eq!(url_credentials("http://h:8123/"), None);
        assert_eq!(url_credentials("http://h/?database=x"), None);
        assert_eq!(url_credentials("http://h/path@x"), None);
    }
}
