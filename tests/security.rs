//! Who may read and write what, and what eventd does with files it finds
//! damaged or does not trust, with the real `eventd` and `eventctl`
//! binaries, real users (uid 65534 with and without group 4242, a group
//! that does not exist on the machine, so nothing in /etc/group changes)
//! and real damage to real shard files.
//!
//! The bugs these tests guard against: files whose mode followed the
//! operator's umask (0777 directories and 0666 shards under `umask 000`),
//! so that any local user read every event or wrote into the rings; a
//! database dropped into the store by another user whose receipts steered
//! recovery past every new event; a shard file emptied while eventd was
//! stopped and silently made anew in place; a shard file damaged while
//! eventd ran that the writer kept committing into, where queries could no
//! longer find what it held; and a shard file removed while eventd ran
//! whose name the writer used again for its next file, where SQLite took
//! the removed file's WAL for the new file's.
//!
//! The tests that switch users or give files to group 4242 need root (as
//! CI runs them): run by another user, they say so and return.
#![cfg(not(loom))]

use rusqlite::{Connection, OpenFlags};
use std::collections::{BTreeMap, HashMap};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The unprivileged user of these tests (nobody).
const NOBODY: u32 = 65534;
/// A group id no group on the machine has: `QueryGroup = "4242"` grants
/// exactly the processes given it as a supplementary group.
const GROUP: u32 = 4242;

/// Whether the test runs as root; if not, it says it was skipped.
fn root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("{test}: needs root (it switches users and groups); skipped");
    }
    root
}

/// A temporary directory other users may pass through, as any parent of a
/// real data directory lets them (tempdir makes it 0700).
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Makes `cmd` start with a umask of 000, as if an operator's shell had it.
fn with_umask_000(cmd: &mut Command) -> &mut Command {
    // SAFETY: umask is async-signal-safe and only changes the child, between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    }
}

/// Starts eventd under a umask of 000.
fn start_under_umask_000(data: &Path, cfg: &Path) -> Eventd {
    let (mut cmd, log) = command(data, Some(cfg), &[]);
    with_umask_000(&mut cmd);
    Eventd::spawn(cmd, log, data)
}

/// The permission bits (set-id and sticky bits included), group and owner
/// of `path` itself (a symlink is not followed).
fn mode_of(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.mode() & 0o7777, m.gid(), m.uid())
}

/// Each of `want` (path, mode bits, group if one is wanted) whose mode or
/// group differs, or that is missing, said in one line.
fn wrong_modes(want: &[(PathBuf, u32, Option<u32>)]) -> Vec<String> {
    want.iter()
        .filter_map(|(path, bits, gid)| {
            let wanted = format!(
                "{bits:04o}{}",
                gid.map_or(String::new(), |g| format!(" gid {g}"))
            );
            let Ok(m) = std::fs::symlink_metadata(path) else {
                return Some(format!("{}: missing, wanted {wanted}", path.display()));
            };
            let (have, have_gid) = (m.mode() & 0o7777, m.gid());
            let ok = have == *bits && gid.is_none_or(|g| g == have_gid);
            (!ok).then(|| {
                format!(
                    "{}: {have:04o} gid {have_gid}, wanted {wanted}",
                    path.display()
                )
            })
        })
        .collect()
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Opens `path` for reading from a thread running as `uid` (primary group
/// `uid` too) with exactly the supplementary `groups`. Raw system calls,
/// not libc's wrappers (which change the credentials of every thread of the
/// process): only this short-lived thread changes users.
fn open_as(uid: u32, groups: &[u32], path: &Path) -> std::io::Result<()> {
    let groups = groups.to_vec();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: plain system calls with integer arguments and a valid
        // array of `groups.len()` group ids; they change this thread's
        // credentials only, and the thread ends after the open.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        std::fs::File::open(&path).map(drop)
    })
    .join()
    .unwrap()
}

/// `eventctl --data-dir DATA ARGS...` run as `uid` with exactly `groups`.
fn eventctl_as(data: &Path, uid: u32, groups: &[u32], args: &[&str]) -> Output {
    let mut cmd = Command::new(EVENTCTL);
    cmd.arg("--data-dir").arg(data).args(args);
    as_user(&mut cmd, uid, groups);
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The events `eventctl query --output json ARGS...` prints (run as root;
/// it must succeed), and what it wrote to stderr (its warnings).
fn query(data: &Path, args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(["query", "--output", "json"])
        .args(args)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "eventctl query {args:?}: {stderr}");
    let events = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("gap").is_none())
        .collect();
    (events, stderr)
}

/// How often each message appears among `events`.
fn message_counts(events: &[serde_json::Value]) -> HashMap<String, u32> {
    let mut counts = HashMap::new();
    for e in events {
        *counts
            .entry(e["message"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    counts
}

/// Sends every message of `messages` through one `eventctl emit --stdin`.
fn emit_all(data: &Path, provider: &str, messages: &[String]) {
    let mut e = Emitter::spawn(data, provider);
    for m in messages {
        e.send(m);
    }
    e.finish();
}

fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The shard files (`*.db`) in the store, sorted.
fn db_files(data: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(data.join("store"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect();
    paths.sort();
    paths
}

fn side(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// What can still be read of a shard file that may be damaged: its events
/// as (ring_epoch, cpu, seq, message) and its gaps as (ring_epoch, cpu,
/// from_seq, to_seq), each list up to the first row SQLite cannot read.
type Readable = (Vec<(i64, i64, i64, String)>, Vec<(i64, i64, i64, i64)>);

fn readable(path: &Path) -> Readable {
    let mut events = Vec::new();
    let mut gaps = Vec::new();
    let Ok(c) = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return (events, gaps);
    };
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    if let Ok(mut stmt) = c.prepare("SELECT ring_epoch, cpu, seq, message FROM events") {
        if let Ok(rows) = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))) {
            events.extend(rows.map_while(Result::ok));
        }
    }
    if let Ok(mut stmt) = c.prepare("SELECT ring_epoch, cpu, from_seq, to_seq FROM gaps") {
        if let Ok(rows) = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))) {
            gaps.extend(rows.map_while(Result::ok));
        }
    }
    (events, gaps)
}

