//! A private ZooKeeper and a `shards × replicas` ClickHouse cluster, for
//! eventd's tests and its perf harness alike (`eventd-cluster`).
//!
//! Everything runs under one temporary directory on loopback ports picked at
//! start: nothing touches a system-wide service. Written against Debian 12's
//! `clickhouse-server` 18.16.1 and `zookeeper` 3.8.0; what those versions do
//! (and do not do) is written down in `docs/design/clickhouse-notes.md`.
//!
//! ```ignore
//! let c = Cluster::start(2, 2, Options::default());
//! c.on_cluster("CREATE DATABASE eventd ON CLUSTER eventd");
//! c.query(&c.url(1, 1), "SELECT version()");
//! ```
//!
//! Shards and replicas are numbered from 1, as ClickHouse numbers them
//! (`system.clusters.shard_num`, the `{shard}` macro). Each server has the
//! macros `shard` = `1`, `2`, … and `replica` = `s1r1`, `s1r2`, … (unique in
//! the whole cluster), and the same `<display_name>`, which comes back in the
//! `X-ClickHouse-Server-Display-Name` header of every answer.
//!
//! Processes are children of the thread that started them; by default they
//! get `PR_SET_PDEATHSIG = SIGKILL`, so a test that dies (or is killed) does
//! not leave servers behind. Start, restart and drop a `Cluster` in one
//! thread (a `#[test]` function does), or set `Options::die_with_parent` to
//! false.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `packaging/clickhouse/cluster.xml`: each server's cluster settings.
const CLUSTER_XML: &str = include_str!("../../packaging/clickhouse/cluster.xml");

/// The Debian packages that bring everything this module runs.
pub const APT_INSTALL: &str = "apt-get install -y clickhouse-server zookeeper";

/// How a [`Cluster`] is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// The name of the cluster in `<remote_servers>` (for `ON CLUSTER` and
    /// `Distributed(...)`).
    pub cluster_name: String,
    /// `<merge_tree><replicated_deduplication_window>`; server default 100.
    pub dedup_window: Option<u64>,
    /// `<merge_tree><cleanup_delay_period>` in seconds (the random extra of
    /// up to 10 s is turned off when this is set). The old blocks past the
    /// dedup window are only forgotten when this cleanup runs: default 30 s.
    pub cleanup_delay_period: Option<u64>,
    /// The ClickHouse servers' ZooKeeper session timeout. A SIGSTOPped
    /// replica counts as alive until its session expires.
    pub zk_session_timeout: Duration,
    /// `receive_timeout`/`send_timeout` of the servers' default profile:
    /// how long a server waits on another (a `Distributed` insert into a
    /// SIGSTOPped replica) before it tries the next one. Server default
    /// 300 s; as a query setting it does not reach the Distributed
    /// table's connections in 18.16, only the profile does.
    pub remote_timeout: Option<Duration>,
    /// ClickHouse `<logger><level>`.
    pub log_level: String,
    /// How long [`Cluster::start`] and [`Cluster::restart`] wait.
    pub start_timeout: Duration,
    /// The default timeout of one HTTP request made by this module.
    pub http_timeout: Duration,
    /// Keep the temporary directory (logs, data) after drop. Also on when
    /// the environment has `EVENTD_CLUSTER_KEEP=1`.
    pub keep_dir: bool,
    /// `PR_SET_PDEATHSIG = SIGKILL` on every child (see the module docs).
    pub die_with_parent: bool,
    /// Users besides `default` (which has no password), each with a
    /// profile of its own.
    pub users: Vec<User>,
    /// Each server also answers HTTPS (`<https_port>`, see
    /// [`Cluster::https_port`]) with this certificate.
    pub https: Option<Https>,
}

/// A server certificate for `<https_port>`, and optionally the CA whose
/// client certificates the server then demands (`verificationMode` strict;
/// without it, clients need none).
#[derive(Clone, Debug)]
pub struct Https {
    /// PEM: the server's certificate (chain).
    pub cert: PathBuf,
    /// PEM: its private key.
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// A ClickHouse user of the test servers.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub password: String,
    /// Its profile's settings (`max_query_size`, ...), over the defaults.
    pub settings: Vec<(String, String)>,
}

/// `text` with XML's special characters escaped.
fn xml_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cluster_name: "eventd".into(),
            dedup_window: None,
            cleanup_delay_period: None,
            zk_session_timeout: Duration::from_secs(6),
            remote_timeout: Some(Duration::from_secs(10)),
            log_level: "information".into(),
            start_timeout: Duration::from_secs(60),
            http_timeout: Duration::from_secs(60),
            keep_dir: std::env::var("EVENTD_CLUSTER_KEEP").is_ok_and(|v| v == "1"),
            die_with_parent: true,
            users: Vec::new(),
            https: None,
        }
    }
}

/// What a request to a server came to, when it was not a 200.
#[derive(Debug, Clone)]
pub struct ChError {
    /// The HTTP status, or None when no answer came (refused, timed out).
    pub status: Option<u16>,
    /// The ClickHouse error code (`Code: N, ...` at the start of the body).
    pub code: Option<u32>,
    /// The error text, or the I/O error.
    pub message: String,
    /// The I/O error's kind when no answer came.
    pub io_kind: Option<io::ErrorKind>,
}

impl ChError {
    fn io(e: io::Error) -> Self {
        ChError {
            status: None,
            code: None,
            message: e.to_string(),
            io_kind: Some(e.kind()),
        }
    }

