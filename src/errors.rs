//! Error text for people: an error and its causes on one line.

/// `e` and each of its causes, joined with ": ", leaving out a cause whose
/// text the line already holds (many errors here name their source in
/// their own message, and `{:#}` would print it twice).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        next = cause.source();
        // A cause's own line breaks (a library's multi-line text) would
        // make several records of one error in a service manager's log.
        let text = cause.to_string().trim_end().replace('\n', " | ");
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}: {source}")]
    struct Read {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Read {
            path: "eventd.toml",
            source: io,
        })
        .context("loading the configuration");
        assert_eq!(
            error_chain(e.as_ref()),
            "loading the configuration: cannot read eventd.toml: entity not found"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(plain.as_ref()), "outer: inner");
    }
}
