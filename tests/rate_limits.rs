//! Fair share (docs/guide/rate-limits.md): a real eventd under a flood from
//! threads on every CPU, with the default limits. The quiet provider keeps
//! every event, the flood's events are each stored, suppressed or
//! overwritten (exactly), the flooder's suppression is reported when its
//! window ends and named by `eventctl stats`, and its err-level events are
//! never suppressed.

mod common;

use common::*;
use eventd::rings::client::Producer;
use eventd::rings::Level;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One number from every shard: the sum of `sql`'s single value.
fn sum(data: &Path, sql: &str) -> u64 {
    shards(data)
        .iter()
        .map(|(_, c)| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64)
        .sum()
}

/// Emits `n` events of `producer` at `level`, one every `pause`.
fn paced(producer: &Producer, level: Level, n: u64, pause: Duration) {
    for i in 0..n {
        producer
            .emit(level, "tick", &format!("event {i}"), "")
            .unwrap();
        std::thread::sleep(pause);
    }
}

/// For every epoch of the rings `which` picks (an SQL condition on
/// `cpu`): the highest sequence number written, and the sequence numbers
/// stored as events or gaps (each exactly once), over every shard.
fn sequences_accounted(data: &Path, which: &str) -> Vec<(i64, i64, u64, u64)> {
    let mut out: std::collections::BTreeMap<(i64, i64), (u64, u64)> = Default::default();
    for (_, c) in shards(data) {
        let mut st = c
            .prepare(&format!(
                "SELECT cpu, ring_epoch, max(seq), count(*) FROM events \
                   WHERE {which} GROUP BY cpu, ring_epoch \
                 UNION ALL \
                 SELECT cpu, ring_epoch, max(to_seq), sum(lost) FROM gaps \
                   WHERE {which} GROUP BY cpu, ring_epoch"
            ))
            .unwrap();
        let rows = st
            .query_map([], |r| {
                Ok((
                    (r.get::<_, i64>(0)?, r.get::<_, i64>(1)?),
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as u64,
                ))
            })
            .unwrap();
        for row in rows {
            let (key, top, n) = row.unwrap();
            let e = out.entry(key).or_default();
            *e = (e.0.max(top), e.1 + n);
        }
    }
    out.into_iter()
        .map(|((cpu, epoch), (top, held))| (cpu, epoch, top, held))
        .collect()
}