    /// No answer within the timeout (a SIGSTOPped server accepts the
    /// connection in the kernel and never answers).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.io_kind,
            Some(io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
        )
    }

    /// Nothing listens (the server is down).
    pub fn is_refused(&self) -> bool {
        self.io_kind == Some(io::ErrorKind::ConnectionRefused)
    }
}

impl fmt::Display for ChError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.status, self.code) {
            (Some(s), Some(c)) => write!(f, "HTTP {s}, code {c}: {}", self.message.trim_end()),
            (Some(s), None) => write!(f, "HTTP {s}: {}", self.message.trim_end()),
            _ => write!(f, "no answer: {}", self.message),
        }
    }
}

impl std::error::Error for ChError {}

/// One HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn into_result(self) -> Result<Response, ChError> {
        if self.status == 200 {
            return Ok(self);
        }
        let message = self.text();
        Err(ChError {
            status: Some(self.status),
            code: error_code(&message),
            message,
            io_kind: None,
        })
    }
}

/// `Code: 319, e.displayText() = ...` -> 319 (the outermost code).
pub fn error_code(body: &str) -> Option<u32> {
    let rest = body.trim_start().strip_prefix("Code: ")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Percent-encodes a URL query component.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A tiny HTTP/1.1 client: one request per connection (`Connection:
/// close`), `Content-Length` bodies out, plain or chunked bodies in.
/// `url` is `http://HOST:PORT` (as [`Cluster::url`] gives), `target` the
/// path and query (`/ping`, `/?query=...`). `timeout` bounds the whole
/// exchange.
pub fn http(
    method: &str,
    url: &str,
    target: &str,
    body: &[u8],
    timeout: Duration,
) -> io::Result<Response> {
    let hostport = url
        .strip_prefix("http://")
        .unwrap_or(url)
        .trim_end_matches('/');
    let addr: SocketAddr = hostport
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{hostport}: {e}")))?;
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "HTTP request timed out"))
    };
    let mut stream = TcpStream::connect_timeout(&addr, left()?)?;
    stream.set_nodelay(true)?;
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\
         Content-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
        body.len()
    );
    let mut sent = Ok(());
    for part in [head.as_bytes(), body] {
        let mut off = 0;
        while off < part.len() && sent.is_ok() {
            stream.set_write_timeout(Some(left()?))?;
            match stream.write(&part[off..]) {
                Ok(0) => sent = Err(io::Error::new(io::ErrorKind::WriteZero, "peer closed")),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => sent = Err(e),
            }
        }
    }
    // A server that rejects a request early (unknown table) may answer and
    // close before it read the whole body: read its answer anyway.
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        stream.set_read_timeout(Some(left()?))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "HTTP request timed out",
                ))
            }
            Err(e) if !raw.is_empty() && e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(sent.err().unwrap_or(e)),
        }
    }
    if raw.is_empty() {
        sent?;
    }
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> io::Result<Response> {
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad HTTP answer: {what}"),
        )
    };
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| bad("headers not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(status_line))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        dechunk(rest).ok_or_else(|| bad("broken chunked body"))?
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// A RowBinary body, as 18.16 reads it: little-endian fixed-width integers,
/// strings as a LEB128 length and the bytes, `Nullable(T)` as one byte
/// (1 = NULL, nothing follows; 0 = a value follows) and then `T`.
#[derive(Default, Debug, Clone)]
pub struct RowBinary {
    pub buf: Vec<u8>,
}

impl RowBinary {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn varint(&mut self, mut v: u64) -> &mut Self {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return self;
            }
            self.buf.push(byte | 0x80);
        }
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }
    pub fn string(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    pub fn nullable_string(&mut self, v: Option<&str>) -> &mut Self {
        match v {
            None => self.u8(1),
            Some(s) => self.u8(0).string(s),
        }
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Polls `f` every 50 ms until it is true; false if `timeout` passes first.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where the programs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `clickhouse-server`, or the multi-call `clickhouse` (then run as
    /// `clickhouse server`).
    pub clickhouse: PathBuf,
    pub clickhouse_multicall: bool,
    pub java: PathBuf,
    /// The class path holding ZooKeeper (and, when present, a log4j binding
    /// so its log goes to a file).
    pub zk_classpath: String,
}

fn find_in(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Binaries {
    /// Finds them: `$CLICKHOUSE_SERVER`, else `clickhouse-server` or
    /// `clickhouse` in PATH, /usr/sbin, /usr/bin, /usr/local/bin; `$JAVA`,
    /// `$JAVA_HOME/bin/java` or `java` in PATH; `$ZOOKEEPER_CLASSPATH`,
    /// else Debian's /usr/share/java/zookeeper.jar, else the jars of
    /// `$ZOOKEEPER_HOME/lib`.
    pub fn find() -> Result<Binaries, String> {
        let sbin = ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"];
        let (clickhouse, clickhouse_multicall) = match std::env::var_os("CLICKHOUSE_SERVER") {
            Some(p) => {
                let p = PathBuf::from(p);
                let multi = p.file_name().is_some_and(|n| n == "clickhouse");
                (p, multi)
            }
            None => match find_in("clickhouse-server", &sbin) {
                Some(p) => (p, false),
                None => match find_in("clickhouse", &sbin) {
                    Some(p) => (p, true),
                    None => {
                        return Err(format!(
                            "clickhouse-server not found (PATH, /usr/sbin, /usr/bin; or set \
                             CLICKHOUSE_SERVER): {APT_INSTALL}"
                        ))
                    }
                },
            },
        };
        let java = std::env::var_os("JAVA")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("JAVA_HOME")
                    .map(|h| PathBuf::from(h).join("bin/java"))
                    .filter(|p| p.is_file())
            })
            .or_else(|| find_in("java", &["/usr/bin"]))
            .ok_or_else(|| {
                format!("java not found (PATH; or set JAVA / JAVA_HOME): {APT_INSTALL}")
            })?;
        let zk_classpath = match std::env::var("ZOOKEEPER_CLASSPATH") {
            Ok(cp) => cp,
            Err(_) => {
                let debian = Path::new("/usr/share/java/zookeeper.jar");
                let mut jars: Vec<PathBuf> = Vec::new();
                if debian.is_file() {
                    jars.push(debian.into());
                    // slf4j binding + log4j 1.2, so ZooKeeper logs to a file;
                    // without them it runs silently (slf4j's NOP logger).
                    for j in [
                        "/usr/share/java/slf4j-log4j12.jar",
                        "/usr/share/java/log4j-1.2.jar",
                    ] {
                        if Path::new(j).is_file() {
                            jars.push(j.into());
                        }
                    }
                } else if let Some(home) = std::env::var_os("ZOOKEEPER_HOME") {
                    if let Ok(rd) = std::fs::read_dir(PathBuf::from(home).join("lib")) {
                        jars.extend(
                            rd.flatten()
                                .map(|e| e.path())
                                .filter(|p| p.extension().is_some_and(|x| x == "jar")),
                        );
                    }
                }
                if jars.is_empty() {
                    return Err(format!(
                        "ZooKeeper not found (/usr/share/java/zookeeper.jar; or set \
                         ZOOKEEPER_CLASSPATH or ZOOKEEPER_HOME): {APT_INSTALL}"
                    ));
                }
                jars.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            }
        };
        Ok(Binaries {
            clickhouse,
            clickhouse_multicall,
            java,
            zk_classpath,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopped, // SIGSTOP
    Down,
}

/// One child process with its state.
struct Proc {
    child: Option<Child>,
    state: State,
}

impl Proc {
    fn down() -> Self {
        Proc {
            child: None,
            state: State::Down,
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) with the pid of a child we have not reaped yet
            // (Child is still held), so the pid cannot have been reused.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }

    /// True once the child has exited (and is reaped).
    fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_)) | Err(_)),
        }
    }

    /// SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, up to
    /// `grace` for it to exit, then SIGKILL; reaps it.
    fn terminate(&mut self, grace: Duration) {
        if self.child.is_none() {
            self.state = State::Down;
            return;
        }
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        if !wait_until(grace, || self.exited()) {
            self.kill();
        }
        self.child = None;
        self.state = State::Down;
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.state = State::Down;
    }
}

