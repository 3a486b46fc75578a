//! ClickHouse literals: a text as a string literal, a name as an identifier.
//! Every statement the export sends writes its values through these
//! (`statements.rs`), and the redactor masks a password as [`quote`]
//! writes it.

/// `text` as a ClickHouse string literal.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `name` as a ClickHouse identifier (back-quoted).
pub fn ident(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}
