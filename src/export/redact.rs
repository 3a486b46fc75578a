//! Keeping the ClickHouse password out of every text the export shows.
//!
//! The password goes to ClickHouse in the `Authorization` header and, when
//! the exporter asks every replica what landed, in the text of a
//! `remote(addresses, db, table, 'user', 'password')` query. A server may
//! quote that query in an error (18.16's syntax errors quote it from where
//! parsing stopped, which can be the password literal itself), and a
//! transport error quotes the URL. Such texts are kept in the export
//! status (which every QueryGroup member may read), logged, and printed by
//! `eventctl`, so each one goes through a [`Redactor`] first:
//!
//! - every occurrence of the configured password (as written, and as a
//!   ClickHouse string literal writes it) and of the `Authorization` value
//!   made from it is replaced by [`crate::redact::MASK`], however short the password;
//! - then, without knowing any password: the last argument of a `remote()`
//!   or `remoteSecure()` with four or more (the password, or the user when
//!   there is none; everything from the fourth on when the text is cut
//!   inside the list), a URL's `user:password@`, the value of a
//!   `password=` parameter, and what follows `Authorization:`.
//!
//! The second half is [`crate::redact`]'s (the configuration uses it too).
//! `ExportUrl` itself may not hold credentials
//! ([`crate::redact::url_credentials`]): the user is `ExportUser` and the
//! password comes from `ExportPasswordFile`.

use crate::redact::{mask_ranges, patterns};
use base64::Engine;

/// Masks the password of one user wherever it appears in a text.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The exact texts to mask, longest first.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").finish_non_exhaustive()
    }
}

/// The `Authorization` header's value for `user` and `password`.
pub fn basic_authorization(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

impl Redactor {
    /// For the password (if any) of `user` (if any).
    pub fn new(user: Option<&str>, password: Option<&str>) -> Redactor {
        let mut secrets = Vec::new();
        if let Some(p) = password.filter(|p| !p.is_empty()) {
            secrets.push(p.to_string());
            // As the remote() argument writes it, quotes left out.
            let literal = super::literal::quote(p);
            secrets.push(literal[1..literal.len() - 1].to_string());
        }
        if let Some(u) = user {
            let header = basic_authorization(u, password.unwrap_or(""));
            secrets.push(header["Basic ".len()..].to_string());
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// `text` with the password and anything that looks like a credential
    /// masked (see the module docs).
    pub fn redact(&self, text: &str) -> String {
        patterns(&self.mask_secrets(text))
    }

    /// Every occurrence of a secret replaced by [`crate::redact::MASK`] (overlapping
    /// occurrences become one).
    fn mask_secrets(&self, text: &str) -> String {
        let mut found: Vec<(usize, usize)> = self
            .secrets
            .iter()
            .flat_map(|s| {
                text.match_indices(s.as_str())
                    .map(|(i, m)| (i, i + m.len()))
            })
            .collect();
        mask_ranges(text, &mut found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::MASK;

    /// What 18.16 answered when a lookup's query was cut inside the
    /// password literal (`max_query_size`), and for a syntax error before
    /// the list.
    #[test]
    fn server_errors_quoting_the_password_are_masked() {
        let r = Redactor::new(Some("eventd"), Some("s3cret'pw"));
        let cut = "Code: 62, e.displayText() = DB::Exception: Syntax error: failed at position \
                   80: 's3cret\\'pw') WHERE 1 FORMAT RowBinary. Max query size exceeded";
        let shown = r.redact(cut);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains(&format!("'{MASK}')")), "{shown}");
        let whole = "Syntax error: failed at position 13: (  FROM remote('127.0.0.1:9000', \
                     'system', 'processes', 'eventd', 'other pw'). Unmatched parentheses: (";
        let shown = r.redact(whole);
        assert_eq!(
            shown,
            format!(
                "Syntax error: failed at position 13: (  FROM remote('127.0.0.1:9000', \
                 'system', 'processes', 'eventd', {MASK}). Unmatched parentheses: ("
            )
        );
    }

    #[test]
    fn the_password_and_its_header_are_masked_anywhere() {
        let r = Redactor::new(Some("eventd"), Some("hunter2"));
        let header = basic_authorization("eventd", "hunter2");
        let token = &header["Basic ".len()..];
        let text = format!("x hunter2hunter2 y {token} z");
        assert_eq!(r.redact(&text), format!("x {MASK} y {MASK} z"));
        // Text without them is left as it is, multi-byte characters too.
        assert_eq!(r.redact("é ✓ plain"), "é ✓ plain");
        assert_eq!(Redactor::new(None, None).redact("hunter2"), "hunter2");
        assert_eq!(Redactor::new(None, Some("")).redact("a"), "a");
    }
}