/// `/proc/PID/stat`'s state letter.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn spawn(cmd: &mut Command, die_with_parent: bool) -> io::Result<Child> {
    if die_with_parent {
        // SAFETY: the closure runs in the forked child before exec and only
        // calls prctl(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// `n` distinct loopback ports for one cluster, each reserved for the
/// cluster's life by an exclusive lock on `$TMPDIR/eventd-cluster-ports/PORT`.
///
/// The ports come from below the kernel's ephemeral range, which nothing
/// hands out by itself: a port freed while its server is killed for a test
/// stays ours until [`Cluster::restart`] binds it again, instead of going to
/// another test's `bind(0)` (the likeliest reading of a CI failure: a
/// restarted replica's `/ping` answered by a server without its tables). The locks keep
/// clusters of tests running at the same time, in one process or several,
/// off each other's ports. Where the ephemeral range leaves no room below it,
/// ports come from `bind(0)` as before.
pub fn free_ports(n: usize) -> io::Result<Vec<(u16, std::fs::File)>> {
    let lockdir = std::env::temp_dir().join("eventd-cluster-ports");
    std::fs::create_dir_all(&lockdir)?;
    let (lo, hi) = quiet_port_range();
    let mut seed = (std::process::id() as u64) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
        | 1;
    let mut picked: Vec<(u16, std::fs::File)> = Vec::with_capacity(n);
    let mut tries = 0;
    while picked.len() < n {
        tries += 1;
        if tries > 100_000 {
            return Err(io::Error::other(format!(
                "no {n} free loopback ports in {lo}..{hi}"
            )));
        }
        let port = if hi > lo {
            // xorshift64: any spread will do.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            lo + (seed % u64::from(hi - lo)) as u16
        } else {
            TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
        };
        if picked.iter().any(|(p, _)| *p == port) {
            continue;
        }
        // A lock file another user made and this one may not open: that
        // port is taken.
        let Ok(lock) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lockdir.join(port.to_string()))
        else {
            continue;
        };
        // SAFETY: flock on a descriptor this function owns; it touches no memory.
        let locked = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        } == 0;
        // Free now (the listener closes at once; servers bind with
        // SO_REUSEADDR, so no TIME_WAIT is in the way).
        if locked && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            picked.push((port, lock));
        }
    }
    Ok(picked)
}

/// The ports below the kernel's ephemeral range (`ip_local_port_range`),
/// up to 12,000 of them above 10,000; an empty range if there are none.
pub fn quiet_port_range() -> (u16, u16) {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let lo = first_ephemeral.saturating_sub(12_000).max(10_000);
    (lo, first_ephemeral.max(lo))
}

