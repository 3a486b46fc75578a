//! The DocStore's unit tests: records and buckets, JSONC, the lock and
//! the crash marker, `stream` pages, `verify`, the journal's replay and
//! re-checks, batches, and the indexes checked against the files.

use super::files::walk;
use super::*;
use crate::id::Id;
use crate::index::{self, IndexKey};
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use std::fs::OpenOptions;
use std::io::Write;
use std::ops::Bound;
use std::path::Path;

#[test]
fn records_live_in_the_bucket_their_id_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path().join("pages")).unwrap();
    let id = c.insert(&json!({"title": "hello"})).unwrap();
    let file = dir
        .path()
        .join("pages/data")
        .join(&id[24..26])
        .join(format!("{id}.jsonc"));
    assert!(file.is_file(), "{}", file.display());
    assert_eq!(c.get(&id).unwrap(), Some(json!({"title": "hello"})));
    c.put(&id, &json!({"title": "changed"})).unwrap();
    assert_eq!(c.get(&id).unwrap().unwrap()["title"], "changed");
    assert!(c.delete(&id).unwrap());
    assert!(!c.delete(&id).unwrap());
    assert_eq!(c.get(&id).unwrap(), None);
    assert!(matches!(c.get("nope"), Err(DocError::BadId { .. })));
    c.close().unwrap();
}

#[test]
fn comments_in_jsonc_files_are_accepted_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collection::open(dir.path()).unwrap();
    let id = "018bcfe5-6800-7000-8000-2d5dba6274da";
    let path = c.path_of(id).unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        "// a note\n{\n  \"a\": 1, /* inline */\n  \"b\": \"// not a comment\"\n}\n",
    )
    .unwrap();
    assert_eq!(
        c.get(id).unwrap(),
        Some(json!({"a": 1, "b": "// not a comment"}))
    );
    std::fs::write(&path, "{ broken").unwrap();
    let e = c.get(id).unwrap_err().to_string();
    assert!(e.contains(&path.display().to_string()), "{e}");
}

#[test]
fn a_second_writer_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let first = Collection::open(dir.path()).unwrap();
    // flock locks belong to the open file description: a second open
    // in this process is refused like another process would be.
    let e = Collection::open(dir.path()).err().unwrap().to_string();
    assert!(
        e.contains("another process") && e.contains(&format!("pid {}", std::process::id())),
        "{e}"
    );
    first.close().unwrap();
    let again = Collection::open(dir.path()).unwrap();
    assert_eq!(again.recovery(), Recovery::default(), "a clean close");
}

#[test]
fn stream_pages_cross_buckets_as_one_ordered_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let mut ids: Vec<Id> = (0..500)
        .map(|i| c.insert(&json!({ "i": i })).unwrap())
        .collect();
    // An id from elsewhere (older) and a deleted one.
    let foreign = "00000000-0000-7000-8000-000000000001".to_string();
    c.put(&foreign, &json!({"i": -1})).unwrap();
    ids.insert(0, foreign);
    let gone = ids.remove(250);
    assert!(c.delete(&gone).unwrap());
    let buckets: std::collections::BTreeSet<&str> = ids.iter().map(|i| &i[24..26]).collect();
    assert!(buckets.len() > 100, "the records span many buckets");
    let mut seen = Vec::new();
    let mut cursor: Option<Id> = None;
    loop {
        let page = c.stream(cursor.as_deref(), 37).unwrap();
        if page.is_empty() {
            break;
        }
        cursor = Some(page.last().unwrap().0.clone());
        seen.extend(page.into_iter().map(|(id, _)| id));
    }
    assert_eq!(seen, ids, "every record once, in id order");
    // The index survives a clean close and comes back from the journal.
    c.close().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let first = c.stream(None, 3).unwrap();
    assert_eq!(first[0].1["i"], -1);
    assert_eq!(c.reindex().unwrap(), ids.len() as u64);
}