/// A range of sequence numbers stored in a file (an event is one number).
type SeqRange = (i64, i64, PathBuf);

/// Over what can be read of every shard file: no sequence number of a
/// ring is stored twice (as two events, two gaps, or an event inside a
/// gap). Returns how often each message was found.
fn check_nothing_stored_twice(data: &Path) -> HashMap<String, u32> {
    // Per (ring epoch, cpu): each stored range of sequence numbers and its file.
    let mut ranges: BTreeMap<(i64, i64), Vec<SeqRange>> = BTreeMap::new();
    let mut messages = HashMap::new();
    for path in db_files(data) {
        let (events, gaps) = readable(&path);
        for (epoch, cpu, seq, message) in events {
            ranges
                .entry((epoch, cpu))
                .or_default()
                .push((seq, seq, path.clone()));
            *messages.entry(message).or_insert(0) += 1;
        }
        for (epoch, cpu, from, to) in gaps {
            ranges
                .entry((epoch, cpu))
                .or_default()
                .push((from, to, path.clone()));
        }
    }
    for ((epoch, cpu), mut list) in ranges {
        list.sort();
        for w in list.windows(2) {
            assert!(
                w[1].0 > w[0].1,
                "ring {epoch:x} cpu {cpu}: {}..={} ({}) and {}..={} ({}) overlap",
                w[0].0,
                w[0].1,
                w[0].2.display(),
                w[1].0,
                w[1].1,
                w[1].2.display()
            );
        }
    }
    messages
}

/// Emits events in rounds of 2,000 until checkpoints have moved most of
/// them from the WAL into the database file `shard` itself (at least 1 MiB
/// of it), stopping after a round whose commits ended in a checkpoint (the
/// file grew): the WAL then holds a few dozen pages, far from the next
/// checkpoint. What was emitted, once stored.
fn fill_until_checkpointed(data: &Path, shard: &Path) -> Vec<String> {
    let mut emitted = Vec::new();
    let mut len = std::fs::metadata(shard).unwrap().len();
    for round in 0..30 {
        let m = numbered(&format!("before-{round}"), 2000);
        emit_all(data, "before", &m);
        emitted.extend(m);
        wait_for_events(data, emitted.len() as u64);
        let grown = std::fs::metadata(shard).unwrap().len();
        if grown > len && grown >= 1 << 20 {
            return emitted;
        }
        len = grown;
    }
    panic!("{} bytes after {} events", len, emitted.len());
}

/// Emits one event every 50 ms (at most 20 s) until `path` exists: what
/// was emitted.
fn emit_until_exists(data: &Path, prefix: &str, path: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut emitted = Vec::new();
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} not made after {} more events",
            path.display(),
            emitted.len()
        );
        let m = format!("{prefix}-{}", emitted.len());
        emit_one(data, &m);
        emitted.push(m);
        std::thread::sleep(Duration::from_millis(50));
    }
    emitted
}

/// Runs `eventd` with `text` as its configuration, expecting it to refuse
/// to start: its log, after checking the exit status is 1.
fn refused(dir: &Path, data: &Path, text: &str) -> String {
    let cfg = config(dir, text);
    let (cmd, log) = command(data, Some(&cfg), &[]);
    let (status, log) = exit_at_start(cmd, &log);
    assert_eq!(status.code(), Some(1), "{text}\n{log}");
    log
}