/// Whether process `pid` holds the socket listening on loopback `port`
/// (read from `/proc/net/tcp` and the process's descriptors).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            if u16::from_str_radix(local_port, 16).ok()? != port || *f.get(3)? != "0A" {
                return None;
            }
            Some(format!("socket:[{}]", f.get(9)?))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

struct Node {
    shard: usize,
    replica: usize,
    dir: PathBuf,
    http: u16,
    tcp: u16,
    interserver: u16,
    https: u16,
    proc: Proc,
}

impl Node {
    fn name(&self) -> String {
        format!("s{}r{}", self.shard, self.replica)
    }
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }
}

/// A running private ZooKeeper and ClickHouse cluster; dropping it stops
/// every process it started and removes its directory.
pub struct Cluster {
    bins: Binaries,
    opts: Options,
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    shards: usize,
    replicas: usize,
    zk_port: u16,
    zk: Proc,
    /// One server without ZooKeeper or `<remote_servers>`: see
    /// [`Cluster::start_single`].
    single: bool,
    nodes: Vec<Node>,
    /// The locks that keep this cluster's ports its own (see `free_ports`).
    _port_locks: Vec<std::fs::File>,
}

impl Cluster {
    /// Whether ClickHouse, Java and ZooKeeper can be found; the error says
    /// what is missing and the `apt-get install` that brings it.
    pub fn available() -> Result<(), String> {
        Binaries::find().map(|_| ())
    }

    /// Starts a private ZooKeeper and `shards × replicas` servers and waits
    /// until every server answers `/ping` and reaches ZooKeeper. Panics (with
    /// the logs' tails) if that fails three times.
    pub fn start(shards: usize, replicas: usize, opts: Options) -> Cluster {
        match Self::try_start(shards, replicas, opts) {
            Ok(c) => c,
            Err(e) => panic!("cluster did not start: {e}"),
        }
    }

    /// [`Cluster::start`] without the panic. Three tries, each with new
    /// ports and a new directory.
    pub fn try_start(shards: usize, replicas: usize, opts: Options) -> Result<Cluster, String> {
        Self::try_start_as(shards, replicas, false, opts)
    }

    /// One server as most people run it: no ZooKeeper, no macros, no
    /// `<remote_servers>` of eventd's (the server's own configuration
    /// here, nothing of `packaging/clickhouse/cluster.xml`). It is shard 1,
    /// replica 1. Panics if it does not start.
    pub fn start_single(opts: Options) -> Cluster {
        match Self::try_start_single(opts) {
            Ok(c) => c,
            Err(e) => panic!("server did not start: {e}"),
        }
    }

    /// [`Cluster::start_single`] without the panic.
    pub fn try_start_single(opts: Options) -> Result<Cluster, String> {
        Self::try_start_as(1, 1, true, opts)
    }

