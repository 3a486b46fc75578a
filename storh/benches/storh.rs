//! storh's costs, for `storh/README.md`.
//!
//! `cargo bench -p storh` builds two collections once (10k and 1M records,
//! kept under the target directory for later runs; `STORH_BENCH_BIG`
//! changes the large size) and measures: open, open plus the first page
//! (which loads the indexes), `get`, one `stream` page of 100 deep in the
//! large one, `stream` throughput, an indexed `find`, a durable `put`; a
//! durable insert and a batch insert; then SegmentedLog and Queue appends
//! beside a bare `write` + `fdatasync` loop of the same bytes; and the first
//! indexed query after a reopen of a collection whose records were
//! rewritten many times (200k records, 1M writes in all, built once;
//! `STORH_BENCH_REWRITTEN=RECORDS,WRITES` changes the sizes and
//! `STORH_BENCH_TMP` where that fixture is kept). Under `cargo test` the
//! collections are small and every bench runs once, as a check.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use storh::docstore::Collection;

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The small and the large collection sizes.
fn sizes() -> (usize, usize) {
    if !bench_mode() {
        return (200, 2_000);
    }
    let big = std::env::var("STORH_BENCH_BIG")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    (10_000, big)
}

fn doc(i: usize) -> Value {
    json!({
        "n": i,
        "team": format!("t{}", i % 100),
        "text": "a record of about the size of a small configuration entry or a user profile",
    })
}

/// A collection of `n` records with an index on `team`, built once.
fn fixture(n: usize) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("storh-bench-{n}"));
    let marker = dir.join("complete");
    if marker.exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut c = Collection::open(&dir).expect("open the bench collection");
    c.create_index("team").expect("create the index");
    let started = std::time::Instant::now();
    for start in (0..n).step_by(5_000) {
        let docs: Vec<Value> = (start..n.min(start + 5_000)).map(doc).collect();
        c.insert_many(&docs).expect("insert a batch");
        if n >= 100_000 && (start + 5_000) % 100_000 == 0 {
            eprintln!(
                "fixture {n}: {} records in {:.0?}",
                start + 5_000,
                started.elapsed()
            );
        }
    }
    c.close().expect("close the bench collection");
    std::fs::write(&marker, b"").expect("mark the fixture complete");
    dir
}