/// The drains' limits alone, with the producers' own budgets turned off
/// (as `EVENTD_RATE_LIMIT=off` does): the flood laps the rings before the
/// drains judge it, and every event is still accounted for exactly.
#[test]
fn the_drains_limits_count_a_flood_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The default limits (10,000 per source per 30 s); one shard per ring.
    let cfg = config(dir.path(), "");
    let daemon = Eventd::start(&data, Some(&cfg));
    let kmes = data.join("kmes");
    let flood = Arc::new(Producer::new(&kmes, "flood").with_budget(0, 0));
    let quiet = Producer::new(&kmes, "quiet").with_budget(0, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let flooders: Vec<_> = (0..cpus * 2)
        .map(|_| {
            let (flood, stop, refused) = (flood.clone(), stop.clone(), refused.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if flood.emit(Level::Info, "spam", "again", "").is_err() {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // The flooding source's err-level events, at a modest rate beside it.
    let errs = {
        let flood = flood.clone();
        std::thread::spawn(move || paced(&flood, Level::Err, 500, Duration::from_millis(10)))
    };
    paced(&quiet, Level::Notice, 1000, Duration::from_millis(5));
    errs.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let emitted = flood.emitted();
    assert_eq!(quiet.emitted(), 1000);

    // Everything read: each CPU ring's sequence numbers are all accounted
    // for, and the flood's window has ended and been reported.
    wait_until_long("the flood's suppression report", || {
        sum(
            &data,
            "SELECT count(*) FROM events WHERE name = 'rate_limit.suppressed' \
             AND message LIKE '%provider flood%'",
        ) > 0
    });
    // The query docs/guide/rate-limits.md shows.
    let listed = eventctl_text(
        &data,
        &[
            "query",
            "--provider",
            "eventd",
            "--name",
            "rate_limit.suppressed",
        ],
    );
    assert!(
        listed.contains("events of provider flood (pid "),
        "{listed}"
    );
    let gaps = |reason: &str| {
        sum(
            &data,
            &format!(
                "SELECT ifnull(sum(lost), 0) FROM gaps WHERE reason = '{reason}' AND cpu < 1048576"
            ),
        )
    };
    // Every window has ended and been reported, and every suppressed
    // event is in a stored gap (under load the run can outlast one window,
    // and the next is still open when the first report is stored).
    wait_until_long("every window's end", || {
        let stats = eventctl_json(&data, "stats");
        let limits = &stats["stats"]["rate_limits"];
        limits["reported"] == limits["suppressed"]
            && limits["suppressed"].as_u64() == Some(gaps("suppressed"))
    });
    let accounted = sequences_accounted(&data, "cpu < 1048576");
    for (cpu, epoch, top, held) in &accounted {
        assert_eq!(
            top, held,
            "cpu {cpu} epoch {epoch}: {held} of {top} accounted for"
        );
    }
    let count = |provider: &str, level: &str| {
        sum(
            &data,
            &format!("SELECT count(*) FROM events WHERE provider = '{provider}' AND level {level}"),
        )
    };
    // The drain alone cannot keep the quiet provider whole: the flood
    // laps the rings before the drain judges it (the producers' budgets
    // do, as the next test shows).
    eprintln!("quiet: {} of 1000 stored", count("quiet", ">= 0"));
    eprintln!("flood's err: {} of 500 stored", count("flood", "= 3"));
    let (suppressed, overwritten) = (gaps("suppressed"), gaps("overwritten"));
    let stored = count("flood", ">= 0");
    let quiet_stored = count("quiet", ">= 0");
    assert!(suppressed > 0, "the flood was limited");
    // Reports eventd wrote into the CPU rings (stored, or overwritten).
    let reports = sum(
        &data,
        "SELECT count(*) FROM events WHERE name = 'rate_limit.suppressed' AND cpu < 1048576",
    );
    let stats = eventctl_json(&data, "stats");
    let written = stats["stats"]["rate_limits"]["reports"].as_u64().unwrap();
    // The quiet provider's events lapped by the flood are in the
    // overwritten gaps too, as are eventd's reports lapped in a CPU ring.
    // So is an event lapped while its thread was writing it (preempted
    // between its reservation and its commit, while another flooder on
    // that CPU went round the ring): its emit failed (counted in
    // `refused`), yet its sequence number was taken.
    let accounted = stored + suppressed + overwritten;
    let written_ok = emitted + (1000 - quiet_stored) + (written - reports);
    let refused_now = refused.load(Ordering::Relaxed);
    assert!(
        (written_ok..=written_ok + refused_now).contains(&accounted),
        "flood: stored {stored} + suppressed {suppressed} + overwritten {overwritten} = \
         {accounted}, not emitted {emitted} (+ {} quiet, {} reports overwritten) = \
         {written_ok}, plus at most the {refused_now} emits that failed",
        1000 - quiet_stored,
        written - reports
    );
    // The report's count and the stats name the flooder.
    let reported = sum(
        &data,
        "SELECT ifnull(sum(json_extract(fields, '$.suppressed')), 0) FROM events \
         WHERE name = 'rate_limit.suppressed' AND message LIKE '%provider flood%'",
    );
    // One report per window, counting every one; a report the flood
    // lapped in its CPU ring is missing from the sum (and counted above).
    if written == reports {
        assert_eq!(reported, suppressed, "every report stored");
    } else {
        assert!(reported < suppressed, "{reported} of {suppressed} reported");
    }
    assert_eq!(
        stats["stats"]["rate_limits"]["suppressed"].as_u64(),
        Some(suppressed),
        "{stats}"
    );
    let top = &stats["stats"]["rate_limits"]["top_sources"][0];
    assert!(
        top["source"]
            .as_str()
            .unwrap()
            .starts_with("provider flood (pid "),
        "{stats}"
    );
    assert_eq!(top["suppressed"].as_u64(), Some(suppressed));
    eprintln!(
        "flood: emitted {emitted}, stored {stored}, suppressed {suppressed}, overwritten \
         {overwritten}, refused by the producer {}",
        refused.load(Ordering::Relaxed)
    );
    daemon.stop();
}

/// Waits on state for up to two minutes (a window is 30 s by default).
fn wait_until_long(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The default limits, as a program gets them with no setting: the
/// producers' budgets follow the limit the daemon publishes in its rings,
/// so the flood is refused before it reaches a ring: nothing laps, the
/// quiet provider and the flood's err-level events are stored whole, the
/// refusals are reported into the ring exactly, and `eventctl stats` names
/// the flooder.
#[test]
fn under_default_limits_the_quiet_provider_is_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Eventd::start(&data, Some(&config(dir.path(), "")));
    let kmes = data.join("kmes");
    let flood = Arc::new(Producer::new(&kmes, "flood"));
    let quiet = Producer::new(&kmes, "quiet");
    let (stop, refused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let flooders: Vec<_> = (0..cpus * 2)
        .map(|_| {
            let (flood, stop, refused) = (flood.clone(), stop.clone(), refused.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if flood.emit(Level::Info, "spam", "again", "").is_err() {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let errs = {
        let flood = flood.clone();
        std::thread::spawn(move || paced(&flood, Level::Err, 500, Duration::from_millis(10)))
    };
    paced(&quiet, Level::Notice, 1000, Duration::from_millis(5));
    errs.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let emitted = flood.emitted();
    // The last reference: its pending refusals are reported as it goes.
    drop(Arc::into_inner(flood).unwrap());
    let refused = refused.load(Ordering::Relaxed);
    assert!(refused > 0, "the flood was refused at the source");
    let reported = || {
        sum(
            &data,
            "SELECT ifnull(sum(json_extract(fields, '$.refused_at_source')), 0) FROM events \
             WHERE provider = 'flood' AND name = 'rate_limit.refused'",
        )
    };
    wait_until_long("the producer's report", || reported() == refused);
    let count = |provider: &str, level: &str| {
        sum(
            &data,
            &format!(
                "SELECT count(*) FROM events WHERE provider = '{provider}' AND level {level} \
                 AND name != 'rate_limit.refused'"
            ),
        )
    };
    // The drain limits too, in windows of its own clock: when the run
    // outlasts a window (a loaded machine), the producer's next window may
    // pass events the drain's window, begun a moment later, still
    // suppresses. Those are counted gaps, never lost.
    let suppressed = || {
        sum(
            &data,
            "SELECT ifnull(sum(lost), 0) FROM gaps WHERE reason = 'suppressed' AND cpu < 1048576",
        )
    };
    wait_until_long("every event written", || {
        count("flood", ">= 0") + suppressed() + count("quiet", ">= 0") >= emitted + 1000
    });
    assert_eq!(count("quiet", ">= 0"), 1000, "every quiet event stored");
    assert_eq!(
        count("flood", "= 3"),
        500,
        "err-level events are never refused"
    );
    let suppressed = suppressed();
    assert_eq!(
        count("flood", ">= 0") + suppressed,
        emitted,
        "nothing the flood wrote was lost ({suppressed} suppressed by the drain)"
    );
    assert_eq!(
        sum(
            &data,
            "SELECT ifnull(sum(lost), 0) FROM gaps WHERE cpu < 1048576"
        ),
        suppressed,
        "nothing lapped"
    );
    let stats = eventctl_json(&data, "stats");
    let limits = &stats["stats"]["rate_limits"];
    assert_eq!(
        limits["refused_at_source"].as_u64(),
        Some(refused),
        "{stats}"
    );
    let top = &limits["top_sources"][0];
    assert!(
        top["source"]
            .as_str()
            .unwrap()
            .starts_with("provider flood (pid "),
        "{stats}"
    );
    assert!(top["suppressed"].as_u64().unwrap() >= refused, "{stats}");
    eprintln!("flood: written {emitted}, refused at the source {refused}");
    daemon.stop();
}

/// Sends `n` syslog datagrams tagged `tag` to `socket` as `uid`, from a
/// real program (python3: its `comm` is the same for every uid, so the
/// sources differ only by uid), pausing `pause_s` between them.
fn syslog_sender(socket: &Path, uid: u32, tag: &str, n: u64, pause_s: f64) -> std::process::Child {
    const SEND: &str = "import socket, sys, time\n\
        path, tag, n, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
        for i in range(n):\n\
        \x20   s.sendto(('<14>%s: message %d' % (tag, i)).encode(), path)\n\
        \x20   if pause:\n\
        \x20       time.sleep(pause)\n";
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", SEND])
        .arg(socket)
        .args([tag, &n.to_string(), &pause_s.to_string()]);
    as_user(&mut cmd, uid, &[]).spawn().expect("python3")
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Through syslog, keyed on trusted credentials: one uid floods, another
/// sends 1,000 messages at a modest rate, a third uid (exempt by an
/// override) sends as much as the flood. The quiet uid's messages are all
/// stored, and so are the exempt uid's; the flood's are stored or
/// suppressed, exactly as its report says; every sequence number of the
/// syslog ring is an event or a gap; `eventctl stats` names the flooder.
/// A burst of 1,000 in 5 s windows, so the flood is limited however slowly
/// a loaded machine runs its sender, and the reports come sooner.
#[test]
fn through_syslog_a_flooding_uid_leaves_other_uids_whole() {
    if !root() {
        eprintln!("not root: the senders need uids of their own; skipped");
        return;
    }
    const FLOODER: u32 = 65534;
    const QUIET: u32 = 65533;
    const EXEMPT: u32 = 65532;
    const FLOOD: u64 = 30_000;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let data = dir.path().join("data");
    let cfg = config(
        dir.path(),
        &format!(
            "RateLimitInterval = \"5s\"\nRateLimitBurst = 1000\nRateLimitOverrides = [{{ Uid = {EXEMPT}, Burst = 0 }}]\n"
        ),
    );
    let daemon = Eventd::start(&data, Some(&cfg));
    let socket = data.join("run/syslog.sock");
    let mut senders = [
        syslog_sender(&socket, QUIET, "quiet", 1000, 0.005),
        syslog_sender(&socket, FLOODER, "flood", FLOOD, 0.0),
        syslog_sender(&socket, EXEMPT, "exempt", FLOOD, 0.0),
    ];
    for s in &mut senders {
        assert!(s.wait().unwrap().success());
    }
    let report = |what: &str| {
        sum(
            &data,
            &format!(
                "SELECT ifnull({what}, 0) FROM events WHERE name = 'rate_limit.suppressed' \
                 AND json_extract(fields, '$.limited_uid') = {FLOODER}"
            ),
        )
    };
    let count = |provider: &str| {
        sum(
            &data,
            &format!("SELECT count(*) FROM events WHERE provider = '{provider}'"),
        )
    };
    wait_until_long("the flood's report and every message", || {
        count("flood") + report("sum(json_extract(fields, '$.suppressed'))") >= FLOOD
            && count("quiet") == 1000
            && count("exempt") == FLOOD
    });
    let suppressed = report("sum(json_extract(fields, '$.suppressed'))");
    assert!(suppressed > 0, "the flood was limited");
    assert_eq!(count("flood") + suppressed, FLOOD, "stored + suppressed");
    assert_eq!(count("quiet"), 1000);
    assert_eq!(count("exempt"), FLOOD, "the override exempts its uid");
    let stats = eventctl_json(&data, "stats");
    assert_eq!(stats["stats"]["syslog"]["dropped"], 0, "{stats}");
    // The syslog ring: every sequence number stored or in a gap, and its
    // suppressed gaps are what the reports counted.
    let ring = eventd::rings::SYSLOG_RING_CPU;
    let accounted = sequences_accounted(&data, &format!("cpu = {ring}"));
    assert!(!accounted.is_empty());
    for (_, epoch, top, held) in &accounted {
        assert_eq!(
            top, held,
            "syslog ring epoch {epoch}: {held} of {top} accounted for"
        );
    }
    assert_eq!(
        sum(
            &data,
            &format!(
                "SELECT ifnull(sum(lost), 0) FROM gaps WHERE cpu = {ring} \
                 AND reason = 'suppressed'"
            ),
        ),
        suppressed
    );
    let listed = eventctl_text(
        &data,
        &[
            "query",
            "--provider",
            "eventd",
            "--name",
            "rate_limit.suppressed",
        ],
    );
    assert!(
        listed.contains(&format!(
            "events of command \"python3\" (uid {FLOODER}) in 5 s"
        )),
        "{listed}"
    );
    let top = &stats["stats"]["rate_limits"]["top_sources"][0];
    assert_eq!(
        top["source"].as_str(),
        Some(format!("command \"python3\" (uid {FLOODER})").as_str()),
        "{stats}"
    );
    eprintln!(
        "syslog flood: {FLOOD} sent, {} stored, {suppressed} suppressed; quiet 1000 of 1000; \
         exempt {FLOOD} of {FLOOD}",
        count("flood")
    );
    daemon.stop();
}
