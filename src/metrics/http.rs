//! The optional HTTP listener for Prometheus scrapers (MetricsListen).
//!
//! It serves `GET /metrics` (and `HEAD`) from one thread; every other path
//! gets 404 and every other method 405. The configuration only accepts
//! loopback addresses: a scraper on another host reaches it through its
//! own tunnel or proxy, which eventd leaves to the operator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Renders the exposition text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub struct MetricsListener {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl MetricsListener {
    /// Binds `addr` and serves until dropped.
    pub fn start(addr: SocketAddr, render: Render) -> std::io::Result<MetricsListener> {
        let server = tiny_http::Server::http(addr).map_err(std::io::Error::other)?;
        let server = Arc::new(server);
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| std::io::Error::other("the metrics listener is not on an IP address"))?;
        let thread = {
            let server = server.clone();
            std::thread::Builder::new()
                .name("metrics-http".into())
                .spawn(move || serve(&server, &render))?
        };
        Ok(MetricsListener {
            server,
            addr: bound,
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port chosen, if 0 was configured).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn serve(server: &tiny_http::Server, render: &Render) {
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("");
        let response = match (request.method(), path) {
            (tiny_http::Method::Get | tiny_http::Method::Head, "/metrics") => {
                tiny_http::Response::from_string(render())
                    .with_header(header("Content-Type", CONTENT_TYPE))
            }
            (tiny_http::Method::Get | tiny_http::Method::Head, _) => {
                tiny_http::Response::from_string("eventd serves /metrics only\n")
                    .with_status_code(404)
            }
            _ => tiny_http::Response::from_string("GET /metrics only\n")
                .with_status_code(405)
                .with_header(header("Allow", "GET, HEAD")),
        };
        if let Err(e) = request.respond(response) {
            tracing::debug!(error = %e, "metrics scrape ended early");
        }
    }
}

/// A header from constant ASCII text.
fn header(name: &'static str, value: &'static str) -> tiny_http::Header {
    // from_bytes only fails on non-ASCII input; both are constants.
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|()| unreachable!("constant ASCII header {name}"))
}

impl Drop for MetricsListener {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let render: Render = Arc::new(|| "eventd_up 1\n".to_string());
        let l = MetricsListener::start("127.0.0.1:0".parse().unwrap(), render).unwrap();
        let ok = get(l.addr(), "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(ok.contains("version=0.0.4"), "{ok}");
        assert!(ok.ends_with("eventd_up 1\n"), "{ok}");
        let missing = get(l.addr(), "GET /other HTTP/1.0\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        let post = get(
            l.addr(),
            "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.0 405"), "{post}");
        drop(l);
    }
}