    fn try_start_as(
        shards: usize,
        replicas: usize,
        single: bool,
        opts: Options,
    ) -> Result<Cluster, String> {
        assert!(shards >= 1 && replicas >= 1);
        let bins = Binaries::find()?;
        let mut last = String::new();
        for _ in 0..3 {
            match Self::start_once(&bins, shards, replicas, single, &opts) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    // The half-started cluster was dropped; try new ports.
                    eprintln!("cluster start failed, retrying: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn start_once(
        bins: &Binaries,
        shards: usize,
        replicas: usize,
        single: bool,
        opts: &Options,
    ) -> Result<Cluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("eventd-ch-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let root = dir.path().to_path_buf();
        let n = shards * replicas;
        let (ports, port_locks): (Vec<u16>, Vec<std::fs::File>) = free_ports(1 + 4 * n)
            .map_err(|e| e.to_string())?
            .into_iter()
            .unzip();
        let mut nodes = Vec::with_capacity(n);
        for s in 1..=shards {
            for r in 1..=replicas {
                let i = (s - 1) * replicas + (r - 1);
                nodes.push(Node {
                    shard: s,
                    replica: r,
                    dir: root.join(format!("s{s}r{r}")),
                    http: ports[1 + 4 * i],
                    tcp: ports[2 + 4 * i],
                    interserver: ports[3 + 4 * i],
                    https: ports[4 + 4 * i],
                    proc: Proc::down(),
                });
            }
        }
        let mut c = Cluster {
            bins: bins.clone(),
            opts: opts.clone(),
            dir: Some(dir),
            root,
            shards,
            replicas,
            zk_port: ports[0],
            zk: Proc::down(),
            single,
            nodes,
            _port_locks: port_locks,
        };
        c.write_zk_config().map_err(|e| e.to_string())?;
        for i in 0..c.nodes.len() {
            c.write_node_config(i).map_err(|e| e.to_string())?;
        }
        if !single {
            c.start_zookeeper_only()?;
        }
        for i in 0..c.nodes.len() {
            c.spawn_node(i)?;
        }
        for i in 0..c.nodes.len() {
            c.wait_node_ready(i)?;
        }
        Ok(c)
    }

    // ---------------------------------------------------------------- configs

    fn zk_dir(&self) -> PathBuf {
        self.root.join("zookeeper")
    }

    fn write_zk_config(&self) -> io::Result<()> {
        let d = self.zk_dir();
        std::fs::create_dir_all(d.join("data"))?;
        let max_session = (self.opts.zk_session_timeout.as_millis() as u64 * 2).max(60_000);
        // tickTime 500 ms: sessions from 1 s (2 ticks) up; only `srvr` is
        // allowed among the four-letter words by default in 3.5+, which is
        // all the readiness check needs.
        std::fs::write(
            d.join("zoo.cfg"),
            format!(
                "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={data}\nclientPort={port}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout={max_session}\n\
                 4lw.commands.whitelist=srvr,ruok,mntr\n",
                data = d.join("data").display(),
                port = self.zk_port
            ),
        )?;
        std::fs::write(
            d.join("log4j.properties"),
            format!(
                "log4j.rootLogger=INFO, FILE\nlog4j.appender.FILE=org.apache.log4j.FileAppender\n\
                 log4j.appender.FILE.File={}\nlog4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n\
                 log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} %-5p [%t:%C{{1}}@%L] - %m%n\n",
                d.join("zookeeper.log").display()
            ),
        )
    }

    fn write_node_config(&self, i: usize) -> io::Result<()> {
        let node = &self.nodes[i];
        let d = &node.dir;
        for sub in ["data", "tmp", "user_files", "format_schemas", "log"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        let mut shards_xml = String::new();
        for s in 1..=self.shards {
            shards_xml.push_str(
                "      <shard>\n        <internal_replication>true</internal_replication>\n",
            );
            for n in self.nodes.iter().filter(|n| n.shard == s) {
                shards_xml.push_str(&format!(
                    "        <replica><host>127.0.0.1</host><port>{}</port></replica>\n",
                    n.tcp
                ));
            }
            shards_xml.push_str("      </shard>\n");
        }
        let mut merge_tree = String::new();
        if let Some(w) = self.opts.dedup_window {
            merge_tree.push_str(&format!(
                "<replicated_deduplication_window>{w}</replicated_deduplication_window>"
            ));
        }
        if let Some(p) = self.opts.cleanup_delay_period {
            merge_tree.push_str(&format!(
                "<cleanup_delay_period>{p}</cleanup_delay_period>\
                 <cleanup_delay_period_random_add>0</cleanup_delay_period_random_add>"
            ));
        }
        let p = |sub: &str| d.join(sub).display().to_string() + "/";
        let https = match &self.opts.https {
            None => String::new(),
            Some(h) => format!(
                "<https_port>{port}</https_port>\n  <openSSL><server>\
                 <certificateFile>{cert}</certificateFile>\
                 <privateKeyFile>{key}</privateKeyFile>{verify}\
                 <loadDefaultCAFile>false</loadDefaultCAFile>\
                 <disableProtocols>sslv2,sslv3</disableProtocols></server></openSSL>",
                port = node.https,
                cert = h.cert.display(),
                key = h.key.display(),
                verify = match &h.client_ca {
                    Some(ca) => format!(
                        "<verificationMode>strict</verificationMode><caConfig>{}</caConfig>",
                        ca.display()
                    ),
                    None => "<verificationMode>none</verificationMode>".to_string(),
                }
            ),
        };
        let config = format!(
            r#"<?xml version="1.0"?>
<yandex>
  <logger>
    <level>{level}</level>
    <log>{log}</log>
    <errorlog>{errlog}</errorlog>
    <size>100M</size>
    <count>2</count>
  </logger>
  <display_name>{name}</display_name>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{http}</http_port>
  {https}
  <tcp_port>{tcp}</tcp_port>
  <interserver_http_port>{inter}</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>{path}</path>
  <tmp_path>{tmp}</tmp_path>
  <user_files_path>{user_files}</user_files_path>
  <format_schema_path>{schemas}</format_schema_path>
  <users_config>{users}</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>134217728</mark_cache_size>
  <uncompressed_cache_size>134217728</uncompressed_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
  <mlock_executable>false</mlock_executable>
  <merge_tree>{merge_tree}</merge_tree>
</yandex>
"#,
            level = self.opts.log_level,
            log = d.join("log/server.log").display(),
            errlog = d.join("log/server.err.log").display(),
            name = node.name(),
            http = node.http,
            tcp = node.tcp,
            inter = node.interserver,
            path = p("data"),
            tmp = p("tmp"),
            user_files = p("user_files"),
            schemas = p("format_schemas"),
            users = d.join("users.xml").display(),
        );
        std::fs::write(d.join("config.xml"), config)?;
        // The cluster's part: the file eventd ships, filled in (a single
        // server has none).
        std::fs::create_dir_all(d.join("config.d"))?;
        if self.single {
            return self.write_users(d);
        }
        let cluster = CLUSTER_XML
            .replace(
                "${ZOOKEEPER_NODES}",
                &format!(
                    "<node><host>127.0.0.1</host><port>{}</port></node>",
                    self.zk_port
                ),
            )
            .replace(
                "${SESSION_TIMEOUT_MS}",
                &self.opts.zk_session_timeout.as_millis().to_string(),
            )
            .replace("${SHARD}", &node.shard.to_string())
            .replace("${REPLICA}", &node.name())
            .replace("${CLUSTER}", &self.opts.cluster_name)
            .replace("${SHARDS}", shards_xml.trim_end());
        std::fs::write(d.join("config.d/cluster.xml"), cluster)?;
        self.write_users(d)
    }

    /// `users.xml`: `default` without a password, and `Options::users`.
    fn write_users(&self, d: &Path) -> io::Result<()> {
        let profile = match self.opts.remote_timeout {
            Some(t) => format!(
                "<receive_timeout>{s}</receive_timeout><send_timeout>{s}</send_timeout>",
                s = t.as_secs().max(1)
            ),
            None => String::new(),
        };
        let (mut profiles, mut users) = (String::new(), String::new());
        for u in &self.opts.users {
            let settings: String = u
                .settings
                .iter()
                .map(|(k, v)| format!("<{k}>{}</{k}>", xml_text(v)))
                .collect();
            profiles.push_str(&format!("<{n}>{profile}{settings}</{n}>", n = u.name));
            users.push_str(&format!(
                "\n    <{n}>\n      <password>{pw}</password>\n      \
                 <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>\n      \
                 <profile>{n}</profile>\n      <quota>default</quota>\n    </{n}>",
                n = u.name,
                pw = xml_text(&u.password)
            ));
        }
        std::fs::write(
            d.join("users.xml"),
            format!(
                r#"<?xml version="1.0"?>
<yandex>
  <profiles><default>{profile}</default>{profiles}</profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>{users}
  </users>
  <quotas><default></default></quotas>
</yandex>
"#
            ),
        )
    }

    // -------------------------------------------------------------- processes

    fn start_zookeeper_only(&mut self) -> Result<(), String> {
        let d = self.zk_dir();
        let out = std::fs::File::create(d.join("stdout.log")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bins.java);
        cmd.args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.admin.enableServer=false",
        ])
        .arg(format!(
            "-Dlog4j.configuration=file:{}",
            d.join("log4j.properties").display()
        ))
        .arg("-cp")
        .arg(&self.bins.zk_classpath)
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(d.join("zoo.cfg"))
        .current_dir(&d)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        let child = spawn(&mut cmd, self.opts.die_with_parent).map_err(|e| format!("java: {e}"))?;
        self.zk = Proc {
            child: Some(child),
            state: State::Running,
        };
        let port = self.zk_port;
        let mut exited = false;
        let ready = wait_until(self.opts.start_timeout, || {
            exited = self.zk.exited();
            exited || zk_four_letter(port, "srvr").is_ok_and(|s| s.contains("Mode:"))
        });
        if ready && !exited {
            return Ok(());
        }
        self.zk.kill();
        Err(format!(
            "ZooKeeper on port {port} {}:\n{}\n{}",
            if exited {
                "exited"
            } else {
                "did not answer srvr"
            },
            tail(&d.join("stdout.log"), 20),
            tail(&d.join("zookeeper.log"), 20)
        ))
    }

    fn spawn_node(&mut self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        let out = std::fs::File::create(node.dir.join("stdout.log")).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bins.clickhouse);
        if self.bins.clickhouse_multicall {
            cmd.arg("server");
        }
        cmd.arg(format!(
            "--config-file={}",
            node.dir.join("config.xml").display()
        ))
        .current_dir(&node.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
        let child = spawn(&mut cmd, self.opts.die_with_parent)
            .map_err(|e| format!("{}: {e}", self.bins.clickhouse.display()))?;
        self.nodes[i].proc = Proc {
            child: Some(child),
            state: State::Running,
        };
        Ok(())
    }

    /// Waits for `/ping`, then (if ZooKeeper runs) for the server to reach it.
    fn wait_node_ready(&mut self, i: usize) -> Result<(), String> {
        let url = self.nodes[i].url();
        let t = Duration::from_secs(2);
        let zk_up = self.zk.state == State::Running;
        let mut exited = false;
        let mut foreign = false;
        let node = &mut self.nodes[i];
        let pid = node.proc.pid().unwrap_or(0);
        let ok = wait_until(self.opts.start_timeout, || {
            exited = node.proc.exited();
            exited
                || (http("GET", &url, "/ping", b"", t).is_ok_and(|r| r.status == 200)
                    // Answered by this server, not by whatever else holds the port.
                    && {
                        foreign = !listens_on(pid, node.http);
                        !foreign
                    }
                    && (!zk_up
                        || http(
                            "POST",
                            &url,
                            "/",
                            b"SELECT count() FROM system.zookeeper WHERE path = '/'",
                            t,
                        )
                        .is_ok_and(|r| r.status == 200)))
        });
        if ok && !exited {
            return Ok(());
        }
        let name = node.name();
        let dir = node.dir.clone();
        node.proc.kill();
        Err(format!(
            "clickhouse-server {name} ({url}) {}:\n{}\n{}",
            if exited {
                "exited"
            } else if foreign {
                "not ready in time; its HTTP port answers from another process"
            } else {
                "not ready in time"
            },
            tail(&dir.join("stdout.log"), 10),
            tail(&dir.join("log/server.err.log"), 20)
        ))
    }

    fn index(&self, shard: usize, replica: usize) -> usize {
        assert!(
            (1..=self.shards).contains(&shard) && (1..=self.replicas).contains(&replica),
            "no server s{shard}r{replica} in a {}x{} cluster (numbered from 1)",
            self.shards,
            self.replicas
        );
        (shard - 1) * self.replicas + (replica - 1)
    }

    // ------------------------------------------------------------- accessors

    pub fn shards(&self) -> usize {
        self.shards
    }
    pub fn replicas(&self) -> usize {
        self.replicas
    }
    /// One server without ZooKeeper or a cluster ([`Cluster::start_single`]).
    pub fn is_single(&self) -> bool {
        self.single
    }
    /// The `<remote_servers>` name, for `ON CLUSTER` and `Distributed`.
    pub fn name(&self) -> &str {
        &self.opts.cluster_name
    }
    pub fn options(&self) -> &Options {
        &self.opts
    }
    /// The directory holding every server's config, data and logs.
    pub fn dir(&self) -> &Path {
        &self.root
    }
    /// `http://127.0.0.1:PORT` of one server.
    pub fn url(&self, shard: usize, replica: usize) -> String {
        self.nodes[self.index(shard, replica)].url()
    }
    /// The HTTPS port of one server (with `Options::https`).
    pub fn https_port(&self, shard: usize, replica: usize) -> u16 {
        self.nodes[self.index(shard, replica)].https
    }
    /// Every server's URL, shard by shard.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
    /// The `replica` macro of one server (`s1r2`).
    pub fn replica_name(&self, shard: usize, replica: usize) -> String {
        self.nodes[self.index(shard, replica)].name()
    }
    /// The native-protocol port (what `<remote_servers>` names).
    pub fn tcp_port(&self, shard: usize, replica: usize) -> u16 {
        self.nodes[self.index(shard, replica)].tcp
    }
    pub fn zookeeper_port(&self) -> u16 {
        self.zk_port
    }
    pub fn pid(&self, shard: usize, replica: usize) -> Option<u32> {
        self.nodes[self.index(shard, replica)].proc.pid()
    }
    pub fn zookeeper_pid(&self) -> Option<u32> {
        self.zk.pid()
    }
    /// The last `lines` of one server's log.
    pub fn log_tail(&self, shard: usize, replica: usize, lines: usize) -> String {
        tail(
            &self.nodes[self.index(shard, replica)]
                .dir
                .join("log/server.log"),
            lines,
        )
    }

    // ---------------------------------------------------------------- queries

    /// One request: `sql` in the URL when `body` is Some (an INSERT and its
    /// data), else as the POST body; `settings` as URL parameters.
    pub fn request(
        &self,
        url: &str,
        sql: &str,
        settings: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Response, ChError> {
        let mut target = String::from("/?");
        let mut params: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("{}={}", url_encode(k), url_encode(v)))
            .collect();
        let payload = match body {
            Some(b) => {
                params.push(format!("query={}", url_encode(sql)));
                b
            }
            None => sql.as_bytes(),
        };
        target.push_str(&params.join("&"));
        http("POST", url, &target, payload, timeout)
            .map_err(ChError::io)?
            .into_result()
    }

    /// Runs `sql`; panics on any error.
    pub fn query(&self, url: &str, sql: &str) -> String {
        match self.try_query(url, sql) {
            Ok(s) => s,
            Err(e) => panic!("{url}: {sql}\n=> {e}\n{}", self.server_state(url)),
        }
    }

    /// For a failure's message: which server `url` is, its pid, whether that
    /// process holds the port, and the tail of its error log.
    fn server_state(&self, url: &str) -> String {
        let Some(n) = self.nodes.iter().find(|n| n.url() == url) else {
            return String::new();
        };
        let pid = n.proc.pid();
        format!(
            "{} (pid {pid:?}, holds its HTTP port: {}), server.err.log:\n{}",
            n.name(),
            pid.is_some_and(|p| listens_on(p, n.http)),
            tail(&n.dir.join("log/server.err.log"), 20)
        )
    }

    pub fn try_query(&self, url: &str, sql: &str) -> Result<String, ChError> {
        self.query_with(url, sql, &[])
    }

    /// Runs `sql` with settings (`select_sequential_consistency`, …).
    pub fn query_with(
        &self,
        url: &str,
        sql: &str,
        settings: &[(&str, &str)],
    ) -> Result<String, ChError> {
        self.request(url, sql, settings, None, self.opts.http_timeout)
            .map(|r| r.text())
    }

    /// `sql` is `INSERT INTO t FORMAT RowBinary` (or any format), `body`
    /// the data. Ok means HTTP 200, which 18.16 also answers (with an empty
    /// body) when the block was a duplicate and nothing was written.
    pub fn insert(&self, url: &str, sql: &str, body: &[u8]) -> Result<(), ChError> {
        self.insert_with(url, sql, &[], body)
    }

    pub fn insert_with(
        &self,
        url: &str,
        sql: &str,
        settings: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), ChError> {
        self.request(url, sql, settings, Some(body), self.opts.http_timeout)
            .map(|_| ())
    }

    /// A one-value query parsed as u64 (`SELECT count() ...`); panics on error.
    pub fn count(&self, url: &str, sql: &str) -> u64 {
        let s = self.query(url, sql);
        s.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{sql}: not a number: {s:?}"))
    }

    /// Runs an `ON CLUSTER` statement on server s1r1 and checks every host
    /// reported status 0 (the answer is one TSV row per host: host, port,
    /// status, error, hosts remaining, hosts active).
    pub fn on_cluster(&self, sql: &str) -> String {
        let out = self.query(&self.url(1, 1), sql);
        for line in out.lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            assert!(
                cols.len() >= 4 && cols[2] == "0",
                "{sql}\n=> a host failed: {line}"
            );
        }
        out
    }