#[test]
fn verify_names_bad_files_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let good = c.insert(&json!({"ok": true})).unwrap();
    let data = dir.path().join("data");
    let wrong_bucket = data
        .join("00")
        .join("018bcfe5-6800-7000-8000-2d5dba6274da.jsonc");
    std::fs::create_dir_all(wrong_bucket.parent().unwrap()).unwrap();
    std::fs::write(&wrong_bucket, "{}").unwrap();
    let bad_json = data
        .join(&good[24..26])
        .join("018bcfe5-6800-7000-8000-".to_string() + &good[24..26] + "0000000000.jsonc");
    std::fs::write(&bad_json, "{ nope").unwrap();
    let bad_name = data.join("ab").join("notes.txt");
    std::fs::create_dir_all(bad_name.parent().unwrap()).unwrap();
    std::fs::write(&bad_name, "x").unwrap();
    let (ok, findings) = c.verify().unwrap();
    assert_eq!(ok, 1);
    let reason = |p: &Path| {
        findings
            .iter()
            .find(|f| f.path == p)
            .map(|f| f.reason.clone())
            .unwrap_or_default()
    };
    assert!(
        reason(&wrong_bucket).contains("belongs in 2d"),
        "{findings:?}"
    );
    assert!(reason(&bad_json).contains("invalid JSONC"), "{findings:?}");
    assert!(reason(&bad_name).contains("not a .jsonc"), "{findings:?}");
    assert_eq!(findings.len(), 3);
}

/// A file put directly in `data/`, outside any bucket (a record file
/// misplaced by hand, or anything else), is named too.
#[test]
fn verify_names_a_file_outside_the_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let good = c.insert(&json!({"ok": true})).unwrap();
    let data = dir.path().join("data");
    let misplaced = data.join(format!("{good}.jsonc"));
    std::fs::copy(c.path_of(&good).unwrap(), &misplaced).unwrap();
    let stray = data.join("notes.txt");
    std::fs::write(&stray, "x").unwrap();
    let (ok, findings) = c.verify().unwrap();
    assert_eq!(ok, 1, "{findings:?}");
    let mut named: Vec<&Path> = findings.iter().map(|f| f.path.as_path()).collect();
    named.sort();
    let mut want = vec![misplaced.as_path(), stray.as_path()];
    want.sort();
    assert_eq!(named, want, "{findings:?}");
    assert!(
        findings
            .iter()
            .all(|f| f.reason.contains("outside the buckets")),
        "{findings:?}"
    );
}

#[test]
fn a_dirty_state_without_a_holder_means_a_crash_and_temp_files_go() {
    let dir = tempfile::tempdir().unwrap();
    let c = Collection::open(dir.path()).unwrap();
    let id = "018bcfe5-6800-7000-8000-2d5dba6274da";
    let orphan = c
        .path_of(id)
        .unwrap()
        .with_file_name(format!(".{id}.jsonc.999.tmp"));
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, "{\"half\":").unwrap();
    // Dropped without close: the state stays dirty, the lock goes.
    drop(c);
    let c = Collection::open(dir.path()).unwrap();
    assert_eq!(
        c.recovery(),
        Recovery {
            crashed: true,
            temp_files_removed: 1,
            ..Recovery::default()
        }
    );
    assert!(!orphan.exists());
    // A record written before the crash and one after it are both
    // listed (the journal is rebuilt, not continued).
    let mut c = c;
    let before = c.insert(&json!({"n": 1})).unwrap();
    drop(c); // another crash
    let mut c = Collection::open(dir.path()).unwrap();
    let after = c.insert(&json!({"n": 2})).unwrap();
    let listed: Vec<Id> = c
        .stream(None, 10)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(listed, vec![before, after]);
    c.close().unwrap();
}

/// Every id whose record has `key` under `field`, from the files.
fn brute(c: &Collection, field: &str, value: &Value) -> Vec<Id> {
    let key = IndexKey::of(value).unwrap();
    let mut out = Vec::new();
    walk(&c.dir().join("data"), |path, name, _| {
        if let Some(id) = name.strip_suffix(".jsonc") {
            let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
            if index::keys_of(&doc, field).contains(&key) {
                out.push(id.to_string());
            }
        }
    })
    .unwrap();
    out.sort();
    out
}

/// All pages of `find`, `page` at a time.
fn find_all(c: &mut Collection, field: &str, value: &Value, page: usize) -> Vec<Id> {
    let mut out: Vec<Id> = Vec::new();
    loop {
        let got = c
            .find(field, value, out.last().map(String::as_str), page)
            .unwrap();
        if got.is_empty() {
            return out;
        }
        assert!(got.len() <= page);
        out.extend(got.into_iter().map(|(id, _)| id));
    }
}