#[test]
fn every_path_gets_its_mode_and_group_whatever_the_umask() {
    if !root("modes") {
        return;
    }
    // ProducerGroup follows QueryGroup when it is not set.
    for (text, group) in [
        ("QueryGroup = \"4242\"\n", Some(GROUP)),
        ("QueryGroup = \"\"\nProducerGroup = \"\"\n", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let cfg = config(dir.path(), text);
        let eventd = start_under_umask_000(&data, &cfg);
        emit_one(&data, "modes");
        wait_for_events(&data, 1);
        // A group grant gives the group bits; no grant gives none.
        let g = |grouped: u32, private: u32| if group.is_some() { grouped } else { private };
        let mut want: Vec<(PathBuf, u32, Option<u32>)> = vec![
            (data.clone(), 0o755, None),
            (data.join("run"), 0o755, None),
            (data.join("kmes"), g(0o750, 0o700), group),
            (data.join("store"), g(0o2750, 0o700), group),
            (data.join("kmes/syslog.ring"), 0o600, None),
            (data.join("run/query.sock"), g(0o660, 0o600), group),
            (data.join("run/syslog.sock"), 0o666, None),
            (data.join("run/syslog-stream.sock"), 0o666, None),
            (data.join("store/.eventd.lock"), 0o600, None),
            (data.join("kmes/.eventd.lock"), 0o600, None),
            (data.join("run/eventd.pid"), 0o644, None),
        ];
        for cpu in eventd::rings::online_cpus() {
            let ring = data.join(format!("kmes/cpu-{cpu:03}.ring"));
            want.push((ring, g(0o660, 0o600), group));
        }
        let shards = db_files(&data);
        assert!(!shards.is_empty());
        for db in shards {
            // Every writer has its database open in WAL mode by now.
            for suffix in ["", "-wal", "-shm"] {
                want.push((side(&db, suffix), g(0o640, 0o600), group));
            }
        }
        let wrong = wrong_modes(&want);
        assert!(
            wrong.is_empty(),
            "{text}under umask 000:\n{}",
            wrong.join("\n")
        );
        eventd.stop();
    }
}

#[test]
fn an_unprivileged_user_reads_and_emits_nothing_but_may_log() {
    if !root("unprivileged") {
        return;
    }
    let dir = open_tempdir();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "QueryGroup = \"4242\"\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_one(&data, "for root and the group only");
    wait_for_events(&data, 1);
    let shard = db_files(&data)
        .into_iter()
        .find(|p| side(p, "-wal").exists())
        .expect("a shard with its WAL");
    let cpu = eventd::rings::online_cpus()[0];
    for path in [
        shard.clone(),
        side(&shard, "-wal"),
        data.join(format!("kmes/cpu-{cpu:03}.ring")),
        data.join("kmes/syslog.ring"),
    ] {
        let opened = open_as(NOBODY, &[], &path);
        assert_eq!(
            opened.as_ref().map_err(|e| e.raw_os_error()),
            Err(Some(libc::EACCES)),
            "uid {NOBODY} opening {}: {opened:?}",
            path.display()
        );
    }

    // Through eventctl: refused, and told what would grant it.
    let out = eventctl_as(&data, NOBODY, &[], &["query"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "query as nobody: {err}");
    assert!(err.contains("QueryGroup"), "{err}");
    assert!(!err.contains("--offline"), "{err}");
    let out = eventctl_as(&data, NOBODY, &[], &["query", "--offline"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "offline query as nobody: {err}");
    assert!(
        !text(&out.stdout).contains("for root and the group only"),
        "{err}"
    );
    let out = eventctl_as(
        &data,
        NOBODY,
        &[],
        &["emit", "--provider", "nobody", "not allowed"],
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "emit as nobody: {err}");
    assert!(err.contains("ProducerGroup"), "{err}");

    // Every local user may log through the syslog socket, under its own uid.
    let mut logger = Command::new("logger");
    logger
        .arg("--socket")
        .arg(data.join("run/syslog.sock"))
        .args(["-t", "nobodytest", "hello from nobody"]);
    as_nobody(&mut logger);
    let out = logger.output().unwrap();
    assert!(out.status.success(), "logger: {}", text(&out.stderr));
    wait_until("nobody's syslog message", || {
        !query(&data, &["--provider", "nobodytest"]).0.is_empty()
    });
    let (events, _) = query(&data, &["--provider", "nobodytest"]);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["message"], "hello from nobody");
    assert_eq!(events[0]["uid"], NOBODY, "{:?}", events[0]);
    // Nothing nobody tried through the rings arrived.
    assert!(query(&data, &["--provider", "nobody"]).0.is_empty());
    eventd.stop();
}

#[test]
fn a_member_of_the_query_group_emits_and_queries() {
    if !root("member") {
        return;
    }
    let dir = open_tempdir();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "QueryGroup = \"4242\"\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    let member = [GROUP];
    let out = eventctl_as(
        &data,
        NOBODY,
        &member,
        &["emit", "--provider", "member", "from a member of 4242"],
    );
    assert!(out.status.success(), "emit: {}", text(&out.stderr));

    // The query socket admits it by the groups the kernel reports for it.
    let found = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = eventctl_as(&data, NOBODY, &member, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["provider"] == "member")
            .collect()
    };
    wait_until("the member's event", || {
        !found(&["query", "--output", "json"]).is_empty()
    });
    let online = found(&["query", "--output", "json"]);
    assert_eq!(online.len(), 1, "{online:?}");
    assert_eq!(online[0]["message"], "from a member of 4242");
    assert_eq!(online[0]["uid"], NOBODY);
    // The shard files grant it the same.
    let offline = found(&["query", "--offline", "--output", "json"]);
    assert_eq!(offline, online);

    // What the files themselves allow the member: the shards and its rings,
    // never eventd's own syslog ring.
    let shard = db_files(&data)
        .into_iter()
        .find(|p| side(p, "-wal").exists())
        .expect("a shard with its WAL");
    let cpu = eventd::rings::online_cpus()[0];
    for path in [
        shard.clone(),
        side(&shard, "-wal"),
        data.join(format!("kmes/cpu-{cpu:03}.ring")),
    ] {
        open_as(NOBODY, &member, &path)
            .unwrap_or_else(|e| panic!("member opening {}: {e}", path.display()));
    }
    let syslog = open_as(NOBODY, &member, &data.join("kmes/syslog.ring"));
    assert_eq!(
        syslog.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EACCES))
    );
    eventd.stop();
}

#[test]
fn a_producer_grant_reaching_beyond_the_query_grant_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Everyone may emit (and so read the rings), only group 4242 may query.
    let log = refused(
        dir.path(),
        &data,
        "QueryGroup = \"4242\"\nProducerGroup = \"*\"\n",
    );
    assert!(
        log.contains("ProducerGroup = \"*\"") && log.contains("QueryGroup = \"4242\""),
        "{log}"
    );
    assert!(!data.exists(), "nothing may be made before the refusal");
}

#[test]
fn directories_and_sockets_that_overlap_are_refused_naming_both_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = refused(
        dir.path(),
        &data,
        "StoreDir = \"same\"\nKmesDir = \"same\"\n",
    );
    assert!(
        log.contains("StoreDir") && log.contains("KmesDir") && log.contains("same"),
        "{log}"
    );
    assert!(!data.exists(), "nothing may be made before the refusal");

    let socket = data.join("store/log.sock");
    let log = refused(
        dir.path(),
        &data,
        &format!("SyslogSocket = {:?}\n", socket.display().to_string()),
    );
    assert!(
        log.contains("SyslogSocket") && log.contains("StoreDir"),
        "{log}"
    );
    assert!(!data.exists(), "nothing may be made before the refusal");

    // The same directory under two names (a symbolic link) is found by
    // identity once the directories exist.
    let kmes = dir.path().join("rings");
    std::fs::create_dir(&kmes).unwrap();
    let link = dir.path().join("link-to-rings");
    std::os::unix::fs::symlink(&kmes, &link).unwrap();
    let log = refused(
        dir.path(),
        &data,
        &format!(
            "KmesDir = {:?}\nStoreDir = {:?}\n",
            kmes.display().to_string(),
            link.display().to_string()
        ),
    );
    assert!(log.contains("StoreDir") && log.contains("KmesDir"), "{log}");
    assert_eq!(
        std::fs::read_dir(&kmes).unwrap().count(),
        0,
        "no ring or lock made in the shared directory"
    );
}