    /// Waits until no Replicated table on this server is read-only or holds
    /// an expired ZooKeeper session. A table is read-only until the server
    /// has a session (after a (re)start, or up to ~10 s after ZooKeeper
    /// comes back); but a table whose session died while ZooKeeper was
    /// down is not marked read-only until its restarting thread next looks,
    /// so `is_readonly` alone can read 0 just after ZooKeeper returns and
    /// the next insert still fails with code 225 (session expired).
    pub fn wait_writable(&self, shard: usize, replica: usize, timeout: Duration) -> bool {
        let url = self.url(shard, replica);
        wait_until(timeout, || {
            self.request(
                &url,
                "SELECT sum(is_readonly) + sum(is_session_expired) FROM system.replicas",
                &[],
                None,
                Duration::from_secs(2),
            )
            .is_ok_and(|r| r.text().trim() == "0")
        })
    }

    /// [`Cluster::wait_writable`] for every running (not stopped) server.
    pub fn wait_all_writable(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.nodes
            .iter()
            .filter(|n| n.proc.state == State::Running)
            .all(|n| {
                let left = deadline.saturating_duration_since(Instant::now());
                self.wait_writable(n.shard, n.replica, left)
            })
    }

    // ---------------------------------------------------------------- faults

    /// SIGSTOP one server and wait until the kernel shows it stopped. It
    /// keeps its sockets: connections to it are accepted and never answered,
    /// and it stays "active" for its replicas until its ZooKeeper session
    /// expires (`Options::zk_session_timeout`).
    pub fn sigstop(&mut self, shard: usize, replica: usize) {
        let i = self.index(shard, replica);
        let p = &mut self.nodes[i].proc;
        let pid = p.pid().expect("server is not running");
        p.signal(libc::SIGSTOP);
        assert!(
            wait_until(Duration::from_secs(5), || proc_state(pid) == Some('T')),
            "pid {pid} did not stop"
        );
        p.state = State::Stopped;
    }

