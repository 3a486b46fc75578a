//! The floor of the syslog comparison: the least a daemon that stores each
//! message as an indexed, queryable SQLite row can do per message, run in
//! this process on the same machine beside the same sender.
//!
//! Two threads. One takes up to 64 datagrams per `recvmmsg` with their
//! SCM_CREDENTIALS, parses each with eventd's parser and builds the row
//! eventd would store (the same fields text); it hands each call's rows to
//! the other through a std channel. The other inserts them into one shard
//! database (eventd's schema, pragmas, page size and insert statement),
//! one transaction per 1000 rows or, like eventd's writers, whatever came
//! within 1 ms of a smaller batch. There are
//! no rings, drains, receipts or gap accounting, and nothing received
//! survives a crash before its commit: what eventd does on top of this is
//! what its guarantees cost.

use anyhow::Context;
use eventd::syslog::parse::{facility_name, parse};
use eventd::syslog::record::control_messages;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const BATCH: usize = 64;
const DATAGRAM_BYTES: usize = 16 << 10;
const CONTROL_BYTES: usize = 64;
const ROWS_PER_COMMIT: usize = 1000;

pub struct Floor {
    socket: PathBuf,
    stored: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Floor {
    pub fn start(dir: &Path) -> anyhow::Result<Floor> {
        let socket = dir.join("floor.sock");
        let s = UnixDatagram::bind(&socket).with_context(|| format!("{}", socket.display()))?;
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads an int of the length given.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("SO_PASSCRED");
        }
        // Wakes the receiver at stop without a message.
        s.set_read_timeout(Some(std::time::Duration::from_millis(100)))?;
        let conn = eventd::store::open_shard(&eventd::store::shard_path(dir, 0))?;
        let stored = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let receiver = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("floor-receive".into())
                .spawn(move || receive(s, &tx, &stop))?
        };
        let writer = {
            let stored = stored.clone();
            std::thread::Builder::new()
                .name("floor-write".into())
                .spawn(move || write(conn, &rx, &stored))?
        };
        Ok(Floor {
            socket,
            stored,
            stop,
            threads: vec![receiver, writer],
        })
    }
}

impl crate::syslogbench::Running for Floor {
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        Ok(self.stored.load(Ordering::Relaxed))
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        // The receiver ends first; its sender's drop ends the writer.
        for t in self.threads.drain(..) {
            t.join()
                .map_err(|_| anyhow::anyhow!("a floor thread panicked"))??;
        }
        Ok(())
    }
}

/// One row, owned, until its transaction.
struct Row {
    ts: i64,
    seq: i64,
    pid: i64,
    uid: i64,
    level: i64,
    provider: String,
    name: &'static str,
    message: String,
    fields: String,
}

fn receive(
    s: UnixDatagram,
    tx: &std::sync::mpsc::Sender<Vec<Row>>,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut data = vec![0u8; BATCH * DATAGRAM_BYTES];
    let mut control = vec![0u8; BATCH * CONTROL_BYTES];
    let mut seq = 0i64;
    loop {
        let base = data.as_mut_ptr();
        let mut iovecs: Vec<libc::iovec> = (0..BATCH)
            .map(|i| libc::iovec {
                // SAFETY: inside `data` (BATCH slots of DATAGRAM_BYTES).
                iov_base: unsafe { base.add(i * DATAGRAM_BYTES) }.cast(),
                iov_len: DATAGRAM_BYTES,
            })
            .collect();
        // SAFETY: mmsghdr is plain data; all-zero is a valid value.
        let mut headers: Vec<libc::mmsghdr> =
            (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (i, h) in headers.iter_mut().enumerate() {
            h.msg_hdr.msg_iov = &mut iovecs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = control[i * CONTROL_BYTES..].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CONTROL_BYTES as _;
        }
        // Waits for one datagram (the socket's read timeout bounds the
        // wait, for the stop flag) and takes what else is queued.
        // SAFETY: every header points into `data`/`control`, alive and
        // sized as declared for the call.
        let n = unsafe {
            libc::recvmmsg(
                s.as_raw_fd(),
                headers.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            continue;
        }
        let now = eventd::rings::now_ns();
        let mut rows = Vec::with_capacity(n as usize);
        for (i, h) in headers.iter().take(n as usize).enumerate() {
            let len = (h.msg_len as usize).min(DATAGRAM_BYTES);
            let bytes = &data[i * DATAGRAM_BYTES..i * DATAGRAM_BYTES + len];
            #[allow(clippy::unnecessary_cast)]
            let control_len = (h.msg_hdr.msg_controllen as usize).min(CONTROL_BYTES);
            let creds =
                control_messages(&control[i * CONTROL_BYTES..i * CONTROL_BYTES + control_len]);
            let p = parse(bytes);
            let mut fields = serde_json::Map::new();
            fields.insert("transport".into(), "dgram".into());
            fields.insert("format".into(), "rfc3164".into());
            fields.insert("facility".into(), facility_name(p.facility).into());
            fields.insert("gid".into(), creds.map_or(0, |c| c.gid).into());
            for (key, value) in [
                ("hostname", &p.hostname),
                ("procid", &p.procid),
                ("timestamp", &p.timestamp),
            ] {
                if let Some(v) = value {
                    fields.insert(key.into(), v.to_string().into());
                }
            }
            seq += 1;
            rows.push(Row {
                ts: now + seq,
                seq,
                pid: creds.map_or(0, |c| c.pid as i64),
                uid: creds.map_or(0, |c| c.uid as i64),
                level: p.severity as i64,
                provider: p.app_name.as_deref().unwrap_or("").to_string(),
                name: facility_name(p.facility),
                message: p.message.to_string(),
                fields: serde_json::Value::Object(fields).to_string(),
            });
        }
        tx.send(rows)?;
    }
}

fn write(
    mut conn: rusqlite::Connection,
    rx: &std::sync::mpsc::Receiver<Vec<Row>>,
    stored: &AtomicU64,
) -> anyhow::Result<()> {
    let mut rows = Vec::with_capacity(2 * ROWS_PER_COMMIT);
    let take = |rows: &mut Vec<Row>| {
        while rows.len() < ROWS_PER_COMMIT {
            match rx.try_recv() {
                Ok(more) => rows.extend(more),
                Err(_) => break,
            }
        }
    };
    while let Ok(first) = rx.recv() {
        rows.extend(first);
        take(&mut rows);
        if rows.len() < ROWS_PER_COMMIT {
            // As eventd's writers do: a small batch waits 1 ms for more.
            std::thread::sleep(std::time::Duration::from_millis(1));
            take(&mut rows);
        }
        commit(&mut conn, &mut rows, stored)?;
    }
    Ok(())
}

fn commit(
    conn: &mut rusqlite::Connection,
    rows: &mut Vec<Row>,
    stored: &AtomicU64,
) -> anyhow::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(eventd::store::writer::INSERT_EVENT)?;
        for r in rows.iter() {
            insert.execute(rusqlite::params![
                r.ts, 0, r.seq, 1, r.pid, r.pid, r.uid, r.level, r.provider, r.name, r.message,
                r.fields
            ])?;
        }
    }
    tx.commit()?;
    stored.fetch_add(rows.len() as u64, Ordering::Relaxed);
    rows.clear();
    Ok(())
}