#[test]
fn wrong_modes_left_by_an_earlier_run_are_mended_at_start() {
    if !root("mended") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "QueryGroup = \"4242\"\n");
    let eventd = start_under_umask_000(&data, &cfg);
    emit_one(&data, "before the mending");
    wait_for_events(&data, 1);
    eventd.stop();
    // What an eventd that followed a umask of 000 would have left, in a
    // store whose group was lost (copied back by root, say).
    for d in ["", "run", "store", "kmes"] {
        chmod(&data.join(d), 0o777);
    }
    chown(&data.join("store"), 0, 0);
    let shards = db_files(&data);
    for db in &shards {
        chmod(db, 0o666);
        chown(db, 0, 0);
    }
    let cpus = eventd::rings::online_cpus();
    let rings: Vec<PathBuf> = cpus
        .iter()
        .map(|cpu| data.join(format!("kmes/cpu-{cpu:03}.ring")))
        .collect();
    for ring in &rings {
        chmod(ring, 0o666);
    }
    let syslog_ring = data.join("kmes/syslog.ring");
    if syslog_ring.exists() {
        chmod(&syslog_ring, 0o666);
    }

    let eventd = Eventd::start(&data, Some(&cfg));
    let log = read(&eventd.log);
    let mut want: Vec<(PathBuf, &str, u32, Option<u32>)> = vec![
        (data.clone(), "0777", 0o755, None),
        (data.join("run"), "0777", 0o755, None),
        (data.join("store"), "0777", 0o2750, Some(GROUP)),
        (data.join("kmes"), "0777", 0o750, Some(GROUP)),
        (data.join("kmes/syslog.ring"), "0666", 0o600, None),
    ];
    for db in &shards {
        want.push((db.clone(), "0666", 0o640, Some(GROUP)));
    }
    for ring in &rings {
        want.push((ring.clone(), "0666", 0o660, Some(GROUP)));
    }
    let modes: Vec<(PathBuf, u32, Option<u32>)> = want
        .iter()
        .map(|(path, _, bits, gid)| (path.clone(), *bits, *gid))
        .collect();
    let wrong = wrong_modes(&modes);
    assert!(wrong.is_empty(), "not mended:\n{}\n{log}", wrong.join("\n"));
    for (path, from, bits, gid) in &want {
        let said = format!("mode set path={} from={from}", path.display());
        let to = format!(
            "to={bits:04o}{}",
            gid.map_or(String::new(), |g| format!(" gid {g}"))
        );
        assert!(
            log.lines().any(|l| l.contains(&said) && l.contains(&to)),
            "no line with {said:?} and {to:?}:\n{log}"
        );
    }
    // The mended files are the same files, with what they held.
    let (events, _) = query(&data, &["--grep", "before the mending"]);
    assert_eq!(events.len(), 1, "{events:?}");
    eventd.stop();
}

#[test]
fn a_stray_database_of_another_user_cannot_steer_recovery() {
    if !root("stray database") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "StorageShards = 1\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_one(&data, "before the stray");
    wait_for_events(&data, 1);
    let stats = eventctl_json(&data, "stats");
    eventd.stop();

    // A copy of a real shard, emptied, whose receipts claim that every ring
    // of this daemon was committed through sequence 1,000,000,000 and is to
    // be read on from a ticket far ahead: believed, it would make every
    // drain skip everything emitted from now on.
    let stray = data.join("store/stray.db");
    std::fs::copy(data.join("store/shard-000.db"), &stray).unwrap();
    {
        let c = Connection::open(&stray).unwrap();
        c.execute_batch("DELETE FROM events; DELETE FROM gaps; DELETE FROM receipts;")
            .unwrap();
        let far_position: i64 = 1_000_000 << 24;
        for ring in stats["stats"]["rings"].as_array().unwrap() {
            let epoch = u64::from_str_radix(ring["epoch"].as_str().unwrap(), 16).unwrap() as i64;
            c.execute(
                "INSERT INTO receipts (ring_epoch, cpu, first_seq, last_seq, position, \
                 next_seq, committed_through, committed_at) \
                 VALUES (?1, ?2, 1, 1000000000, ?3, 1000000001, 1000000000, 1)",
                rusqlite::params![epoch, ring["cpu"].as_i64().unwrap(), far_position],
            )
            .unwrap();
        }
    }
    assert!(!side(&stray, "-wal").exists());
    chown(&stray, NOBODY, NOBODY);
    let before = std::fs::read(&stray).unwrap();

    let eventd = Eventd::start(&data, Some(&cfg));
    let after = numbered("after the stray", 20);
    emit_all(&data, "after", &after);
    wait_until("the events emitted after the restart", || {
        query(&data, &["--provider", "after"]).0.len() >= after.len()
    });
    let (events, _) = query(&data, &["--provider", "after"]);
    let counts = message_counts(&events);
    for m in &after {
        assert_eq!(counts.get(m), Some(&1), "{m}");
    }
    let log = read(&eventd.log);
    assert!(
        log.lines().any(|l| l.contains("stray.db")
            && l.contains("receipts left out of recovery")
            && l.contains("not trusted")),
        "{log}"
    );
    assert!(!log.contains("resume_seq=1000000001"), "{log}");
    eventd.stop();
    assert_eq!(std::fs::read(&stray).unwrap(), before, "stray.db changed");
    assert_eq!(mode_of(&stray).2, NOBODY);
}