    /// SIGCONT one server.
    pub fn sigcont(&mut self, shard: usize, replica: usize) {
        let i = self.index(shard, replica);
        let p = &mut self.nodes[i].proc;
        let pid = p.pid().expect("server is not running");
        p.signal(libc::SIGCONT);
        assert!(
            wait_until(Duration::from_secs(5), || proc_state(pid) != Some('T')),
            "pid {pid} did not continue"
        );
        p.state = State::Running;
    }

    /// SIGKILL one server and reap it.
    pub fn kill(&mut self, shard: usize, replica: usize) {
        let i = self.index(shard, replica);
        self.nodes[i].proc.kill();
    }

    /// SIGTERM one server (SIGKILL after 10 s) and reap it.
    pub fn stop(&mut self, shard: usize, replica: usize) {
        let i = self.index(shard, replica);
        self.nodes[i].proc.terminate(Duration::from_secs(10));
    }

    /// Starts one server again on its ports and data (stopping it first if
    /// it runs) and waits until it answers, reaches ZooKeeper and (if
    /// ZooKeeper runs) its Replicated tables are writable. Panics if not.
    pub fn restart(&mut self, shard: usize, replica: usize) {
        let i = self.index(shard, replica);
        if self.nodes[i].proc.child.is_some() {
            self.nodes[i].proc.terminate(Duration::from_secs(10));
        }
        let mut r = self.spawn_node(i).and_then(|_| self.wait_node_ready(i));
        // A replica SIGKILLed between writing a part and registering it in
        // ZooKeeper finds that part "unexpected" and, when it is most of a
        // small table, refuses to start. What an operator does then: the
        // force_restore_data flag (the server moves the parts aside and
        // fetches them from the other replica).
        if let Err(e) = &r {
            if e.contains("doesn't look like the set of parts in ZooKeeper") {
                eprintln!(
                    "s{shard}r{replica}: unexpected parts after the kill; force_restore_data"
                );
                let flags = self.nodes[i].dir.join("data/flags");
                let _ = std::fs::create_dir_all(&flags);
                let _ = std::fs::write(flags.join("force_restore_data"), b"");
                r = self.spawn_node(i).and_then(|_| self.wait_node_ready(i));
            }
        }
        if let Err(e) = r {
            panic!("restart: {e}");
        }
        if self.zk.state == State::Running {
            assert!(
                self.wait_writable(shard, replica, self.opts.start_timeout),
                "s{shard}r{replica}: Replicated tables still read-only after restart"
            );
        }
    }