/// Checks the indexes on `colour`, `tags` and `n` against the files: their
/// entries, `find` pages (and the same finds by a scan) and a `range`.
fn check_indexes(c: &mut Collection, what: &str) {
    check_entries(c, what);
    check_finds(c, what);
    check_range(c, what);
}

fn check_entries(c: &mut Collection, what: &str) {
    // The entries themselves, not only what queries (which re-check
    // each record) return: as many as the files give, no stale ones.
    let mut files = 0;
    let mut entries = std::collections::BTreeMap::<String, u64>::new();
    walk(&c.dir().join("data"), |path, _, _| {
        files += 1;
        let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
        for f in ["colour", "tags", "n"] {
            *entries.entry(f.to_string()).or_default() += index::keys_of(&doc, f).len() as u64;
        }
    })
    .unwrap();
    let stats = c.stats().unwrap();
    assert_eq!(stats.records, files, "{what}: records");
    for (field, n) in &stats.indexes {
        assert_eq!(*n, entries[field], "{what}: entries of {field}");
    }
}

fn check_finds(c: &mut Collection, what: &str) {
    for colour in ["red", "green", "blue", "none"] {
        let v = json!(colour);
        let want = brute(c, "colour", &v);
        assert_eq!(
            find_all(c, "colour", &v, 7),
            want,
            "{what}: colour {colour}"
        );
        // The same query without an index (a scan) agrees.
        assert_eq!(find_all(c, "shade", &v, 5), want, "{what}: scan {colour}");
    }
    for tag in 0..6 {
        let v = json!(tag);
        assert_eq!(
            find_all(c, "tags", &v, 3),
            brute(c, "tags", &v),
            "{what}: tag {tag}"
        );
    }
}

fn check_range(c: &mut Collection, what: &str) {
    // A range over numbers, paged by (key, id), against the files.
    let mut want: Vec<(i64, Id)> = Vec::new();
    walk(&c.dir().join("data"), |path, name, _| {
        let doc = parse_jsonc(path, &std::fs::read(path).unwrap()).unwrap();
        let n = doc["n"].as_i64().unwrap();
        if (10..40).contains(&n) {
            want.push((n, name.trim_end_matches(".jsonc").to_string()));
        }
    })
    .unwrap();
    want.sort();
    let mut got: Vec<(i64, Id)> = Vec::new();
    loop {
        let after = got.last().map(|(n, id)| (json!(n), id.clone()));
        let page = c
            .range(
                "n",
                Bound::Included(&json!(10)),
                Bound::Excluded(&json!(40)),
                after.as_ref().map(|(n, id)| (n, id.as_str())),
                6,
            )
            .unwrap();
        if page.is_empty() {
            break;
        }
        got.extend(
            page.into_iter()
                .map(|h| (h.key.as_f64().unwrap() as i64, h.id)),
        );
    }
    assert_eq!(got, want, "{what}: range");
}

#[test]
fn indexes_stay_right_through_updates_deletes_reopen_and_crash() {
    use rand::SeedableRng;
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    let mut ids: Vec<Id> = (0..60)
        .map(|_| c.insert(&random_doc(&mut rng)).unwrap())
        .collect();
    // Indexes created over existing records, then kept by every write.
    assert!(c.create_index("colour").unwrap());
    assert!(!c.create_index("colour").unwrap());
    c.create_index("tags").unwrap();
    c.create_index("n").unwrap();
    assert!(matches!(
        c.create_index("a b"),
        Err(DocError::BadField { .. })
    ));
    check_indexes(&mut c, "created");
    random_writes(&mut c, &mut ids, &mut rng, 200);
    check_indexes(&mut c, "writes");
    let stats = c.stats().unwrap();
    assert_eq!(stats.records, ids.len() as u64);
    c.close().unwrap();
    // From the journal after a clean close.
    let mut c = Collection::open(dir.path()).unwrap();
    check_indexes(&mut c, "reopened");
    assert_eq!(c.recovery(), Recovery::default());
    for _ in 0..20 {
        c.put(&ids[rng.random_range(0..ids.len())], &random_doc(&mut rng))
            .unwrap();
    }
    drop(c); // a crash between writes
    let mut c = Collection::open(dir.path()).unwrap();
    check_indexes(&mut c, "after a crash");
    let r = c.recovery();
    assert!(r.crashed && r.rebuilt_because.is_none(), "{r:?}");
    assert_eq!(c.reindex().unwrap(), ids.len() as u64);
    check_indexes(&mut c, "reindexed");
    assert!(c.drop_index("tags").unwrap());
    assert!(matches!(
        c.range("tags", Bound::Unbounded, Bound::Unbounded, None, 1),
        Err(DocError::NotIndexed { .. })
    ));
    check_indexes_without_tags(&mut c);
    c.close().unwrap();
}