fn docstore(cr: &mut Criterion) {
    let (small, big) = sizes();
    let dirs = [(small, fixture(small)), (big, fixture(big))];
    let mut g = cr.benchmark_group("docstore");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    for (n, dir) in &dirs {
        g.bench_with_input(BenchmarkId::new("open_close", n), dir, |b, dir| {
            b.iter(|| Collection::open(dir).unwrap().close().unwrap())
        });
    }
    for (n, dir) in &dirs {
        g.bench_with_input(
            BenchmarkId::new("open_and_first_page_loads_index", n),
            dir,
            |b, dir| {
                b.iter(|| {
                    let mut c = Collection::open(dir).unwrap();
                    assert_eq!(c.stream(None, 100).unwrap().len(), 100);
                    c.close().unwrap();
                })
            },
        );
    }
    g.finish();

    // The large collection, open, its indexes loaded.
    let (n, dir) = &dirs[1];
    let mut c = Collection::open(dir).unwrap();
    let ids = c.list_ids(None, usize::MAX).unwrap();
    assert_eq!(ids.len(), *n);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut g = cr.benchmark_group("docstore_large");
    g.bench_function(BenchmarkId::new("get", n), |b| {
        b.iter(|| {
            let id = &ids[rng.random_range(0..ids.len())];
            c.get(id).unwrap().unwrap()
        })
    });
    let deep = ids[ids.len() * 9 / 10].clone();
    g.bench_function(BenchmarkId::new("stream_page_100_at_90pct", n), |b| {
        b.iter(|| {
            let page = c.stream(Some(&deep), 100).unwrap();
            assert_eq!(page.len(), 100);
        })
    });
    g.throughput(Throughput::Elements(1_000));
    g.bench_function(BenchmarkId::new("stream_1000_records", n), |b| {
        b.iter(|| {
            let from = &ids[rng.random_range(0..ids.len() - 1_000)];
            assert_eq!(c.stream(Some(from), 1_000).unwrap().len(), 1_000);
        })
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("find_indexed_page_of_10", n), |b| {
        b.iter(|| {
            let team = json!(format!("t{}", rng.random_range(0..100)));
            assert_eq!(c.find("team", &team, None, 10).unwrap().len(), 10);
        })
    });
    g.sample_size(20);
    g.bench_function(BenchmarkId::new("put_durable", n), |b| {
        b.iter(|| {
            let i = rng.random_range(0..ids.len());
            c.put(&ids[i], &doc(i)).unwrap();
        })
    });
    g.finish();
    c.close().unwrap();

    // Inserts, one durable record at a time and in batches, into a
    // collection of their own (the fixtures keep their size).
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Collection::open(tmp.path()).unwrap();
    c.create_index("team").unwrap();
    let mut g = cr.benchmark_group("docstore_insert");
    g.sample_size(20);
    g.throughput(Throughput::Elements(1));
    g.bench_function("insert_durable", |b| {
        b.iter(|| c.insert(&doc(rng.random_range(0..1000))).unwrap())
    });
    g.throughput(Throughput::Elements(100));
    g.bench_function("insert_many_100", |b| {
        b.iter(|| {
            let docs: Vec<Value> = (0..100).map(doc).collect();
            c.insert_many(&docs).unwrap();
        })
    });
    g.finish();
    c.close().unwrap();
}

fn appends(cr: &mut Criterion) {
    let payload = vec![b'e'; 128];
    let frame_len = storh::record::frame(0, &payload).len() as u64;
    let tmp = tempfile::tempdir().unwrap();
    let mut g = cr.benchmark_group("append_128B_durable");
    g.throughput(Throughput::Bytes(frame_len));
    g.sample_size(20);
    let mut log = storh::log::SegmentedLog::open(tmp.path().join("log"), 1 << 20).unwrap();
    g.bench_function("segmented_log", |b| {
        b.iter(|| log.append(&payload).unwrap())
    });
    let mut queue = storh::queue::Queue::open(tmp.path().join("queue")).unwrap();
    g.bench_function("queue", |b| b.iter(|| queue.append(&payload).unwrap()));
    let mut bare = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(tmp.path().join("bare"))
        .unwrap();
    let bytes = storh::record::frame(0, &payload);
    g.bench_function("bare_write_fdatasync", |b| {
        b.iter(|| {
            bare.write_all(&bytes).unwrap();
            bare.sync_data().unwrap();
        })
    });
    g.finish();
}

/// The rewritten collection's record count and total writes.
fn rewritten_sizes() -> (usize, usize) {
    if !bench_mode() {
        return (1_000, 3_000);
    }
    std::env::var("STORH_BENCH_REWRITTEN")
        .ok()
        .and_then(|s| {
            let (r, w) = s.split_once(',')?;
            Some((r.parse().ok()?, w.parse().ok()?))
        })
        .unwrap_or((200_000, 1_000_000))
}

/// A collection of `records` records with an index on `team`, given
/// `writes` writes in all in one session: the inserts (`insert_many`),
/// then durable `put`s of existing records in turn, each with a new `n`
/// and `team`. Built once, closed; the journal it closed with is kept
/// beside it (`<dir>.journal`) so that every timed reopen starts from it,
/// whatever a load before rewrote. Returns the collection and that copy.
fn rewritten_fixture(records: usize, writes: usize) -> (PathBuf, PathBuf) {
    let base = std::env::var_os("STORH_BENCH_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = base.join(format!("storh-bench-rewritten-{records}-{writes}"));
    let saved = dir.with_extension("journal");
    if saved.exists() {
        return (dir, saved);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&base).expect("create the fixture's parent");
    let mut c = Collection::open(&dir).expect("open the bench collection");
    c.create_index("team").expect("create the index");
    let started = Instant::now();
    let mut ids = Vec::with_capacity(records);
    for start in (0..records).step_by(5_000) {
        let docs: Vec<Value> = (start..records.min(start + 5_000)).map(doc).collect();
        ids.extend(c.insert_many(&docs).expect("insert a batch"));
    }
    for w in records..writes {
        c.put(&ids[w % records], &doc(w)).expect("rewrite a record");
        if (w + 1) % 100_000 == 0 {
            eprintln!(
                "rewritten fixture: {} writes in {:.0?}",
                w + 1,
                started.elapsed()
            );
        }
    }
    c.close().expect("close the bench collection");
    std::fs::copy(dir.join("index.log"), &saved).expect("keep the journal");
    (dir, saved)
}

fn reopen(cr: &mut Criterion) {
    let (records, writes) = rewritten_sizes();
    let (dir, saved) = rewritten_fixture(records, writes);
    let journal = dir.join("index.log");
    let text = std::fs::read(&saved).unwrap();
    eprintln!(
        "rewritten fixture: journal of {} lines, {} bytes at reopen",
        text.iter().filter(|&&b| b == b'\n').count(),
        text.len()
    );
    drop(text);
    let mut g = cr.benchmark_group("docstore_reopen");
    g.sample_size(10);
    g.bench_function(
        BenchmarkId::new(
            "open_and_first_find",
            format!("{records}_records_{writes}_writes"),
        ),
        |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    std::fs::copy(&saved, &journal).unwrap();
                    let started = Instant::now();
                    let mut c = Collection::open(&dir).unwrap();
                    let found = c.find("team", &json!("t7"), None, 10).unwrap();
                    spent += started.elapsed();
                    assert_eq!(found.len(), 10);
                    c.close().unwrap();
                }
                spent
            })
        },
    );
    g.finish();
}

criterion_group!(benches, docstore, appends, reopen);
criterion_main!(benches);