    /// SIGTERM ZooKeeper (SIGKILL after 10 s). Replicated tables turn
    /// read-only at once; their data stays in ZooKeeper's data directory
    /// for [`Cluster::start_zookeeper`].
    pub fn stop_zookeeper(&mut self) {
        self.zk.terminate(Duration::from_secs(10));
    }

    /// Starts ZooKeeper again on its port and data and waits until every
    /// running server's Replicated tables are writable again. Panics if not.
    pub fn start_zookeeper(&mut self) {
        if self.zk.child.is_some() {
            return;
        }
        if let Err(e) = self.start_zookeeper_only() {
            panic!("start_zookeeper: {e}");
        }
        assert!(
            self.wait_all_writable(self.opts.start_timeout),
            "Replicated tables still read-only after ZooKeeper came back"
        );
    }
}

/// Sends a ZooKeeper four-letter word (3.8 allows only `srvr` unless
/// `4lw.commands.whitelist` says more; this module's zoo.cfg adds `ruok`
/// and `mntr`) and returns the answer.
pub fn zk_four_letter(port: u16, word: &str) -> io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(word.as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Servers first, all at once (each takes about half a second to
        // exit on SIGTERM), then ZooKeeper.
        for n in &self.nodes {
            n.proc.signal(libc::SIGCONT);
            n.proc.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for n in &mut self.nodes {
            let left = deadline.saturating_duration_since(Instant::now());
            if !wait_until(left, || n.proc.exited()) {
                n.proc.kill();
            }
            n.proc.child = None;
        }
        self.zk.terminate(Duration::from_secs(5));
        if let Some(dir) = self.dir.take() {
            if self.opts.keep_dir {
                let kept = dir.keep();
                eprintln!("cluster directory kept: {}", kept.display());
            }
        }
    }
}
