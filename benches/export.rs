//! The export stage's own cost per row: reading a shard's events in id
//! order and encoding them for ClickHouse (`ShardSource::after`), beside
//! SQLite stepping through the same rows and reading every column without
//! encoding anything (the floor of any reader of the file). Every measured
//! batch is checked for its row count.
//!
//! `cargo bench --bench export`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use eventd::export::format::Format;
use eventd::export::source::{Encoding, ShardSource};
use eventd::export::state::Table;
use eventd::store::rows::{EVENT_COLUMNS, INSERT_EVENT};
use rusqlite::params;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROWS: i64 = 200_000;
const BATCH: u64 = 50_000;

/// A shard holding [`ROWS`] events shaped like the load harness's: messages
/// of 64–256 bytes, a fields object on one row in four.
fn filled(dir: &Path) -> PathBuf {
    let path = eventd::store::shard_path(dir, 0);
    let mut conn = eventd::store::open_shard(&path).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx.prepare(INSERT_EVENT).unwrap();
        for seq in 1..=ROWS {
            let len = 64 + (seq as usize * 37) % 193;
            let message: String = "abcdefghijklmnopqrstuvwxyz "
                .chars()
                .cycle()
                .take(len)
                .collect();
            let fields =
                (seq % 4 == 0).then(|| format!(r#"{{"request":{seq},"user":"u{}"}}"#, seq % 97));
            insert
                .execute(params![
                    1_700_000_000_000_000_000i64 + seq * 1_000,
                    (seq % 2) as u32,
                    seq / 2,
                    7i64,
                    4242u32,
                    4243u32,
                    1000u32,
                    6u8,
                    "bench",
                    "tick",
                    message,
                    fields
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    path
}

fn read_and_encode(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = filled(dir.path());
    let source = ShardSource::open(&path).unwrap();
    let mut group = c.benchmark_group("export_read");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.measurement_time(Duration::from_secs(10));
    group.sample_size(10);
    for format in [Format::RowBinary, Format::JsonEachRow] {
        let encoding = Encoding {
            format,
            host: "bench-host",
        };
        group.bench_function(format!("after_{}", format.name()), |b| {
            b.iter(|| {
                let mut cursor = 0;
                let mut rows = 0;
                loop {
                    let batch = source
                        .after(Table::Events, cursor, BATCH, encoding)
                        .unwrap();
                    let Some(last) = batch.last_id() else { break };
                    rows += batch.len() as i64;
                    cursor = last;
                }
                assert_eq!(rows, ROWS);
            })
        });
    }
    // The floor: SQLite alone, every column read, nothing encoded.
    let conn = eventd::store::open_read_only(&path).unwrap();
    group.bench_function("sqlite_columns_only", |b| {
        b.iter(|| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS}, id FROM events WHERE id > ?1 ORDER BY id"
                ))
                .unwrap();
            let mut rows = stmt.query([0i64]).unwrap();
            let (mut n, mut bytes) = (0i64, 0usize);
            while let Some(r) = rows.next().unwrap() {
                for i in 0..13 {
                    bytes += match r.get_ref(i).unwrap() {
                        rusqlite::types::ValueRef::Text(t) => t.len(),
                        _ => 1,
                    };
                }
                n += 1;
            }
            assert_eq!(n, ROWS);
            std::hint::black_box(bytes);
        })
    });
    group.finish();
}

criterion_group!(benches, read_and_encode);
criterion_main!(benches);