const COLOURS: [&str; 3] = ["red", "green", "blue"];

/// A record for the index tests: a colour (indexed) and the same colour
/// as `shade` (never indexed, so found by a scan), up to three tags and a
/// number.
fn random_doc(rng: &mut StdRng) -> Value {
    let colour = COLOURS[rng.random_range(0..3)];
    let tags: Vec<u32> = (0..rng.random_range(0..4))
        .map(|_| rng.random_range(0..6))
        .collect();
    json!({"colour": colour, "shade": colour, "tags": tags, "n": rng.random_range(0..50)})
}

/// `rounds` random inserts, puts, updates and deletes among `ids` (kept
/// to the records that exist), checking the indexes every 50 rounds.
fn random_writes(c: &mut Collection, ids: &mut Vec<Id>, rng: &mut StdRng, rounds: u32) {
    for round in 0..rounds {
        let i = rng.random_range(0..ids.len());
        match rng.random_range(0..4) {
            0 => ids.push(c.insert(&random_doc(rng)).unwrap()),
            1 => c.put(&ids[i], &random_doc(rng)).unwrap(),
            2 => {
                let colour = COLOURS[rng.random_range(0..3)];
                assert!(c
                    .update(&ids[i], |d| {
                        d["colour"] = json!(colour);
                        d["shade"] = json!(colour);
                    })
                    .unwrap());
            }
            _ => {
                let id = ids.swap_remove(i);
                assert!(c.delete(&id).unwrap());
                assert!(!c.update(&id, |_| {}).unwrap());
            }
        }
        if round % 50 == 0 {
            check_indexes(c, "writes");
        }
    }
}

fn check_indexes_without_tags(c: &mut Collection) {
    for colour in ["red", "green", "blue"] {
        let v = json!(colour);
        assert_eq!(find_all(c, "colour", &v, 4), brute(c, "colour", &v));
    }
    // Unindexed now: answered by a scan, the same.
    let v = json!(3);
    assert_eq!(find_all(c, "tags", &v, 4), brute(c, "tags", &v));
}

#[test]
fn a_write_cut_short_is_rechecked_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    c.create_index("colour").unwrap();
    let a = c.insert(&json!({"colour": "red"})).unwrap();
    let b = c.insert(&json!({"colour": "red"})).unwrap();
    // A writer that died after its intent and its new file, before the
    // lines that finish the write: `a` is blue on disk, red in the
    // journal. And one that died before touching `b`'s file.
    c.journal_append(&index::intent_line(&a)).unwrap();
    std::fs::write(c.path_of(&a).unwrap(), r#"{"colour": "blue"}"#).unwrap();
    c.journal_append(&index::intent_line(&b)).unwrap();
    drop(c);
    let mut c = Collection::open(dir.path()).unwrap();
    assert_eq!(
        find_all(&mut c, "colour", &json!("blue"), 10),
        vec![a.clone()]
    );
    assert_eq!(
        find_all(&mut c, "colour", &json!("red"), 10),
        vec![b.clone()]
    );
    let r = c.recovery();
    assert_eq!((r.crashed, r.rechecked), (true, 2), "{r:?}");
    assert!(r.rebuilt_because.is_none(), "only the two were read: {r:?}");
    // The entries themselves were fixed, not just filtered at query
    // time: the range walks the index alone.
    let keys: Vec<Value> = c
        .range("colour", Bound::Unbounded, Bound::Unbounded, None, 10)
        .unwrap()
        .into_iter()
        .map(|h| h.key)
        .collect();
    assert_eq!(keys, vec![json!("blue"), json!("red")]);
    c.close().unwrap();
    // A torn journal after a crash is not trusted: rebuilt from files.
    let c = Collection::open(dir.path()).unwrap();
    let journal = dir.path().join(index::JOURNAL);
    let mut f = OpenOptions::new().append(true).open(&journal).unwrap();
    f.write_all(format!("?{a}\n*{a}\nk{a} col").as_bytes())
        .unwrap();
    drop(c);
    let mut c = Collection::open(dir.path()).unwrap();
    assert_eq!(find_all(&mut c, "colour", &json!("blue"), 10), vec![a]);
    assert!(c.recovery().rebuilt_because.is_some(), "{:?}", c.recovery());
    // A declared field list that is not one names its file.
    c.close().unwrap();
    std::fs::write(dir.path().join(index::FIELDS), "{").unwrap();
    let e = Collection::open(dir.path()).err().unwrap().to_string();
    assert!(e.contains("indexes.json"), "{e}");
}