#[test]
fn a_ring_file_of_another_user_or_a_symlink_is_moved_aside_and_made_anew() {
    if !root("foreign ring") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "QueryGroup = \"4242\"\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    eventd.stop();
    let cpus = eventd::rings::online_cpus();
    let ring = |cpu: u32| data.join(format!("kmes/cpu-{cpu:03}.ring"));
    // The first CPU's ring is given to nobody; the second's (if there is a
    // second CPU) is replaced by a symlink to a ring file elsewhere.
    chown(&ring(cpus[0]), NOBODY, NOBODY);
    let foreign = std::fs::read(ring(cpus[0])).unwrap();
    let elsewhere = dir.path().join("elsewhere.ring");
    if let Some(&second) = cpus.get(1) {
        std::fs::rename(ring(second), &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, ring(second)).unwrap();
    }
    let elsewhere_before = std::fs::read(&elsewhere).ok();

    let eventd = Eventd::start(&data, Some(&cfg));
    let log = read(&eventd.log);
    let aside = |cpu: u32| data.join(format!("kmes/cpu-{cpu:03}.ring.bad"));
    // Nobody's file is kept as it was, beside a new ring of eventd's own.
    assert!(
        log.lines().any(|l| l.contains("moved aside")
            && l.contains(&aside(cpus[0]).display().to_string())),
        "{log}"
    );
    assert_eq!(std::fs::read(aside(cpus[0])).unwrap(), foreign);
    assert_eq!(mode_of(&aside(cpus[0])).2, NOBODY);
    assert_eq!(mode_of(&ring(cpus[0])), (0o660, GROUP, 0));
    if let Some(&second) = cpus.get(1) {
        assert!(
            std::fs::symlink_metadata(aside(second))
                .unwrap()
                .file_type()
                .is_symlink(),
            "the symlink itself is moved aside\n{log}"
        );
        assert_eq!(mode_of(&ring(second)), (0o660, GROUP, 0));
        assert_eq!(
            std::fs::read(&elsewhere).ok(),
            elsewhere_before,
            "the symlink's target was written"
        );
    }
    let messages = numbered("into a new ring", 10);
    emit_all(&data, "new-ring", &messages);
    wait_until("the events", || {
        query(&data, &["--provider", "new-ring"]).0.len() >= messages.len()
    });
    let counts = message_counts(&query(&data, &["--provider", "new-ring"]).0);
    assert!(
        messages.iter().all(|m| counts.get(m) == Some(&1)),
        "{counts:?}"
    );
    eventd.stop();
}

#[test]
fn shards_damaged_while_stopped_are_kept_as_they_are_and_their_shards_move_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "StorageShards = 2\n");
    let eventd = Eventd::start(&data, Some(&cfg));
    emit_all(&data, "before", &numbered("before the damage", 100));
    wait_for_events(&data, 100);
    eventd.stop();

    // shard-000.db emptied as a careless tool would (its WAL and shared
    // memory gone too); shard-001.db lost its events table.
    let store = data.join("store");
    let (zero, dropped) = (store.join("shard-000.db"), store.join("shard-001.db"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&zero)
        .unwrap()
        .set_len(0)
        .unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(side(&zero, suffix));
    }
    Connection::open(&dropped)
        .unwrap()
        .execute_batch("DROP TABLE events")
        .unwrap();
    let dropped_bytes = std::fs::read(&dropped).unwrap();

    let started = eventd::rings::now_ns();
    let eventd = Eventd::start(&data, Some(&cfg));
    let log = read(&eventd.log);
    let next = |j: usize| store.join(format!("shard-{j:03}-g2.db"));
    for (old, new, why) in [
        (&zero, next(0), "no eventd schema"),
        (&dropped, next(1), "events table"),
    ] {
        assert!(
            log.lines().any(|l| l.contains(&old.display().to_string())
                && l.contains(&new.display().to_string())
                && l.contains(why)),
            "{} should move on to {} ({why}):\n{log}",
            old.display(),
            new.display()
        );
    }

    // What eventd says about them.
    let stats = eventctl_json(&data, "stats");
    let damaged = stats["stats"]["damaged_shard_files"].as_array().unwrap();
    for (old, new, why) in [
        (&zero, next(0), "no eventd schema"),
        (&dropped, next(1), "events table"),
    ] {
        let d = damaged
            .iter()
            .find(|d| d["path"].as_str() == Some(&old.display().to_string()))
            .unwrap_or_else(|| panic!("{} not listed: {stats}", old.display()));
        assert_eq!(d["replaced_by"].as_str(), Some(&*new.display().to_string()));
        assert!(d["reason"].as_str().unwrap().contains(why), "{d}");
        assert!(d["found_at"].as_i64().unwrap() >= started, "{d}");
    }
    let paths: Vec<&str> = stats["stats"]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap())
        .collect();
    let want = [next(0).display().to_string(), next(1).display().to_string()];
    assert_eq!(paths, want, "{stats}");
    let shards = eventctl_json(&data, "shards");
    for s in shards["shards"].as_array().unwrap() {
        let path = s["path"].as_str().unwrap();
        let old = path == zero.display().to_string() || path == dropped.display().to_string();
        assert_eq!(s["damaged"], old, "{s}");
        assert_eq!(s["active"], !old, "{s}");
    }

    // New events go to the new files, each once, and every answer warns of
    // the damaged files.
    let after = numbered("after the damage", 300);
    emit_all(&data, "after", &after);
    wait_until("the new events", || {
        let in_new: u64 = [next(0), next(1)]
            .iter()
            .map(|p| {
                Connection::open_with_flags(p, OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .unwrap()
                    .query_row(
                        "SELECT count(*) FROM events WHERE provider = 'after'",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .unwrap() as u64
            })
            .sum();
        in_new >= after.len() as u64
    });
    let (events, warnings) = query(&data, &["--provider", "after"]);
    let counts = message_counts(&events);
    assert_eq!(counts.len(), after.len());
    assert!(
        after.iter().all(|m| counts.get(m) == Some(&1)),
        "{counts:?}"
    );
    for old in [&zero, &dropped] {
        assert!(
            warnings.lines().any(|l| l.contains("warning")
                && l.contains(&old.display().to_string())
                && l.contains("damaged")),
            "{warnings}"
        );
    }
    let messages = check_nothing_stored_twice(&data);
    assert!(after.iter().all(|m| messages.get(m) == Some(&1)));
    eventd.stop();

    // Left byte for byte.
    assert_eq!(std::fs::metadata(&zero).unwrap().len(), 0);
    assert_eq!(std::fs::read(&dropped).unwrap(), dropped_bytes);
}

#[test]
fn a_shard_damaged_while_running_is_left_and_collection_goes_on_in_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No query indexes: the garbage below must land on pages a plain query
    // reads (the events table and its time index), not on an index only a
    // provider or name filter would read.
    let cfg = config(dir.path(), "StorageShards = 1\nQueryIndexes = []\n");
    let mut eventd = Eventd::start(&data, Some(&cfg));
    let shard = data.join("store/shard-000.db");
    let next = data.join("store/shard-000-g2.db");

    let before = fill_until_checkpointed(&data, &shard);
    let len = std::fs::metadata(&shard).unwrap().len();

    // Garbage over a few hundred KiB in the middle, past the header page.
    let from = 64u64 << 10;
    let to = (len - (64 << 10)).min(from + (512 << 10));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap();
    f.seek(SeekFrom::Start(from)).unwrap();
    f.write_all(&b"garbage!".repeat(((to - from) / 8) as usize))
        .unwrap();
    f.sync_all().unwrap();
    drop(f);
    let damaged_at = Instant::now();

    // A query meets the damage (and reports it), then events keep coming.
    let (_, warnings) = query(&data, &[]);
    assert!(
        warnings.contains(&shard.display().to_string()),
        "the query did not meet the damage: {warnings}"
    );
    let during = numbered("while noticing", 2000);
    emit_all(&data, "during", &during);
    wait_until("the shard's next file", || next.exists());
    let noticed_after = damaged_at.elapsed();
    // The line follows the new file by a moment (its indexes come first).
    wait_until("the move logged", || {
        read(&eventd.log).lines().any(|l| {
            l.contains("this shard's events go to a new file")
                && l.contains(&shard.display().to_string())
                && l.contains(&next.display().to_string())
        })
    });

    // Every event emitted from now on is found once, in the new file.
    let after = numbered("after noticing", 2000);
    emit_all(&data, "after", &after);
    wait_until("the events after the damage was noticed", || {
        let (events, _) = readable(&next);
        events
            .iter()
            .filter(|e| e.3.starts_with("after noticing"))
            .count()
            >= after.len()
    });
    let (events, warnings) = query(&data, &["--provider", "after"]);
    let counts = message_counts(&events);
    assert_eq!(counts.len(), after.len(), "{warnings}");
    assert!(
        after.iter().all(|m| counts.get(m) == Some(&1)),
        "{counts:?}"
    );
    assert!(
        warnings
            .lines()
            .any(|l| l.contains(&shard.display().to_string())
                && l.contains("damaged")
                && l.contains(&next.display().to_string())),
        "{warnings}"
    );
    let stats = eventctl_json(&data, "stats");
    let damaged = stats["stats"]["damaged_shard_files"].as_array().unwrap();
    assert!(
        damaged
            .iter()
            .any(|d| d["path"].as_str() == Some(&shard.display().to_string())
                && d["replaced_by"].as_str() == Some(&next.display().to_string())),
        "{stats}"
    );
    assert_eq!(
        stats["stats"]["shards"][0]["path"].as_str(),
        Some(&*next.display().to_string())
    );

    // Over what can be read: nothing stored twice, nothing emitted while the
    // damage was being noticed stored twice either.
    let messages = check_nothing_stored_twice(&data);
    assert!(after.iter().all(|m| messages.get(m) == Some(&1)));
    assert!(during
        .iter()
        .chain(&before)
        .all(|m| messages.get(m).is_none_or(|&n| n == 1)));
    assert!(eventd.running(), "eventd died:\n{}", read(&eventd.log));
    eprintln!(
        "damage noticed {noticed_after:?} after it was written; {} events before it, {} of \
         those still readable, {} of the {} emitted while noticing readable",
        before.len(),
        before.iter().filter(|m| messages.contains_key(*m)).count(),
        during.iter().filter(|m| messages.contains_key(*m)).count(),
        during.len()
    );
    eventd.stop();
}

