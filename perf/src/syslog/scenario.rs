//! The syslog comparison itself: the datagrams, each peer measured in turn, and
//! the versions reported.

use super::cpu::cpu_now;
use super::eventd_peer::{check_eventd, start_eventd};
use super::journald::{journal_count, start_journald};
use super::rsyslog::start_rsyslog;
use super::syslog_ng::{start_syslog_ng, syslog_ng_rows};
use super::{Peer, PeerRun};
use crate::running::Running;
use anyhow::{bail, Context};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Message bytes, as in the measured anchors (~92 B).
const MESSAGE_BYTES: usize = 92;
/// No progress for this long: the peer is done, whatever it stored.
const QUIET: Duration = Duration::from_secs(20);

/// Message `i`: RFC 3164 local form, as glibc's syslog(3) writes it.
pub(super) fn message(i: u64) -> Vec<u8> {
    let mut m = format!("<13>Nov 30 10:01:02 bench[4242]: message {i:07} ").into_bytes();
    while m.len() < MESSAGE_BYTES {
        m.push(b'a' + (m.len() % 26) as u8);
    }
    m
}

pub(super) fn version(peer: Peer, eventd: &Path, root: &Path) -> String {
    let first_line = |cmd: &mut Command| {
        cmd.output()
            .ok()
            .map(|o| {
                let text = if o.stdout.is_empty() {
                    o.stderr
                } else {
                    o.stdout
                };
                String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default()
    };
    match peer {
        Peer::Eventd => first_line(Command::new(eventd).arg("--version")),
        Peer::Floor => "this harness".to_string(),
        Peer::Rsyslog => first_line(Command::new("rsyslogd").arg("-v"))
            .split(" compiled")
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        Peer::Journald => first_line(Command::new("journalctl").arg("--version")),
        Peer::SyslogNg => first_line(
            Command::new(root.join("usr/sbin/syslog-ng"))
                .arg("--version")
                .env(
                    "LD_LIBRARY_PATH",
                    format!(
                        "{}:{}:{}",
                        root.join("usr/lib/x86_64-linux-gnu").display(),
                        root.join("usr/lib/syslog-ng").display(),
                        root.join("lib/x86_64-linux-gnu").display()
                    ),
                ),
        ),
    }
}

/// Sends N messages to `running`'s socket and watches its store: the time
/// is from the first send to the first look that finds all N stored (every
/// 50 ms, the same way for every peer).
/// What [`measure`] found: stored, seconds, the sender's seconds, CPU
/// seconds per million (the tree), and per stage.
struct Measured {
    stored: u64,
    seconds: f64,
    send_seconds: f64,
    cpu_s_per_million: Option<f64>,
    stages: Vec<(String, f64)>,
}

fn measure(peer: Peer, running: &mut dyn Running, n: u64) -> anyhow::Result<Measured> {
    let socket = running.socket();
    let before = cpu_now(running.pid());
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || -> anyhow::Result<f64> {
        let s = UnixDatagram::unbound()?;
        s.connect(&socket)
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let start = Instant::now();
        let _ = started_tx.send(start);
        for i in 0..n {
            s.send(&message(i))?;
        }
        Ok(start.elapsed().as_secs_f64())
    });
    let mut last = (0u64, Instant::now());
    let (stored, reached) = loop {
        std::thread::sleep(Duration::from_millis(50));
        let stored = running.stored()?;
        if stored >= n {
            break (stored, Instant::now());
        }
        if stored != last.0 {
            last = (stored, Instant::now());
        } else if last.1.elapsed() > QUIET && sender.is_finished() {
            eprintln!("{}: stored nothing new for {QUIET:?}", peer.name());
            break (stored, last.1);
        }
    };
    let after = cpu_now(running.pid());
    let send_seconds = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    let start = started_rx.recv().context("the sender did not start")?;
    let seconds = reached.saturating_duration_since(start).as_secs_f64();
    let per_million = |ns: u64| ns as f64 / 1e9 / (stored.max(1) as f64 / 1e6);
    let total = after
        .total_ns
        .zip(before.total_ns)
        .map(|(a, b)| per_million(a.saturating_sub(b)));
    let stages = after
        .stages
        .iter()
        .map(|(stage, ns)| {
            let was = before.stages.get(stage).copied().unwrap_or(0);
            (stage.clone(), per_million(ns.saturating_sub(was)))
        })
        .filter(|(_, s)| *s > 0.0)
        .collect();
    Ok(Measured {
        stored,
        seconds: seconds.max(1e-6),
        send_seconds,
        cpu_s_per_million: total,
        stages,
    })
}

/// `eventd_config`: a configuration file for eventd (default: the
/// embedded defaults with `RateLimitBurst = 0`).
pub fn run(
    peers: &[Peer],
    n: u64,
    work: &Path,
    eventd_binary: &Path,
    eventd_config: Option<&Path>,
) -> anyhow::Result<Vec<PeerRun>> {
    // The daemons get absolute paths (rsyslogd changes to /).
    let work = &std::fs::canonicalize(work).with_context(|| format!("{}", work.display()))?;
    let eventctl = eventd_binary.with_file_name("eventctl");
    let root = work.join("syslog-ng-root");
    let mut runs = Vec::new();
    for &peer in peers {
        let dir = work.join(format!("syslog-{}", peer.name()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        eprintln!("{}: starting", peer.name());
        let binary = (eventd_binary, eventd_config);
        let (mut running, stores_into) = start_peer(peer, &dir, binary, &root)?;
        let measured = measure(peer, running.as_mut(), n);
        let stopped = running.stop();
        let Measured {
            stored,
            seconds,
            send_seconds,
            cpu_s_per_million,
            stages,
        } = measured?;
        stopped?;
        let stored = count_stored(peer, &dir, &eventctl, n)?.unwrap_or(stored);
        let run = PeerRun {
            peer,
            version: version(peer, eventd_binary, &root),
            stores_into,
            sent: n,
            stored: stored.min(n),
            lost: n.saturating_sub(stored),
            seconds,
            stored_per_s: stored.min(n) as f64 / seconds,
            send_seconds,
            cpu_s_per_million,
            cpu_by_stage: if peer == Peer::Eventd {
                stages
            } else {
                Vec::new()
            },
        };
        print_run(&run);
        runs.push(run);
    }
    Ok(runs)
}

/// ` (syslog-dgram 1.20, drain 0.80, ...)`, or nothing.
pub fn stages_text(stages: &[(String, f64)]) -> String {
    if stages.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = stages.iter().map(|(s, c)| format!("{s} {c:.2}")).collect();
    format!(" ({})", parts.join(", "))
}

/// Starts `peer` in `dir`; returns it and what it stores into. `eventd`:
/// its binary and configuration file; `root`: where syslog-ng is
/// unpacked.
fn start_peer(
    peer: Peer,
    dir: &Path,
    (eventd_binary, eventd_config): (&Path, Option<&Path>),
    root: &Path,
) -> anyhow::Result<(Box<dyn Running>, &'static str)> {
    Ok(match peer {
        Peer::Eventd => (
            Box::new(start_eventd(eventd_binary, dir, eventd_config)?),
            "SQLite shards (indexed, queryable)",
        ),
        Peer::Floor => (
            Box::new(crate::syslogfloor::Floor::start(dir)?),
            "SQLite, a receiving and a writing thread, nothing else (the floor)",
        ),
        Peer::Rsyslog => (Box::new(start_rsyslog(dir)?), "flat file (omfile)"),
        Peer::Journald => (Box::new(start_journald(dir)?), "journal files"),
        Peer::SyslogNg => (
            Box::new(start_syslog_ng(dir, root)?),
            "SQLite (sql(), 1000-row batches)",
        ),
    })
}

/// What `peer` stored, counted in its store, for the peers whose own
/// count is not the one to trust (None: the measured count stands).
fn count_stored(peer: Peer, dir: &Path, eventctl: &Path, n: u64) -> anyhow::Result<Option<u64>> {
    Ok(match peer {
        Peer::Eventd => {
            let (rows, found) = check_eventd(&dir.join("data"), eventctl, n)?;
            if !found {
                bail!("eventd: a query did not find message {}", n / 2);
            }
            Some(rows)
        }
        Peer::Journald => Some(journal_count(dir)?),
        Peer::SyslogNg => Some(syslog_ng_rows(dir)?),
        Peer::Floor => {
            let c = rusqlite::Connection::open(eventd::store::shard_path(dir, 0))?;
            Some(c.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))? as u64)
        }
        Peer::Rsyslog => None,
    })
}

/// One peer's progress line.
fn print_run(run: &PeerRun) {
    eprintln!(
        "{}: {} of {} stored in {:.2} s ({:.0}/s), {} lost, {} CPU s per million{}",
        run.peer.name(),
        run.stored,
        run.sent,
        run.seconds,
        run.stored_per_s,
        run.lost,
        run.cpu_s_per_million
            .map_or("n/a".to_string(), |c| format!("{c:.2}")),
        stages_text(&run.cpu_by_stage)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_numbered_and_sized() {
        let m = message(41);
        assert_eq!(m.len(), MESSAGE_BYTES);
        let text = String::from_utf8(m).unwrap();
        assert!(text.starts_with("<13>Nov 30 10:01:02 bench[4242]: message 0000041 "));
        let parsed = eventd::syslog::parse::parse(text.as_bytes());
        assert_eq!(parsed.app_name.as_deref(), Some("bench"));
        assert_eq!(parsed.message.split_whitespace().nth(1), Some("0000041"));
    }
}
