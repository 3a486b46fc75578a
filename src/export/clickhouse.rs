//! ClickHouse's HTTP interface, as the export stage and `eventctl` use it:
//! statements, queries with a result body, and inserts of a formatted body.
//! HTTP, or HTTPS with the server's certificate always verified (see
//! [`super::tls`]); HTTP Basic authentication when a user is configured.
//!
//! Every request has a deadline (connect, then each read and write), so a
//! server that stops answering (SIGSTOP, a network partition) costs a
//! bounded wait and an error, never a hung thread.
//!
//! An error's text comes from the server or the transport: before it is
//! returned (and so before anyone stores, logs or prints it) the password
//! is masked ([`super::redact`]) and control characters are escaped
//! ([`crate::query::render::clean`]).

pub use super::literal::{ident, quote};
use super::redact::Redactor;
use std::io::Read;
use std::time::Duration;

/// The longest response body read (a query's result).
const RESPONSE_BYTES_MAX: u64 = 256 << 20;

/// Where the cluster is and who eventd is there.
#[derive(Clone)]
pub struct Endpoint {
    /// `http://host:port/`, as `ExportUrl` says (without credentials).
    pub url: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// The TLS configuration for an `https://` URL (see [`super::tls`]);
    /// None for `http://`. An `https://` URL without one trusts no
    /// certificate at all.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Endpoint")
            .field("url", &crate::redact::url(&self.url))
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What went wrong talking to ClickHouse. Every text in it is safe to show:
/// the password masked, control characters escaped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClickHouseError {
    /// The server answered with an error (its exception code and text).
    #[error("{url}: HTTP {status}: {message}")]
    Server {
        url: String,
        status: u16,
        /// ClickHouse's error code (`Code: N` in its message), if it said.
        code: Option<u32>,
        message: String,
    },
    /// No answer: refused, reset, timed out.
    #[error("{url}: {message}")]
    Transport { url: String, message: String },
    #[error("{url}: the answer could not be read: {message}")]
    Body { url: String, message: String },
}

impl ClickHouseError {
    /// ClickHouse's error code, when the server gave one.
    pub fn code(&self) -> Option<u32> {
        match self {
            ClickHouseError::Server { code, .. } => *code,
            _ => None,
        }
    }
}

/// A connection pool to one ClickHouse server.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    endpoint: Endpoint,
    auth: Option<String>,
    /// The URL as errors show it.
    shown_url: String,
    redactor: Redactor,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// What went wrong in the transport, without the URL (which ureq's own
/// text starts with, and the error names once already): the kind, its
/// message, and what caused it, a TLS failure said in words.
fn transport_message(t: &ureq::Transport) -> String {
    use std::error::Error;
    let mut text = t.kind().to_string();
    if let Some(m) = t.message() {
        text.push_str(": ");
        text.push_str(m);
    }
    if let Some(source) = t.source() {
        let cause = super::tls::explain(source).unwrap_or_else(|| source.to_string());
        // ureq's I/O errors say their kind again.
        if cause.starts_with(&text) {
            return cause;
        }
        text.push_str(": ");
        text.push_str(&cause);
    }
    text
}