#[test]
fn a_shard_file_cut_or_removed_while_running_is_given_up_for_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "StorageShards = 1\n");
    let mut eventd = Eventd::start(&data, Some(&cfg));
    let store = data.join("store");
    let generation = |g: u32| {
        if g == 1 {
            store.join("shard-000.db")
        } else {
            store.join(format!("shard-000-g{g}.db"))
        }
    };
    let before = fill_until_checkpointed(&data, &generation(1));
    // The new file is made before the line is logged (its indexes and
    // time map come first): the line may follow the file by a moment.
    let log_line = |file: &Path, why: &str, next: &Path| {
        let logged = |log: &str| {
            log.lines().any(|l| {
                l.contains("this shard's events go to a new file")
                    && l.contains(&format!("shard={}", file.display()))
                    && l.contains(why)
                    && l.contains(&format!("new_file={}", next.display()))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !logged(&read(&eventd.log)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = read(&eventd.log);
        assert!(
            logged(&log),
            "{} should have moved on to {} ({why}):\n{log}",
            file.display(),
            next.display()
        );
    };

    // Cut to half its length: the writer sees the file shorter than its
    // header says after its next commit.
    std::thread::sleep(Duration::from_millis(200));
    let half = std::fs::metadata(generation(1)).unwrap().len() / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(generation(1))
        .unwrap()
        .set_len(half)
        .unwrap();
    let cut = Instant::now();
    let noticing_cut = emit_until_exists(&data, "noticing the cut", &generation(2));
    let cut_noticed = cut.elapsed();
    log_line(&generation(1), "cut to", &generation(2));
    let in_second = numbered("in the second file", 500);
    emit_all(&data, "second", &in_second);
    wait_until("the second file's events", || {
        readable(&generation(2))
            .0
            .iter()
            .filter(|e| e.3.starts_with("in the second file"))
            .count()
            >= in_second.len()
    });

    // Its database file removed (its WAL and shared memory left, as `rm`
    // of one name leaves them): the next file is a third one, never the
    // removed one's name again, whose WAL would be taken for the new file's.
    std::fs::remove_file(generation(2)).unwrap();
    let removed = Instant::now();
    let noticing_removal = emit_until_exists(&data, "noticing the removal", &generation(3));
    let removal_noticed = removed.elapsed();
    log_line(&generation(2), "gone", &generation(3));
    assert!(!generation(2).exists(), "the removed file was made again");
    let in_third = numbered("in the third file", 500);
    emit_all(&data, "third", &in_third);
    wait_until("the third file's events", || {
        readable(&generation(3))
            .0
            .iter()
            .filter(|e| e.3.starts_with("in the third file"))
            .count()
            >= in_third.len()
    });

    // What eventd says now: two files given up, each pointing at the next,
    // and the third active and not damaged.
    let (events, warnings) = query(&data, &["--provider", "third"]);
    let counts = message_counts(&events);
    assert_eq!(counts.len(), in_third.len(), "{warnings}");
    assert!(in_third.iter().all(|m| counts.get(m) == Some(&1)));
    for (g, next) in [(1, 2), (2, 3)] {
        let (file, next) = (generation(g), generation(next));
        assert!(
            warnings
                .lines()
                .any(|l| l.contains(&format!("{} is damaged", file.display()))
                    && l.contains(&format!("writes {} instead", next.display()))),
            "{warnings}"
        );
    }
    let stats = eventctl_json(&data, "stats");
    let active = generation(3).display().to_string();
    assert_eq!(stats["stats"]["shards"][0]["path"].as_str(), Some(&*active));
    let damaged: Vec<(&str, &str)> = stats["stats"]["damaged_shard_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap(),
                d["replaced_by"].as_str().unwrap(),
            )
        })
        .collect();
    let (first, second) = (
        generation(1).display().to_string(),
        generation(2).display().to_string(),
    );
    assert_eq!(
        damaged,
        [(&*first, &*second), (&*second, &*active)],
        "{stats}"
    );
    let shards = eventctl_json(&data, "shards");
    let listed = shards["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"].as_str() == Some(&*active))
        .cloned()
        .unwrap_or_else(|| panic!("{shards}"));
    assert_eq!(
        (&listed["active"], &listed["damaged"]),
        (&true.into(), &false.into())
    );

    // Nothing is stored twice in what can be read, and everything emitted
    // since the last file was given up is found (what the removed file
    // held went with it).
    let messages = check_nothing_stored_twice(&data);
    assert!(in_third.iter().all(|m| messages.get(m) == Some(&1)));
    assert!(!in_second.iter().any(|m| messages.contains_key(m)));
    assert!(before
        .iter()
        .chain(&noticing_cut)
        .chain(&noticing_removal)
        .all(|m| messages.get(m).is_none_or(|&n| n == 1)));
    assert!(eventd.running(), "eventd died:\n{}", read(&eventd.log));
    eprintln!(
        "cut noticed after {cut_noticed:?} ({} events), removal after {removal_noticed:?} ({} \
         events)",
        noticing_cut.len(),
        noticing_removal.len()
    );
    eventd.stop();
    assert_eq!(std::fs::metadata(generation(1)).unwrap().len(), half);
}

