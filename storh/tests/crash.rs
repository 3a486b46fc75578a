//! A writer process SIGKILLed while it writes: the next open sees the
//! crash, removes the orphaned temporary files, and finds no torn record.

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use storh::docstore::{parse_jsonc, Collection};

const CHILD: &str = "STORH_CRASH_CHILD_DIR";
const PAYLOAD: usize = 8 << 10;

/// Run as the child (re-executed from the test below): inserts, rewrites
/// and deletes records of 8 KiB (small, so that most of its time is spent
/// inside writes, in their fsyncs) as fast as it can until it is killed.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD) else {
        return; // an ordinary test run: nothing to do
    };
    let mut c = Collection::open(&dir).unwrap();
    c.create_index("k").unwrap();
    let big = "x".repeat(PAYLOAD);
    let mut ids = Vec::new();
    let mut i = 0u64;
    loop {
        ids.push(
            c.insert(&serde_json::json!({ "i": i, "k": i % 5, "payload": big }))
                .unwrap(),
        );
        // Rewrites and deletes too, so a kill can land in any kind of write.
        if i % 3 == 0 {
            let id = &ids[(i as usize * 7) % ids.len()];
            c.update(id, |d| d["k"] = serde_json::json!((i + 1) % 5))
                .unwrap();
        }
        if i % 7 == 6 {
            let id = ids.swap_remove((i as usize * 3) % ids.len());
            c.delete(&id).unwrap();
        }
        i += 1;
    }
}

fn files(dir: &Path) -> (Vec<std::path::PathBuf>, usize) {
    let (mut records, mut temps) = (Vec::new(), 0);
    for bucket in std::fs::read_dir(dir.join("data")).unwrap() {
        for f in std::fs::read_dir(bucket.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.to_string_lossy().ends_with(".tmp") {
                temps += 1;
            } else {
                records.push(p);
            }
        }
    }
    (records, temps)
}

#[test]
fn sigkill_mid_write_leaves_no_torn_record_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut orphans_seen = 0;
    let mut rechecked = 0;
    for round in 0..8 {
        let before = if dir.path().join("data").exists() {
            files(dir.path()).0.len()
        } else {
            0
        };
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir.path())
            .spawn()
            .unwrap();
        // Once it is writing, kill it at some point of a write (each one
        // is mostly its fsync).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !dir.path().join("data").exists() || files(dir.path()).0.len() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never wrote"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Whether this kill landed inside a write is luck (on a tmpfs the
        // temporary file lives for microseconds): one more half-written
        // temporary file, as a kill inside `write` leaves it, makes sure
        // the clean-up is exercised every round.
        let planted = dir
            .path()
            .join("data/2d/.018bcfe5-6800-7000-8000-2d5dba6274da.jsonc.4242.tmp");
        std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
        std::fs::write(&planted, br#"{"i": 7, "payload": "xxx"#).unwrap();
        orphans_seen += files(dir.path()).1;
        let mut c = Collection::open(dir.path()).unwrap();
        let r = c.recovery();
        assert!(r.crashed, "round {round}: the crash is noticed");
        let (records, temps) = files(dir.path());
        assert_eq!(temps, 0, "round {round}: orphans removed");
        assert!(!records.is_empty());
        for p in &records {
            let v = parse_jsonc(p, &std::fs::read(p).unwrap()).unwrap();
            assert_eq!(
                v["payload"].as_str().unwrap().len(),
                PAYLOAD,
                "{}",
                p.display()
            );
        }
        // The id index, recovered from the journal: every record, no
        // ghost.
        let listed = c.stream(None, usize::MAX).unwrap();
        assert_eq!(listed.len(), records.len(), "round {round}");
        // The secondary index: one entry per record, each under the key
        // its file holds now.
        let stats = c.stats().unwrap();
        assert_eq!(stats.indexes, vec![("k".to_string(), records.len() as u64)]);
        for k in 0..5 {
            let mut want: Vec<String> = listed
                .iter()
                .filter(|(_, doc)| doc["k"] == k)
                .map(|(id, _)| id.clone())
                .collect();
            want.sort();
            let got: Vec<String> = c
                .find("k", &serde_json::json!(k), None, usize::MAX)
                .unwrap()
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            assert_eq!(got, want, "round {round}: k = {k}");
        }
        eprintln!("round {round}: {:?}", c.recovery());
        rechecked += c.recovery().rechecked;
        assert!(c.recovery().rebuilt_because.is_none(), "{:?}", c.recovery());
        c.close().unwrap();
    }
    assert!(orphans_seen >= 8);
    // Kills land inside writes (each is mostly fsyncs), and those writes
    // were re-checked from their files, not by a rebuild.
    assert!(rechecked > 0, "no kill landed inside a write");
}
