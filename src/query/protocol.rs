//! The query protocol on `RUN_DIR/query.sock` (a Unix stream socket).
//!
//! The client sends one JSON object on one line; the server answers with
//! JSON lines and closes the connection:
//!
//! ```text
//! → {"op":"query","filter":{"since_ns":..,"level":3,"order":"newest_first","limit":100},"follow":false}
//! ← {"event":{"ts":..,"cpu":0,"seq":17,...}}      one per event, in order
//! ← {"gap":{"cpu":0,"from_seq":..,"lost":12,...}}  gaps meeting the window, after the events
//! ← {"warning":"shard-007.db: not read: ..."}      a shard that did not answer
//! ← {"end":{"count":100,"cursor":"<token>","gaps":3,"gap_cursor":"<token>"}}
//!                                                  each cursor continues its listing
//!
//! → {"op":"stats"} | {"op":"shards"} | {"op":"config"} | {"op":"metrics"} | {"op":"export"}
//! ← {"stats":{...}} | {"shards":[...]} | {"config":{...}} | {"metrics":"<Prometheus text>"}
//!   | {"export":{...}} (null when export is off)
//!
//! ← {"error":{"code":"busy"|"denied"|"bad_request","message":"..."}}
//! ```
//!
//! With `"follow":true` the listing (the newest `limit` events, newest
//! first, when the filter asks for them so) is followed by
//! `{"following":{"count":N,"gaps":G}}` instead of `end`, then events
//! committed after the query started follow as they commit, until the
//! client disconnects.

use super::filter::Filter;
use serde::{Deserialize, Serialize};

/// Longest request line accepted.
pub const REQUEST_BYTES_MAX: usize = 64 << 10;

// Requests are read once per connection; the size difference between the
// variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Query {
        #[serde(default)]
        filter: Filter,
        #[serde(default)]
        follow: bool,
    },
    Stats,
    Shards,
    Config,
    /// The same figures as `stats`, in the Prometheus text format.
    Metrics,
    /// The export stage's report (`eventctl export status`).
    Export,
}

/// Error codes a client can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No query slot for the peer's uid (MaxConcurrentQueries running,
    /// its share held, or the rest kept for root and eventd's own user),
    /// every report thread taken, or the connection cut before its request
    /// came (its uid had too many waiting); the message says which. Try
    /// again later.
    Busy,
    /// The peer's credentials do not allow reading events.
    Denied,
    /// The request could not be understood.
    BadRequest,
    /// The daemon failed to answer.
    Internal,
}

pub fn error_line(code: ErrorCode, message: &str) -> String {
    serde_json::json!({ "error": { "code": code, "message": message } }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_unknown_fields_are_refused() {
        let r: Request = serde_json::from_str(r#"{"op":"query","filter":{"level":3}}"#).unwrap();
        assert_eq!(
            r,
            Request::Query {
                filter: Filter {
                    level: Some(3),
                    ..Filter::default()
                },
                follow: false
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"stats"}"#).unwrap(),
            Request::Stats
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"query","filter":{"levl":3}}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"drop_tables"}"#).is_err());
    }
}