#[test]
fn a_damaged_shard_is_never_written_again_even_after_its_successor_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path(), "StorageShards = 1\n");
    let store = data.join("store");
    let (first, second) = (store.join("shard-000.db"), store.join("shard-000-g2.db"));
    let eventd = Eventd::start(&data, Some(&cfg));
    fill_until_checkpointed(&data, &first);
    // Scribbled in the middle: the quick check at open would not see it
    // (the right edges of the b-trees are intact), only a reader does. In
    // the middle of the events' pages, which the query below reads all of
    // (the gaps table, near the start, is not read: the daemon knows this
    // file has no gap row).
    std::thread::sleep(Duration::from_millis(200));
    {
        use std::io::{Seek, SeekFrom, Write};
        let middle = (std::fs::metadata(&first).unwrap().len() / 2) & !((32 << 10) - 1);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&first)
            .unwrap();
        f.seek(SeekFrom::Start(middle)).unwrap();
        f.write_all(&vec![0xA5; 128 << 10]).unwrap();
    }
    let _ = query(&data, &[]);
    emit_until_exists(&data, "after the scribble", &second);
    eventd.stop();
    let marker = store.join("shard-000.db.damaged");
    assert!(
        std::fs::read_to_string(&marker).is_ok_and(|t| t.contains("corrupt")),
        "the damage is recorded beside the file"
    );
    let damaged_bytes = std::fs::read(&first).unwrap();

    // The successor vanishes while eventd is stopped: the next start must
    // not go back to the damaged file, whose quick check would pass.
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(side(&second, suffix));
    }
    let eventd = Eventd::start(&data, Some(&cfg));
    let stats = eventctl_json(&data, "stats");
    let active = PathBuf::from(stats["stats"]["shards"][0]["path"].as_str().unwrap());
    assert_ne!(active, first, "the damaged file is written again");
    emit_all(&data, "later", &numbered("later", 50));
    wait_until("the later events in a new file", || {
        readable(&active)
            .0
            .iter()
            .filter(|e| e.3.starts_with("later"))
            .count()
            >= 50
    });
    let damaged = stats["stats"]["damaged_shard_files"].as_array().unwrap();
    assert!(
        damaged
            .iter()
            .any(|d| d["path"] == first.display().to_string()
                && d["reason"].as_str().unwrap().contains("corrupt")),
        "{stats}"
    );
    eventd.stop();
    assert_eq!(
        std::fs::read(&first).unwrap(),
        damaged_bytes,
        "written again"
    );
}