#[test]
fn a_batch_lands_whole_in_order_and_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    c.create_index("team").unwrap();
    let docs: Vec<Value> = (0..300)
        .map(|i| json!({"i": i, "team": format!("t{}", i % 3)}))
        .collect();
    let ids = c.insert_many(&docs).unwrap();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids, "ids in order within the batch");
    for (id, doc) in ids.iter().zip(&docs) {
        assert_eq!(c.get(id).unwrap().as_ref(), Some(doc));
    }
    let (ok, findings) = c.verify().unwrap();
    assert_eq!((ok, findings.len()), (300, 0), "{findings:?}");
    assert_eq!(find_all(&mut c, "team", &json!("t1"), 40).len(), 100);
    drop(c); // a crash: the journal still says everything
    let mut c = Collection::open(dir.path()).unwrap();
    assert_eq!(c.stats().unwrap().indexes, vec![("team".to_string(), 300)]);
    assert_eq!(c.recovery().rechecked, 0);
    c.close().unwrap();
}

#[test]
fn a_failed_journal_append_costs_the_journal_not_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    c.create_index("colour").unwrap();
    let a = c.insert(&json!({"colour": "red"})).unwrap();
    c.close().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    assert_eq!(
        find_all(&mut c, "colour", &json!("red"), 5),
        vec![a.clone()]
    );
    // Every append to the journal now fails (ENOSPC).
    let journal = dir.path().join(index::JOURNAL);
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink("/dev/full", &journal).unwrap();
    let e = c
        .put(&a, &json!({"colour": "blue"}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("index.log"), "{e}");
    // Nothing was written: the record and its index say red.
    assert_eq!(c.get(&a).unwrap(), Some(json!({"colour": "red"})));
    assert_eq!(
        find_all(&mut c, "colour", &json!("red"), 5),
        vec![a.clone()]
    );
    assert!(!journal.exists(), "the broken journal is dropped");
    // Writes go on, the loaded index with them, and the next open
    // rebuilds from the files.
    c.put(&a, &json!({"colour": "blue"})).unwrap();
    let b = c.insert(&json!({"colour": "blue"})).unwrap();
    assert_eq!(
        find_all(&mut c, "colour", &json!("blue"), 5),
        vec![a.clone(), b.clone()]
    );
    c.close().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    assert_eq!(
        find_all(&mut c, "colour", &json!("blue"), 5),
        vec![a.clone(), b]
    );
    assert!(c.recovery().rebuilt_because.is_some());
    // A cursor past the end of a range is an empty page, not a panic.
    let page = c
        .range(
            "colour",
            Bound::Unbounded,
            Bound::Excluded(&json!("blue")),
            Some((&json!("blue"), a.as_str())),
            10,
        )
        .unwrap();
    assert!(page.is_empty());
    c.close().unwrap();
}

#[test]
fn a_bad_file_is_reported_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    let ids: Vec<Id> = (0..5)
        .map(|i| c.insert(&json!({"i": i})).unwrap())
        .collect();
    let broken = c.path_of(&ids[2]).unwrap();
    std::fs::write(&broken, "{ half").unwrap();
    assert!(c.stream(None, 10).is_err(), "stream says what is wrong");
    let first = c.stream_page(None, 3).unwrap();
    assert_eq!(first.records.len(), 2);
    assert_eq!(first.bad.len(), 1);
    assert_eq!(first.bad[0].path, broken);
    assert!(
        first.bad[0].reason.contains("invalid JSONC"),
        "{:?}",
        first.bad
    );
    let rest = c.stream_page(first.last.as_deref(), 3).unwrap();
    let got: Vec<Id> = first
        .records
        .iter()
        .chain(&rest.records)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        got,
        vec![
            ids[0].clone(),
            ids[1].clone(),
            ids[3].clone(),
            ids[4].clone()
        ]
    );
    assert!(c
        .stream_page(rest.last.as_deref(), 3)
        .unwrap()
        .last
        .is_none());
    c.close().unwrap();
}

