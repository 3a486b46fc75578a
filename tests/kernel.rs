//! The kernel log against the real `/dev/kmsg` and the real daemon: the
//! tests write their own tagged records into the kernel's log (root only;
//! skipped, saying why, otherwise) and look for them in the store. They do
//! not depend on what else the kernel logs meanwhile: what they check is
//! that every kernel sequence number eventd passed is stored once or
//! counted in a gap, whatever records those are.
#![cfg(not(loom))]

mod common;

use common::*;
use rand::Rng;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const KERNEL_CPU: i64 = (1 << 20) + 1;

/// The kernel's log is one for the whole host: the tests take turns, so
/// that one's flood does not overwrite another's records.
static KMSG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: /dev/kmsg cannot be written".into());
    }
    if let Err(e) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        return Some(format!("/dev/kmsg cannot be opened for writing: {e}"));
    }
    if let Err(e) = std::fs::File::open("/dev/kmsg") {
        return Some(format!("/dev/kmsg cannot be read: {e}"));
    }
    None
}

macro_rules! need_kmsg {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
        let _turn = KMSG.lock().unwrap_or_else(|p| p.into_inner());
    };
}

/// Writes records into the kernel's log, each on a fresh descriptor (the
/// kernel lets one descriptor write 10 records per 5 s, and drops the rest
/// in silence).
fn kmsg_write(records: &[String]) {
    for chunk in records.chunks(10) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .unwrap();
        for r in chunk {
            f.write_all(r.as_bytes()).unwrap();
        }
    }
}

fn tag() -> String {
    format!("eventd-test-{:08x}", rand::rng().random::<u32>())
}

/// The kernel's sequence number of the oldest record it still holds.
fn oldest_kernel_seq() -> u64 {
    use std::io::Read;
    let mut f = std::fs::File::open("/dev/kmsg").unwrap();
    let mut buf = vec![0u8; 16384];
    let n = f.read(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split(',').nth(1).unwrap().parse().unwrap()
}

fn kernel_config(dir: &Path) -> PathBuf {
    config(dir, "KernelLog = true\n")
}

/// A stored kernel record.
#[derive(Debug, Clone)]
struct KernelRow {
    ts: i64,
    level: i64,
    provider: String,
    name: String,
    pid: i64,
    uid: i64,
    message: String,
    fields: serde_json::Value,
}

/// Every event of eventd's kernel ring, by kernel sequence number (a list
/// per number: a number stored twice shows as two). eventd's own reports
/// of suppressed kernel records, written into that ring, are left out.
fn kernel_rows(data: &Path) -> BTreeMap<u64, Vec<KernelRow>> {
    let mut out: BTreeMap<u64, Vec<KernelRow>> = BTreeMap::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare(
                "SELECT ts, level, provider, name, pid, uid, message, fields FROM events \
                 WHERE cpu = ?1 AND name != 'rate_limit.suppressed'",
            )
            .unwrap();
        let rows = stmt
            .query_map([KERNEL_CPU], |r| {
                let fields: String = r.get(7)?;
                Ok(KernelRow {
                    ts: r.get(0)?,
                    level: r.get(1)?,
                    provider: r.get(2)?,
                    name: r.get(3)?,
                    pid: r.get(4)?,
                    uid: r.get(5)?,
                    message: r.get(6)?,
                    fields: serde_json::from_str(&fields).unwrap(),
                })
            })
            .unwrap();
        for row in rows {
            let row = row.unwrap();
            let seq = row.fields["kernel_seq"].as_u64().unwrap();
            out.entry(seq).or_default().push(row);
        }
    }
    out
}

