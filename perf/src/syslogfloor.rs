//! The floor of the syslog comparison: the least a daemon that stores each
//! message as an indexed, queryable SQLite row can do per message, run in
//! this process on the same machine beside the same sender.
//!
//! Two threads. One receives with eventd's own `recvmmsg` loop (up to 64
//! datagrams per call, with their SCM_CREDENTIALS), parses each message
//! with eventd's parser and builds the event eventd would store
//! (`record::stored_event`: the same columns and fields text, the
//! sender's `/proc` facts looked up in the same cache); it hands
//! the rows to the other through a std channel. The other inserts them into
//! one shard database (eventd's schema, pragmas, page size and insert
//! statement), one transaction per 1000 rows or, like eventd's writers,
//! whatever came within 1 ms of a smaller batch. There are no rings,
//! drains, receipts or gap accounting, and nothing received survives a
//! crash before its commit: what eventd does on top of this is what its
//! guarantees cost.

use anyhow::Context;
use eventd::rings::format::{Geometry, PAGE_SIZE_DEFAULT, RING_BYTES_DEFAULT};
use eventd::syslog::record::{stored_event, Sender, Transport};
use eventd::syslog::{parse::parse, recvmmsg, SyslogStats};
use eventd::trusted::{Senders, Trusted};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const ROWS_PER_COMMIT: usize = 1000;

pub struct Floor {
    socket: PathBuf,
    stored: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// Written at stop: wakes the receiver's wait (as eventd's listener's).
    wake: OwnedFd,
    receiver: Option<std::thread::JoinHandle<()>>,
    writer: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
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
        // SAFETY: eventfd has no memory preconditions; the result is
        // checked before it is owned.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let conn = eventd::store::open_shard(&eventd::store::shard_path(dir, 0))?;
        let stored = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let receiver = {
            let (stop, wake_fd) = (stop.clone(), wake.as_raw_fd());
            std::thread::Builder::new()
                .name("floor-receive".into())
                .spawn(move || receive(&s, wake_fd, &tx, &stop))?
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
            wake,
            receiver: Some(receiver),
            writer: Some(writer),
        })
    }
}

impl crate::running::Running for Floor {
    fn pid(&self) -> Option<u32> {
        None
    }

    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn stored(&mut self) -> anyhow::Result<u64> {
        Ok(self.stored.load(Ordering::Relaxed))
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let one = 1u64;
        // SAFETY: writes the 8 bytes of `one` to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        // The receiver ends first; its sender's drop ends the writer.
        let panicked = || anyhow::anyhow!("a floor thread panicked");
        if let Some(t) = self.receiver.take() {
            t.join().map_err(|_| panicked())?;
        }
        match self.writer.take() {
            Some(t) => t.join().map_err(|_| panicked())?,
            None => Ok(()),
        }
    }
}

/// One row, owned, until its transaction.
struct Row {
    ts: i64,
    seq: i64,
    pid: i64,
    tid: i64,
    uid: i64,
    level: i64,
    provider: String,
    name: String,
    message: String,
    fields: String,
}

fn receive(
    s: &UnixDatagram,
    wake_fd: std::os::fd::RawFd,
    tx: &std::sync::mpsc::Sender<Row>,
    stop: &AtomicBool,
) {
    // The record size of eventd's default rings bounds an event the same way.
    let max = Geometry::for_ring_bytes(RING_BYTES_DEFAULT, PAGE_SIZE_DEFAULT)
        .map_or(usize::MAX, |g| g.payload_bytes_max());
    let stats = SyslogStats::default();
    let senders = Senders::default();
    let mut fields = Vec::new();
    let mut seq = 0i64;
    recvmmsg::run(
        s.as_raw_fd(),
        wake_fd,
        &mut |bytes, len, creds| {
            let parsed = parse(bytes);
            let info = creds.and_then(|c| senders.lookup(c.pid, c.uid, c.gid));
            let sender = Sender {
                credentials: creds,
                trusted: Trusted::of(info.as_deref()),
            };
            let Some(e) = stored_event(
                &parsed,
                bytes,
                len,
                sender,
                Transport::Datagram,
                max,
                &mut fields,
            ) else {
                return;
            };
            seq += 1;
            // A writer gone (it failed) is reported by its join.
            let _ = tx.send(Row {
                ts: e.ts_ns,
                seq,
                pid: e.pid.into(),
                tid: e.tid.into(),
                uid: e.uid.into(),
                level: e.level as i64,
                provider: e.provider.to_string(),
                name: e.name.to_string(),
                message: e.message.to_string(),
                fields: e.fields.to_string(),
            });
        },
        &stats,
        stop,
    );
}

fn write(
    mut conn: rusqlite::Connection,
    rx: &std::sync::mpsc::Receiver<Row>,
    stored: &AtomicU64,
) -> anyhow::Result<()> {
    let mut rows = Vec::with_capacity(2 * ROWS_PER_COMMIT);
    let take = |rows: &mut Vec<Row>| {
        while rows.len() < ROWS_PER_COMMIT {
            match rx.try_recv() {
                Ok(more) => rows.push(more),
                Err(_) => break,
            }
        }
    };
    while let Ok(first) = rx.recv() {
        rows.push(first);
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
        let mut insert = tx.prepare_cached(eventd::store::rows::INSERT_EVENT)?;
        for r in rows.iter() {
            insert.execute(rusqlite::params![
                r.ts, 0, r.seq, 1, r.pid, r.tid, r.uid, r.level, r.provider, r.name, r.message,
                r.fields
            ])?;
        }
    }
    tx.commit()?;
    stored.fetch_add(rows.len() as u64, Ordering::Relaxed);
    rows.clear();
    Ok(())
}