/// A value nesting `depth` arrays around a number.
fn nested(depth: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

#[test]
fn writes_get_could_not_read_back_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    c.create_index("k").unwrap();
    // The deepest record the reader takes is stored and read back.
    let deepest = json!({ "k": 1, "v": nested(RECORD_DEPTH_MAX - 1) });
    let id = c.insert(&deepest).unwrap();
    assert_eq!(c.get(&id).unwrap(), Some(deepest.clone()));
    let journal = std::fs::read(dir.path().join(index::JOURNAL)).unwrap();
    let files_before = c.count_files().unwrap();
    // One level more, and a record over the size limit.
    let too_deep = json!({ "k": 2, "v": nested(RECORD_DEPTH_MAX) });
    let text = serde_json::to_string(&too_deep).unwrap();
    assert!(
        parse_jsonc(Path::new("x"), text.as_bytes()).is_err(),
        "the reader refuses it"
    );
    let too_big = json!({ "k": 3, "v": "x".repeat(RECORD_BYTES_MAX) });
    for (what, doc) in [("deep", &too_deep), ("big", &too_big)] {
        let e = c.insert(doc).unwrap_err();
        assert!(matches!(e, DocError::Unreadable { .. }), "{what}: {e}");
        let e = c.put(&id, doc).unwrap_err().to_string();
        assert!(e.contains("could not be read back"), "{what}: {e}");
        let e = c.insert_many(&[json!({"k": 4}), doc.clone()]).unwrap_err();
        assert!(matches!(e, DocError::Unreadable { .. }), "{what}: {e}");
        let changed = c.update(&id, |d| *d = doc.clone());
        assert!(
            matches!(changed, Err(DocError::Unreadable { .. })),
            "{what}"
        );
    }
    assert!(c
        .insert(&nested(RECORD_DEPTH_MAX + 1000))
        .unwrap_err()
        .to_string()
        .contains(&format!("allows {RECORD_DEPTH_MAX}")));
    // Nothing was written: no file, no journal line, the old record whole.
    assert_eq!(c.count_files().unwrap(), files_before);
    assert_eq!(
        std::fs::read(dir.path().join(index::JOURNAL)).unwrap(),
        journal
    );
    assert_eq!(c.get(&id).unwrap(), Some(deepest));
    assert_eq!(c.find("k", &json!(4), None, 10).unwrap(), vec![]);
    c.close().unwrap();
}

#[test]
fn a_long_running_writer_keeps_its_journal_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Collection::open(dir.path()).unwrap();
    c.create_index("k").unwrap();
    let ids = c
        .insert_many(&(0..100).map(|i| json!({"k": i % 7})).collect::<Vec<_>>())
        .unwrap();
    c.close().unwrap();
    // A new writer that never queries: only its writes can load the
    // indexes to compact.
    let mut c = Collection::open(dir.path()).unwrap();
    let journal = dir.path().join(index::JOURNAL);
    let lines = || std::fs::read_to_string(&journal).unwrap().lines().count() as u64;
    // 100 records with one entry each, and a header: 201 lines whole.
    let bound = 3 * 201 + 1024 + 16;
    let mut longest = 0;
    for round in 0..4_000u64 {
        let i = (round * 37 % 100) as usize;
        c.put(&ids[i], &json!({"k": round % 7})).unwrap();
        longest = longest.max(lines());
    }
    assert!(longest <= bound, "the journal grew to {longest} lines");
    assert!(longest > 1024, "it was compacted, not never written");
    c.close().unwrap();
    // The next open loads a journal of about the records' size and
    // agrees with the files.
    assert!(lines() <= bound);
    let mut c = Collection::open(dir.path()).unwrap();
    for k in 0..7 {
        let found: Vec<Id> = c
            .find("k", &json!(k), None, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(found, brute(&c, "k", &json!(k)), "k = {k}");
    }
    assert_eq!(c.stats().unwrap().indexes, vec![("k".to_string(), 100)]);
    assert!(c.recovery().rebuilt_because.is_none(), "{:?}", c.recovery());
    c.close().unwrap();
}