/// The `lost` of every kernel gap row of `reason`: `kernel_overwritten`
/// (the kernel overwrote records before eventd read them) or `suppressed`
/// (the kernel source went past its rate limit). No other reason appears.
fn kernel_gaps(data: &Path, reason: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for (_, c) in shards(data) {
        let mut stmt = c
            .prepare("SELECT lost, reason FROM gaps WHERE cpu = ?1")
            .unwrap();
        let rows = stmt
            .query_map([KERNEL_CPU], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .unwrap();
        for row in rows {
            let (lost, why) = row.unwrap();
            assert!(
                why == "kernel_overwritten" || why == "suppressed",
                "kernel gap reason {why}"
            );
            if why == reason {
                out.push(lost as u64);
            }
        }
    }
    out
}

/// The stored rows whose message is `message`.
fn with_message(data: &Path, message: &str) -> Vec<KernelRow> {
    kernel_rows(data)
        .into_values()
        .flatten()
        .filter(|r| r.message == message)
        .collect()
}

fn wait_for_message(data: &Path, message: &str) {
    wait_until(&format!("{message:?} stored"), || {
        !with_message(data, message).is_empty()
    });
}

fn kernel_stats(data: &Path) -> serde_json::Value {
    eventctl_json(data, "stats")["stats"]["kernel"].clone()
}

/// Every kernel sequence number below eventd's next one is stored once or
/// counted in a gap, from 0 (the boot's first record) on: returns how
/// many were stored and how many counted lost.
fn accounted_from_boot(data: &Path) -> (u64, u64) {
    let next = kernel_stats(data)["next_seq"].as_u64().unwrap();
    let mut last = (0, 0);
    wait_until("every kernel record eventd passed to be committed", || {
        let rows = kernel_rows(data);
        let stored = rows.range(..next).count() as u64;
        let lost: u64 = kernel_gaps(data, "kernel_overwritten").iter().sum::<u64>()
            + kernel_gaps(data, "suppressed").iter().sum::<u64>();
        last = (stored, lost);
        stored + lost >= next
    });
    let rows = kernel_rows(data);
    for (seq, copies) in &rows {
        assert_eq!(
            copies.len(),
            1,
            "kernel record {seq} stored {} times",
            copies.len()
        );
    }
    assert_eq!(
        last.0 + last.1,
        next,
        "stored {} + lost {} != {next}",
        last.0,
        last.1
    );
    last
}

#[test]
fn a_kernel_record_is_stored_once_across_a_sigkill_and_the_backlog_once() {
    need_kmsg!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = kernel_config(dir.path());
    let tag = tag();
    let message = |what: &str| format!("{tag}: {what}");
    let written_at = eventd::rings::now_ns();
    kmsg_write(&[format!("<3>{}\n", message("before eventd started"))]);
    let eventd = Eventd::start(&data, Some(&config));
    wait_for_message(&data, &message("before eventd started"));
    let row = with_message(&data, &message("before eventd started")).remove(0);
    assert_eq!((row.level, row.provider.as_str()), (3, "kernel"));
    // Written by a program: the kernel gives it the user facility.
    assert_eq!((row.name.as_str(), row.pid, row.uid), ("user", 0, 0));
    assert_eq!(row.fields["transport"], "kernel");
    assert_eq!(row.fields["facility"], "user");
    assert!(row.fields["kernel_usec"].as_u64().unwrap() > 0);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(row.fields["boot_id"], boot.trim().replace('-', ""));
    // Its kernel timestamp on the wall clock: when it was written.
    let off = (row.ts - written_at).abs();
    assert!(off < 60_000_000_000, "ts {} is {off} ns off", row.ts);

    kmsg_write(&[format!("<3>{}\n", message("while eventd ran"))]);
    wait_for_message(&data, &message("while eventd ran"));
    eventd.kill();
    kmsg_write(&[format!("<3>{}\n", message("while eventd was down"))]);
    let eventd = Eventd::start(&data, Some(&config));
    kmsg_write(&[format!("<3>{}\n", message("after the restart"))]);
    wait_for_message(&data, &message("after the restart"));
    // A clean stop and a third start read the whole buffer again too.
    eventd.stop();
    let eventd = Eventd::start(&data, Some(&config));
    kmsg_write(&[format!("<4>{}\n", message("after the third start"))]);
    wait_for_message(&data, &message("after the third start"));
    for what in [
        "before eventd started",
        "while eventd ran",
        "while eventd was down",
        "after the restart",
        "after the third start",
    ] {
        let rows = with_message(&data, &message(what));
        assert_eq!(rows.len(), 1, "{what:?} stored {} times", rows.len());
    }
    assert_eq!(
        with_message(&data, &message("after the third start"))[0].level,
        4
    );
    // The backlog: every record since boot stored once, or counted lost
    // (the kernel's buffer may have wrapped before the first start).
    let (stored, lost) = accounted_from_boot(&data);
    eprintln!("kernel records since boot: {stored} stored, {lost} lost before eventd read them");
    let position = std::fs::read_to_string(data.join("run/kernel.seq")).unwrap();
    assert!(
        position.starts_with(&boot.trim().replace('-', "")),
        "{position}"
    );
    eventd.stop();
}

#[test]
fn records_overwritten_while_eventd_was_stopped_are_one_gap_row_with_the_exact_count() {
    need_kmsg!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = kernel_config(dir.path());
    let tag = tag();
    let eventd = Eventd::start(&data, Some(&config));
    kmsg_write(&[format!("<3>{tag}: before the stop\n")]);
    wait_for_message(&data, &format!("{tag}: before the stop"));
    // The first start's own gap, if the buffer had wrapped before it.
    accounted_from_boot(&data);
    let before = kernel_gaps(&data, "kernel_overwritten");
    eventd.stop();
    let next = std::fs::read_to_string(data.join("run/kernel.seq")).unwrap();
    let next: u64 = next.split_whitespace().nth(1).unwrap().parse().unwrap();
    // Several times the kernel's buffer while eventd is down (level debug:
    // not on the console). This wipes the host's older kernel log.
    eprintln!("note: this test overwrites the kernel's log buffer");
    let filler = "x".repeat(200);
    let flood: Vec<String> = (0..8000)
        .map(|i| format!("<7>{tag}: filler {i} {filler}\n"))
        .collect();
    kmsg_write(&flood);
    let oldest = oldest_kernel_seq();
    assert!(
        oldest > next,
        "the flood did not wrap the buffer ({oldest} <= {next})"
    );
    let eventd = Eventd::start(&data, Some(&config));
    kmsg_write(&[format!("<3>{tag}: after the restart\n")]);
    wait_for_message(&data, &format!("{tag}: after the restart"));
    let rows = kernel_rows(&data);
    let first_after = *rows.range(next..).next().unwrap().0;
    wait_until("the gap row", || {
        kernel_gaps(&data, "kernel_overwritten").len() > before.len()
    });
    let mut gaps = kernel_gaps(&data, "kernel_overwritten");
    for old in &before {
        let at = gaps.iter().position(|g| g == old).unwrap();
        gaps.remove(at);
    }
    assert_eq!(gaps, vec![first_after - next], "one row, the exact count");
    assert!(first_after >= oldest);
    accounted_from_boot(&data);
    let stats = kernel_stats(&data);
    assert_eq!(stats["lost"], first_after - next, "{stats}");
    eventd.stop();
}

#[test]
fn a_kernel_flood_does_not_starve_syslog_and_every_record_is_stored_or_counted() {
    need_kmsg!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = kernel_config(dir.path());
    let tag = tag();
    let eventd = Eventd::start(&data, Some(&config));
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (stop, tag) = (stop.clone(), tag.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<String> = (i..i + 100)
                    .map(|n| format!("<7>{tag}: flood {n}\n"))
                    .collect();
                kmsg_write(&batch);
                i += 100;
            }
            i
        })
    };
    // Syslog messages while the kernel floods: all of them are stored
    // while the flood goes on.
    let socket = data.join("run/syslog.sock");
    let sender = UnixDatagram::unbound().unwrap();
    for i in 0..2000 {
        let m = format!("<13>{tag}-syslog[1]: message {i}");
        while sender.send_to(m.as_bytes(), &socket).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let syslog_stored = || {
        shards(&data)
            .iter()
            .map(|(_, c)| {
                c.query_row(
                    "SELECT count(*) FROM events WHERE provider = ?1",
                    [format!("{tag}-syslog")],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap()
            })
            .sum::<i64>()
    };
    wait_until("every syslog message stored during the flood", || {
        syslog_stored() == 2000
    });
    assert!(!flooder.is_finished(), "the flood went on meanwhile");
    stop.store(true, Ordering::Relaxed);
    let written = flooder.join().unwrap();
    kmsg_write(&[format!("<3>{tag}: flood over\n")]);
    wait_for_message(&data, &format!("{tag}: flood over"));
    let (stored, lost) = accounted_from_boot(&data);
    let stats = kernel_stats(&data);
    eprintln!(
        "{written} flood records written; since boot {stored} stored, {lost} lost: {} \
         overwritten by the kernel first, in {} gap rows, {} suppressed; EPIPE {}",
        kernel_gaps(&data, "kernel_overwritten").iter().sum::<u64>(),
        kernel_gaps(&data, "kernel_overwritten").len(),
        kernel_gaps(&data, "suppressed").iter().sum::<u64>(),
        stats["epipe"]
    );
    eventd.stop();
}
