//! The bare-SQLite ceiling: the same number of rows, of the same sizes,
//! built before the clock starts and inserted in tight loops into the same
//! number of fresh databases (same schema, same pragmas, same insert
//! statement, same rows per transaction), one thread per database.
//!
//! eventd cannot beat this: it does the same SQLite work plus everything
//! before it (producers, rings, drains, channels, receipts).

use anyhow::Context;
use rand::{Rng, SeedableRng};
use rusqlite::params;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// One pre-built events row; its message is the first `len` bytes of the
/// thread's text.
struct Row {
    ts: i64,
    seq: i64,
    len: usize,
}

/// Inserts `rows` rows spread over `shards` fresh databases in `dir`, with
/// transactions of `batch` rows. Returns rows per second.
pub fn run(
    dir: &Path,
    shards: usize,
    rows: u64,
    batch: u64,
    sizes: crate::load::Sizes,
) -> anyhow::Result<f64> {
    run_with(dir, shards, rows, batch, sizes, &[])
}

// Longer than the ~70 lines a function should be: the bare-SQLite ceiling's
// threads and their timed loop, kept beside each other so the loop can be
// compared with the writer's.
/// Like [`run`], with SQL run on each database after eventd's own set-up
/// (other pragmas, a dropped index): how eventd's choices were measured.
pub fn run_with(
    dir: &Path,
    shards: usize,
    rows: u64,
    batch: u64,
    sizes: crate::load::Sizes,
    adjust: &[&str],
) -> anyhow::Result<f64> {
    let shards = shards.max(1);
    let per_shard = rows.div_ceil(shards as u64);
    // The writers' page caches, sized for this many databases as eventd
    // sizes them for its shards.
    eventd::store::schema::size_writer_caches(shards);
    let mut prepared = Vec::with_capacity(shards);
    for j in 0..shards {
        let path = eventd::store::shard_path(dir, j);
        let conn = eventd::store::open_shard(&path)?;
        // The query indexes eventd's writers give their shards by default.
        eventd::store::indexes::sync(&conn, &eventd::config::query_indexes_default(), &path)?;
        for sql in adjust {
            conn.execute_batch(sql)?;
        }
        let mut rng = rand::rngs::SmallRng::seed_from_u64(j as u64);
        let text: String = (0..sizes.max.max(1))
            .map(|_| rng.random_range(b'a'..=b'z') as char)
            .collect();
        let now = eventd::rings::now_ns();
        let built: Vec<Row> = (0..per_shard)
            .map(|i| {
                let len = if sizes.min == sizes.max {
                    sizes.max
                } else {
                    rng.random_range(sizes.min..=sizes.max)
                };
                Row {
                    ts: now + i as i64,
                    seq: i as i64 + 1,
                    len,
                }
            })
            .collect();
        // A ring epoch is a random 64-bit id: store one like it, so the rows
        // have eventd's sizes.
        let epoch: i64 = rng.random();
        prepared.push((conn, built, text, epoch));
    }
    let barrier = Arc::new(Barrier::new(shards + 1));
    let threads: Vec<_> = prepared
        .into_iter()
        .enumerate()
        .map(|(j, (mut conn, built, text, epoch))| {
            let barrier = barrier.clone();
            std::thread::Builder::new()
                .name(format!("ceiling-{j:03}"))
                .spawn(move || -> rusqlite::Result<(Instant, Instant)> {
                    barrier.wait();
                    let began = Instant::now();
                    for chunk in built.chunks(batch.max(1) as usize) {
                        let tx = conn.transaction()?;
                        {
                            let mut insert =
                                tx.prepare_cached(eventd::store::rows::INSERT_EVENT)?;
                            for row in chunk {
                                insert.execute(params![
                                    row.ts,
                                    j as i64,
                                    row.seq,
                                    epoch,
                                    std::process::id(),
                                    0u32,
                                    0u32,
                                    6u8,
                                    "perf",
                                    "load",
                                    &text[..row.len],
                                    None::<&str>,
                                ])?;
                            }
                            // As each of eventd's commits stores its span.
                            if let (Some(first), Some(last)) = (chunk.first(), chunk.last()) {
                                eventd::store::zones::record(
                                    &tx,
                                    first.ts.min(last.ts),
                                    first.ts.max(last.ts),
                                    tx.last_insert_rowid(),
                                )?;
                            }
                        }
                        tx.commit()?;
                    }
                    Ok((began, Instant::now()))
                })
                .expect("spawning a ceiling thread")
        })
        .collect();
    // Timed by the threads themselves, from the first to start to the last
    // to finish: the barrier wakes this thread among hundreds of others,
    // and a clock read here once ran late enough to make 256 databases
    // look ten times as fast as they are.
    barrier.wait();
    let mut span: Option<(Instant, Instant)> = None;
    for t in threads {
        let (began, ended) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a ceiling thread panicked"))??;
        span = Some(span.map_or((began, ended), |(b, e)| (b.min(began), e.max(ended))));
    }
    let (began, ended) = span.context("the ceiling ran no thread")?;
    let secs = ended.duration_since(began).as_secs_f64().max(1e-9);
    Ok((per_shard * shards as u64) as f64 / secs)
}
