//! The client side of the query protocol (used by `eventctl`).

use super::protocol::Request;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Sends `request` to the daemon listening at `socket` and hands every
/// answer line, parsed, to `each` until the server closes the connection or
/// `each` returns false.
pub fn call(
    socket: &Path,
    request: &Request,
    mut each: impl FnMut(serde_json::Value) -> std::io::Result<bool>,
) -> std::io::Result<()> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            // The shard files grant no more than the socket: no point in
            // pointing at --offline.
            "querying needs membership of eventd's QueryGroup (see docs/design/security.md)"
        } else {
            "is it running with this --data-dir? `eventctl query --offline` reads the shard \
             files without it, for those who may read them"
        };
        std::io::Error::new(
            e.kind(),
            format!("cannot reach eventd at {}: {e} ({hint})", socket.display()),
        )
    })?;
    let mut line = serde_json::to_string(request).map_err(std::io::Error::other)?;
    line.push('\n');
    // A refusal (denied, busy) is written by the daemon as soon as the
    // connection is accepted, and the connection closed: the write can then
    // fail while the answer waits to be read. The answer decides.
    let sent = stream.write_all(line.as_bytes());
    let mut answered = false;
    for line in BufReader::new(stream).lines() {
        let line = match line {
            Ok(l) => l,
            // Closed by the daemon with part of our request unread: what it
            // answered before closing was read whole.
            Err(e) if answered && e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(e),
        };
        answered = true;
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| std::io::Error::other(format!("malformed answer from eventd: {e}")))?;
        if !each(value)? {
            break;
        }
    }
    match sent {
        Err(e) if !answered => Err(e),
        _ => Ok(()),
    }
}