/// Gap rows a `query --output json ARGS...` prints: (reason, lost).
fn query_gaps(data: &Path, args: &[&str]) -> Vec<(String, u64)> {
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(data)
        .args(["query", "--output", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| {
            let g = v.get("gap")?;
            Some((g["reason"].as_str()?.to_string(), g["lost"].as_u64()?))
        })
        .collect()
}

/// Historical shard files (written by an earlier configuration with more
/// shards) damaged while eventd was stopped: one cut to half its length,
/// one emptied. Both are named as damaged in the log, `eventctl shards` and
/// `eventctl stats`, and never written again. What they lost is counted
/// once and shows in queries: the cut file held events of a ring still in
/// use, which the drains read again (the rows the file still gives up are
/// not stored twice, the rest is stored again from the ring); the emptied
/// file held events of a ring that is gone (its file was removed), which
/// only its manifest can count: a `damaged` gap row with exactly that many.
#[test]
fn damaged_historical_shards_are_named_and_what_they_lost_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = data.join("store");
    let four = config(dir.path(), "StorageShards = 4\n");
    let two = dir.path().join("two.toml");
    std::fs::write(&two, "StorageShards = 2\n").unwrap();
    let stripes = ["--stripe-len", "16"];
    let eventd = Eventd::start_with(&data, Some(&four), &stripes);
    // Each CPU's ring owns two of the four shards (R4): cpu 0 writes
    // shards 0 and 2, cpu 1 shards 1 and 3.
    let sent: Vec<Vec<String>> = (0..2)
        .map(|cpu| numbered(&format!("before the damage on {cpu}"), 1_000))
        .collect();
    for (cpu, messages) in sent.iter().enumerate() {
        let mut cmd = Command::new(EVENTCTL);
        pin(&mut cmd, cpu);
        let mut child = cmd
            .arg("--data-dir")
            .arg(&data)
            .args(["emit", "--provider", "before", "--stdin"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for m in messages {
            writeln!(stdin, "{m}").unwrap();
        }
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }
    wait_for_events(&data, 2_000);
    eventd.stop();
    let (cut, emptied) = (store.join("shard-002.db"), store.join("shard-003.db"));
    let held = |p: &Path| {
        Connection::open_with_flags(p, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap()
            .query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
            .unwrap() as u64
    };
    let (cut_held, emptied_held) = (held(&cut), held(&emptied));
    assert!(
        cut_held > 0 && emptied_held > 0,
        "{cut_held} {emptied_held}"
    );
    assert!(
        std::fs::read_to_string(side(&emptied, ".manifest")).is_ok(),
        "a manifest beside the file"
    );
    // cpu 1's ring goes (an operator's cleanup): its next ring has a new
    // epoch, and the events of the old one that were only in the emptied
    // file can be read back from nowhere.
    std::fs::remove_file(data.join("kmes/cpu-001.ring")).unwrap();
    let len = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&emptied)
        .unwrap()
        .set_len(0)
        .unwrap();
    for p in [&cut, &emptied] {
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(side(p, suffix));
        }
    }
    let cut_bytes = std::fs::read(&cut).unwrap();

    let eventd = Eventd::start_with(&data, Some(&two), &stripes);
    let log = read(&eventd.log);
    for p in [&cut, &emptied] {
        assert!(
            log.lines().any(|l| l.contains("ERROR")
                && l.contains("damaged")
                && l.contains(&p.display().to_string())),
            "{} not named as damaged:\n{log}",
            p.display()
        );
    }
    let stats = eventctl_json(&data, "stats");
    let listed = stats["stats"]["damaged_shard_files"].as_array().unwrap();
    let shards = eventctl_json(&data, "shards");
    for p in [&cut, &emptied] {
        let name = p.display().to_string();
        assert!(
            listed.iter().any(|d| d["path"].as_str() == Some(&name)),
            "{name} not in stats: {stats}"
        );
        let s = shards["shards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["path"].as_str() == Some(&name))
            .unwrap_or_else(|| panic!("{name} not in shards: {shards}"));
        assert_eq!(s["damaged"], true, "{s}");
    }
    // cpu 0's events: every one once, from what the cut file still holds
    // and what the drain read again from the ring.
    wait_until("cpu 0's events, stored again", || {
        let (events, _) = query(&data, &["--provider", "before", "--cpu", "0"]);
        events.len() >= sent[0].len()
    });
    let (events, _) = query(&data, &["--provider", "before", "--cpu", "0"]);
    let counts = message_counts(&events);
    assert!(
        sent[0].iter().all(|m| counts.get(m) == Some(&1)) && counts.len() == sent[0].len(),
        "cpu 0: {} of {} distinct, {} rows",
        counts.len(),
        sent[0].len(),
        events.len()
    );
    // cpu 1's: those in the intact file, and the emptied file's counted.
    let reason = |p: &Path| format!("damaged: {}", p.file_name().unwrap().to_string_lossy());
    let mut gaps = Vec::new();
    wait_until("the loss record", || {
        gaps = query_gaps(&data, &["--since", "1h"]);
        gaps.iter().any(|g| g.0.starts_with("damaged: "))
    });
    let recorded: Vec<(String, u64)> = gaps
        .iter()
        .filter(|g| g.0.starts_with("damaged: "))
        .cloned()
        .collect();
    assert_eq!(recorded, vec![(reason(&emptied), emptied_held)], "{gaps:?}");
    let (events, _) = query(&data, &["--provider", "before", "--cpu", "1"]);
    assert_eq!(
        events.len() as u64 + emptied_held,
        sent[1].len() as u64,
        "cpu 1: stored {} + recorded lost {emptied_held}",
        events.len()
    );
    let out = Command::new(EVENTCTL)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--since", "1h", "--provider", "before"])
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!("at least {emptied_held} events lost"))
            && shown.contains(&reason(&emptied)),
        "{shown}"
    );
    eventd.stop();
    for p in [&cut, &emptied] {
        assert!(
            side(p, ".loss").exists(),
            "{}: its loss is not noted as accounted",
            p.display()
        );
    }

    // Counted once: a restart adds no second record and reads nothing again.
    let eventd = Eventd::start_with(&data, Some(&two), &stripes);
    emit_all(&data, "later", &numbered("later", 10));
    wait_until("the later events", || {
        query(&data, &["--provider", "later"]).0.len() == 10
    });
    let again = query_gaps(&data, &["--since", "1h"]);
    assert_eq!(
        again
            .iter()
            .filter(|g| g.0.starts_with("damaged: "))
            .count(),
        1,
        "{again:?}"
    );
    let messages = check_nothing_stored_twice(&data);
    assert!(sent[0].iter().all(|m| messages.get(m) == Some(&1)));
    eventd.stop();
    assert_eq!(std::fs::read(&cut).unwrap(), cut_bytes, "written again");
    assert_eq!(std::fs::metadata(&emptied).unwrap().len(), 0);
    eprintln!(
        "held {cut_held} (cut, read again from the ring) and {emptied_held} (emptied, \
         recorded lost)"
    );
}