/// `Code: 60, e.displayText() = ...` → 60.
fn error_code(message: &str) -> Option<u32> {
    let rest = message.split("Code: ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl Client {
    /// A client of `endpoint` whose requests give up after `timeout`
    /// without progress (connect, each read, each write).
    pub fn new(endpoint: Endpoint, timeout: Duration) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout.min(Duration::from_secs(10)))
            .timeout_read(timeout)
            .timeout_write(timeout)
            .max_idle_connections_per_host(8)
            .user_agent(concat!("eventd/", env!("CARGO_PKG_VERSION")))
            .tls_config(
                endpoint
                    .tls
                    .clone()
                    .unwrap_or_else(super::tls::trusting_nothing),
            )
            .build();
        let (user, password) = (endpoint.user.as_deref(), endpoint.password.as_deref());
        let auth = user.map(|u| super::redact::basic_authorization(u, password.unwrap_or("")));
        let redactor = Redactor::new(user, password);
        Client {
            agent,
            shown_url: crate::redact::url(&endpoint.url),
            endpoint,
            auth,
            redactor,
        }
    }

    /// The server's URL, as it may be shown.
    pub fn url(&self) -> &str {
        &self.shown_url
    }

    /// `text` (from the server, or any text that may quote a request) as
    /// it may be stored, logged or shown: the password masked, control
    /// characters escaped.
    pub fn shown(&self, text: &str) -> String {
        crate::query::render::clean(&self.redactor.redact(text)).into_owned()
    }

    /// The configured user and password, if a user is configured.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        let user = self.endpoint.user.as_deref()?;
        Some((user, self.endpoint.password.as_deref().unwrap_or("")))
    }

    fn request(&self, settings: &[(&str, &str)]) -> ureq::Request {
        let mut r = self.agent.post(&self.endpoint.url);
        if let Some(auth) = &self.auth {
            r = r.set("Authorization", auth);
        }
        for (k, v) in settings {
            r = r.query(k, v);
        }
        r
    }

    fn finish(
        &self,
        result: Result<ureq::Response, ureq::Error>,
    ) -> Result<Vec<u8>, ClickHouseError> {
        let url = self.shown_url.clone();
        match result {
            Ok(response) => {
                let mut body = Vec::new();
                response
                    .into_reader()
                    .take(RESPONSE_BYTES_MAX)
                    .read_to_end(&mut body)
                    .map_err(|e| ClickHouseError::Body {
                        url: url.clone(),
                        message: self.shown(&e.to_string()),
                    })?;
                Ok(body)
            }
            Err(ureq::Error::Status(status, response)) => {
                let mut text = String::new();
                let _ = response
                    .into_reader()
                    .take(64 << 10)
                    .read_to_string(&mut text);
                Err(ClickHouseError::Server {
                    url,
                    status,
                    // A number: read before the masking, which could cut it.
                    code: error_code(&text),
                    message: self.shown(text.trim()),
                })
            }
            Err(ureq::Error::Transport(t)) => Err(ClickHouseError::Transport {
                url,
                message: self.shown(&transport_message(&t)),
            }),
        }
    }

    /// Runs `sql` (a statement, or a query whose result is read whole)
    /// with `settings` as URL parameters; returns the body. The server
    /// buffers the result (`wait_end_of_query`), so an error part-way is an
    /// error status, never a truncated body taken for a result.
    pub fn run(&self, sql: &str, settings: &[(&str, &str)]) -> Result<Vec<u8>, ClickHouseError> {
        let mut all: Vec<(&str, &str)> = vec![("wait_end_of_query", "1")];
        all.extend_from_slice(settings);
        self.finish(self.request(&all).send_bytes(sql.as_bytes()))
    }

    /// [`run`](Self::run), the result as text.
    pub fn text(&self, sql: &str, settings: &[(&str, &str)]) -> Result<String, ClickHouseError> {
        let body = self.run(sql, settings)?;
        String::from_utf8(body).map_err(|e| ClickHouseError::Body {
            url: self.shown_url.clone(),
            message: e.to_string(),
        })
    }

    /// Sends `body` as the data of `insert` (an `INSERT ... FORMAT F`
    /// statement, passed as the `query` parameter) with `settings`.
    pub fn insert(
        &self,
        insert: &str,
        body: &[u8],
        settings: &[(&str, &str)],
    ) -> Result<(), ClickHouseError> {
        let mut all: Vec<(&str, &str)> = vec![("query", insert)];
        all.extend_from_slice(settings);
        self.finish(self.request(&all).send_bytes(body)).map(drop)
    }

    /// The server's version as numbers (`18.16.1` → `[18, 16, 1]`).
    pub fn version(&self) -> Result<Vec<u32>, ClickHouseError> {
        let text = self.text("SELECT version()", &[])?;
        Ok(parse_version(&text))
    }
}

pub fn parse_version(text: &str) -> Vec<u32> {
    text.trim()
        .split('.')
        .map_while(|p| p.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_versions_and_quoting() {
        assert_eq!(
            error_code("Code: 60, e.displayText() = DB::Exception: Table x doesn't exist"),
            Some(60)
        );
        assert_eq!(error_code("no code here"), None);
        assert_eq!(parse_version("18.16.1\n"), [18, 16, 1]);
        assert_eq!(parse_version("22.8.5.29"), [22, 8, 5, 29]);
        assert_eq!(quote("it's a \\ test"), "'it\\'s a \\\\ test'");
        assert_eq!(ident("ev`il"), "`ev\\`il`");
    }

    #[test]
    fn a_server_that_is_not_there_is_a_transport_error_naming_it() {
        // A port nothing listens on: bind one, learn it, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/");
        let client = Client::new(
            Endpoint {
                url: url.clone(),
                user: None,
                password: None,
                tls: None,
            },
            Duration::from_secs(2),
        );
        match client.run("SELECT 1", &[]) {
            Err(e @ ClickHouseError::Transport { .. }) => {
                // Named once: ureq's own text names it too.
                assert_eq!(e.to_string().matches(&url).count(), 1, "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
