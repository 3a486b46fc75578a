//! The export scenario: eventd's export stage into a private ClickHouse
//! cluster (2 shards × `--replicas` of the system's clickhouse-server and a
//! ZooKeeper, all under the work directory on loopback: `eventd-cluster`,
//! the tests' own), each figure printed beside the peer or ceiling it is
//! judged against, measured in the same run:
//!
//! 1. **Export rows/s** of a filled store (`--rows` events, stored with
//!    export off), from eventd's start with `ExportUrl` set until its
//!    export status shows every file's events and gaps exported; beside it
//!    the **bare insert rate** of ClickHouse for the same rows: read from
//!    the same shard files and encoded by the library's own encoder
//!    (`ShardSource::after`, which encodes as it reads) into the same batches before the
//!    clock starts, then POSTed in a tight loop through the same
//!    Distributed table of the same server with the exporter's insert
//!    settings, one thread per file like the export workers.
//! 2. **RowBinary beside JSONEachRow** (`--export-format`), both ways.
//! 3. **Ingest with export off and on**: the harness's flat-out point
//!    (`pipeline::run`) with `ExportUrl` unset, then set.
//! 4. **Export lag at half the ingest rate**: sampled every 100 ms, as the
//!    age of the oldest stored event whose insert ClickHouse has not
//!    confirmed (the exporter's cursor in its state database, and the
//!    event after it in the shard file), and as `lag_seconds` of the
//!    export status.
//! 5. **CPU per exported row**: eventd's export threads and whole process,
//!    the ClickHouse servers and ZooKeeper; the bare loop's client CPU.
//! 6. **ExportBatchRows** `--batch-rows` (5,000, 50,000, 200,000).
//!
//! Every run gets a database of its own (its own ZooKeeper paths, so no
//! block of one run is taken for a duplicate of another's), and starts once
//! the servers have no merge or replication work left from the previous
//! one; after each, ClickHouse's row count must equal the rows sent.

use crate::load::{Mode, Sizes};
use crate::pipeline::{self, ExportPoint, Knobs, Outcome};
use crate::runner;
use crate::system::{stat_cpu_ns, Producers, Running};
use anyhow::{bail, Context};
use eventd::export::clickhouse::{ident, quote, Client, Endpoint};
use eventd::export::format::{Format, EVENT_COLUMNS, GAP_COLUMNS};
use eventd::export::source::{Encoding, ShardSource};
use eventd::export::state::Table;
use eventd::export::ExportReport;
use eventd::rings::attach::parse_cpu_list;
use eventd_cluster::{self as cluster, Cluster, Options};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to install where the cluster cannot run.
pub(crate) const APT_INSTALL: &str =
    "apt-get install -y clickhouse-server clickhouse-client zookeeper";

/// `HostName` of every run: one host's rows all go to the shard
/// `cityHash64(host)` picks, so every run inserts into the same shard.
const HOST: &str = "perf-host";

/// The batch size the format comparison, the ingest and lag phases use
/// (the shipped default).
const BATCH_DEFAULT: u64 = eventd::config::EXPORT_BATCH_ROWS_DEFAULT;

/// How every batch of the scenario is encoded (as the exporter of `HOST`
/// encodes it).
fn encoding(format: Format) -> Encoding<'static> {
    Encoding { format, host: HOST }
}

/// When the scenario started (for the progress lines).
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Seconds since the scenario started.
fn elapsed() -> f64 {
    STARTED.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// The longest any one wait of the scenario may take.
const PATIENCE: Duration = Duration::from_secs(600);

/// The private cluster and a client of its first server (every insert and
/// statement goes there, as `ExportUrl` names one server).
struct Ch {
    cluster: Cluster,
    client: Client,
    url: String,
    databases: usize,
    version: String,
    /// Where the cluster runs, apart from everything else (`--cluster-cpus`).
    split: Option<CpuSplit>,
}

impl Ch {
    /// 2 shards × `replicas` and ZooKeeper, or (`single`) one server
    /// without ZooKeeper.
    fn start(replicas: usize, single: bool) -> anyhow::Result<Ch> {
        let opts = Options::default();
        let cluster = if single {
            Cluster::try_start_single(opts)
        } else {
            Cluster::try_start(2, replicas, opts)
        }
        .map_err(anyhow::Error::msg)?;
        let url = cluster.url(1, 1);
        let client = Client::new(
            Endpoint {
                url: url.clone(),
                user: None,
                password: None,
                tls: None,
            },
            eventd::export::ExportTunables::default().timeout,
        );
        let version = client.text("SELECT version()", &[])?.trim().to_string();
        Ok(Ch {
            cluster,
            client,
            url,
            databases: 0,
            version,
            split: None,
        })
    }

    /// A new database with eventd's schema (`eventctl export init`'s own
    /// code, on every server).
    fn fresh_database(&mut self, what: &str) -> anyhow::Result<String> {
        self.databases += 1;
        let db = format!("perf_{}_{what}", self.databases);
        let schema = if self.cluster.is_single() {
            eventd::export::init::Schema::Single
        } else {
            eventd::export::init::Schema::Cluster
        };
        eventd::export::init::init(&self.client, &db, self.cluster.name(), Some(schema))
            .with_context(|| format!("creating database {db}"))?;
        Ok(db)
    }

    /// Waits (up to two minutes, then says so) until no server has a
    /// merge running or replication work queued, so that a run does not
    /// pay for the one before it.
    fn wait_quiet(&self) {
        let sql = "SELECT (SELECT count() FROM system.merges) + \
                   (SELECT count() FROM system.replication_queue)";
        let quiet = cluster::wait_until(Duration::from_secs(120), || {
            self.cluster.urls().iter().all(|u| {
                self.cluster
                    .query_with(u, sql, &[])
                    .is_ok_and(|t| t.trim() == "0")
            })
        });
        if !quiet {
            eprintln!(
                "warning: ClickHouse still merging or replicating after 120 s; measuring anyway"
            );
        }
    }

    /// Drops `db` on every server, so that its merges and fetches do not
    /// run beside the next measurement.
    fn drop_database(&self, db: &str) -> anyhow::Result<()> {
        let on_cluster = if self.cluster.is_single() {
            String::new()
        } else {
            format!(" ON CLUSTER {}", ident(self.cluster.name()))
        };
        self.client.run(
            &format!("DROP DATABASE IF EXISTS {}{on_cluster}", ident(db)),
            &[("distributed_ddl_task_timeout", "180")],
        )?;
        Ok(())
    }

    /// Rows of `db.table` on the replica the Distributed table reads.
    fn count(&self, db: &str, table: Table) -> anyhow::Result<u64> {
        let text = self.client.text(
            &format!("SELECT count() FROM {}.{}", ident(db), table.name()),
            &[],
        )?;
        text.trim()
            .parse()
            .with_context(|| format!("count() answered {text:?}"))
    }

    /// Waits until `db.table` holds `expected` rows on every replica (the
    /// replicas fetch what the insert wrote to one of them); the count
    /// last seen.
    fn wait_count(&self, db: &str, table: Table, expected: u64) -> anyhow::Result<u64> {
        let local = if self.cluster.is_single() {
            ""
        } else {
            "_local"
        };
        let sql = format!("SELECT count() FROM {}.{}{local}", ident(db), table.name());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // Each shard's replicas together; the first replica of each
            // shard holds its part of the total once replication is done.
            let mut total = 0;
            let mut agree = true;
            for s in 1..=self.cluster.shards() {
                let counts: Vec<u64> = (1..=self.cluster.replicas())
                    .map(|r| {
                        self.cluster
                            .query_with(&self.cluster.url(s, r), &sql, &[])
                            .ok()
                            .and_then(|t| t.trim().parse().ok())
                            .unwrap_or(0)
                    })
                    .collect();
                agree &= counts.windows(2).all(|w| w[0] == w[1]);
                total += counts.first().copied().unwrap_or(0);
            }
            if (agree && total == expected) || Instant::now() >= deadline {
                return Ok(total);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What runs: one server, or the cluster.
    fn layout(&self) -> String {
        if self.cluster.is_single() {
            "1 server (single-server schema, no ZooKeeper)".to_string()
        } else {
            format!(
                "{} shards × {} replicas + ZooKeeper",
                self.cluster.shards(),
                self.cluster.replicas()
            )
        }
    }

    /// Every server's and ZooKeeper's process id.
    fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = Vec::new();
        for s in 1..=self.cluster.shards() {
            for r in 1..=self.cluster.replicas() {
                pids.extend(self.cluster.pid(s, r));
            }
        }
        pids.extend(self.cluster.zookeeper_pid());
        pids
    }

    /// CPU time (ns) of every server and ZooKeeper so far.
    fn cpu_ns(&self) -> u64 {
        self.pids()
            .iter()
            .filter_map(|p| stat_cpu_ns(&format!("/proc/{p}/stat")))
            .sum()
    }
}

/// One shard file of the filled store.
struct StoreFile {
    path: PathBuf,
    instance: String,
    events: i64,
    gaps: i64,
}

fn store_files(store: &Path) -> anyhow::Result<Vec<StoreFile>> {
    let mut files = Vec::new();
    for path in eventd::store::list_databases(store)? {
        let s = ShardSource::open(&path)?;
        files.push(StoreFile {
            events: s.max_id(Table::Events)?,
            gaps: s.max_id(Table::Gaps)?,
            instance: s.instance.clone(),
            path,
        });
    }
    Ok(files)
}

/// The store every export run reads: filled once, export off.
struct Filled {
    dir: tempfile::TempDir,
    files: Vec<StoreFile>,
    events: u64,
    gaps: u64,
    events_per_s: f64,
}

impl Filled {
    fn rows(&self) -> u64 {
        self.events + self.gaps
    }
}

/// Emits flat out until `rows` events are stored, then stops.
fn fill(
    work: &Path,
    setup: &pipeline::Setup,
    sizes: Sizes,
    rows: u64,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Filled> {
    let dir = tempfile::Builder::new()
        .prefix("export-store-")
        .tempdir_in(work)?;
    let (settings, tunables) = pipeline::configure(dir.path(), Knobs::defaults(), None)?;
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let rings = running.rings()?;
    let start = Instant::now();
    let producers = Producers::start(setup.producers, &rings, Mode::FlatOut, sizes)?;
    loop {
        let (stored, _) = running.progress()?;
        progress.set_message(format!("filling the store: {stored}/{rows} events"));
        if stored >= rows {
            break;
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "only {stored} events stored");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (emitted, _) = producers.stop()?;
    let stored = loop {
        let (stored, lost) = running.progress()?;
        if stored + lost >= emitted {
            break stored;
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "the fill did not drain");
        std::thread::sleep(Duration::from_millis(5));
    };
    let events_per_s = stored as f64 / start.elapsed().as_secs_f64();
    drop(rings);
    running.stop()?;
    let files = store_files(&settings.store_dir)?;
    Ok(Filled {
        events: files.iter().map(|f| f.events as u64).sum(),
        gaps: files.iter().map(|f| f.gaps as u64).sum(),
        files,
        dir,
        events_per_s,
    })
}

/// The insert of one batch, as `src/export/cluster.rs` makes it.
fn insert_statement(db: &str, table: Table, format: Format) -> String {
    let columns = match table {
        Table::Events => EVENT_COLUMNS,
        Table::Gaps => GAP_COLUMNS,
    };
    format!(
        "INSERT INTO {}.{} ({columns}) FORMAT {}",
        ident(db),
        table.name(),
        format.name()
    )
}

/// One batch body, ready to send.
struct Body {
    table: Table,
    bytes: Vec<u8>,
}

/// Every file's batches: the rows after each cursor, `batch` at most,
/// encoded for `host` and the file's instance, as the exporter cuts them.
/// Timed: the read and encode cost of the rows on one thread.
fn encode_all(
    files: &[StoreFile],
    format: Format,
    batch: u64,
) -> anyhow::Result<(Vec<Vec<Body>>, f64)> {
    let start = Instant::now();
    let mut all = Vec::new();
    for f in files {
        let source = ShardSource::open(&f.path)?;
        let mut bodies = Vec::new();
        for table in Table::ALL {
            let mut after = 0;
            loop {
                let rows = source.after(table, after, batch, encoding(format))?;
                let Some(last) = rows.last_id() else {
                    break;
                };
                after = last;
                bodies.push(Body {
                    table,
                    bytes: rows.body().to_vec(),
                });
            }
        }
        all.push(bodies);
    }
    Ok((all, start.elapsed().as_secs_f64()))
}

/// What a timed run measured.
#[derive(Debug, Clone, Default, Serialize)]
struct RunFigures {
    rows: u64,
    secs: f64,
    rows_per_s: f64,
    /// ClickHouse servers and ZooKeeper, ns per row.
    server_cpu_ns_per_row: f64,
    /// The export run: eventd's export threads; the bare run: this
    /// process's sending threads.
    client_cpu_ns_per_row: f64,
    /// The export run with `--system binary`: the whole eventd process.
    process_cpu_ns_per_row: Option<f64>,
    /// The export run: from eventd's start until the first batch was
    /// confirmed.
    first_batch_secs: Option<f64>,
    /// The export run: rows/s from the first confirmed batch to the last
    /// full one (without the start-up and without the wait of each file's
    /// last, partial batch for the exporter's flush interval); `None`
    /// with fewer than two batches per file.
    steady_rows_per_s: Option<f64>,
    /// The export run: how many of the files each export worker has
    /// (the workers' own assignment, `export::worker::owner`).
    files_per_worker: Vec<usize>,
    /// The export run: seconds from eventd's start to each file's last
    /// row confirmed, in file order.
    file_done_secs: Vec<f64>,
    batches: u64,
    /// Rows ClickHouse holds afterwards (events + gaps).
    rows_in_clickhouse: u64,
}

/// What one thread of the bare loop sends.
enum BareWork<'a> {
    /// Batches encoded before the clock started.
    Encoded(Vec<&'a Body>),
    /// Files to read and encode batch by batch, in the loop.
    Files(Vec<&'a StoreFile>),
}

/// One insert, with the settings `src/export/cluster.rs` gives the
/// exporter's.
fn send(
    client: &Client,
    (db, single): (&str, bool),
    table: Table,
    format: Format,
    body: &[u8],
    query_id: &str,
) -> anyhow::Result<()> {
    let timeout = eventd::export::ExportTunables::default().timeout;
    let timeout = timeout.as_secs().max(1).to_string();
    // The exporter's settings: the Distributed ones only for a cluster.
    let mut settings = vec![("max_insert_block_size", "1048576"), ("query_id", query_id)];
    if !single {
        settings.push(("insert_distributed_sync", "1"));
        settings.push(("insert_distributed_timeout", &timeout));
    }
    client.insert(&insert_statement(db, table, format), body, &settings)?;
    Ok(())
}

/// One thread of the bare loop; returns its CPU time, ns.
fn bare_thread(
    client: &Client,
    (db, single): (&str, bool),
    format: Format,
    batch: u64,
    work: BareWork<'_>,
) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut query_id = || {
        n += 1;
        format!("perf-bare:{db}:{:?}:{n}", std::thread::current().id())
    };
    match work {
        BareWork::Encoded(bodies) => {
            for b in bodies {
                send(client, (db, single), b.table, format, &b.bytes, &query_id())?;
            }
        }
        BareWork::Files(files) => {
            for f in files {
                let source = ShardSource::open(&f.path)?;
                for table in Table::ALL {
                    let mut after = 0;
                    loop {
                        let rows = source.after(table, after, batch, encoding(format))?;
                        let Some(last) = rows.last_id() else {
                            break;
                        };
                        after = last;
                        send(
                            client,
                            (db, single),
                            table,
                            format,
                            rows.body(),
                            &query_id(),
                        )?;
                    }
                }
            }
        }
    }
    // This thread's CPU, read before it ends and leaves /proc/self/task.
    Ok(stat_cpu_ns("/proc/thread-self/stat").unwrap_or(0))
}

/// The bare loop: the rows POSTed as fast as ClickHouse takes them, one
/// thread per file (at most as many as the export workers), into a new
/// database. `encoded`: batches made before the clock starts (ClickHouse
/// alone); `None`: each thread reads and encodes its files' batches in
/// the loop (the exporter's work without its protocol).
fn bare(
    ch: &mut Ch,
    filled: &Filled,
    format: Format,
    batch: u64,
    encoded: Option<&[Vec<Body>]>,
) -> anyhow::Result<RunFigures> {
    let db = ch.fresh_database("bare")?;
    ch.wait_quiet();
    let threads = filled.files.len().clamp(1, eventd::export::WORKERS_MAX);
    let mut work: Vec<BareWork<'_>> = (0..threads)
        .map(|_| match encoded {
            Some(_) => BareWork::Encoded(Vec::new()),
            None => BareWork::Files(Vec::new()),
        })
        .collect();
    for (i, file) in filled.files.iter().enumerate() {
        match (&mut work[i % threads], encoded) {
            (BareWork::Encoded(list), Some(bodies)) => list.extend(bodies[i].iter()),
            (BareWork::Files(list), None) => list.push(file),
            _ => unreachable!("made alike above"),
        }
    }
    let server0 = ch.cpu_ns();
    let start = Instant::now();
    let client_ns = std::thread::scope(|scope| -> anyhow::Result<u64> {
        let handles: Vec<_> = work
            .into_iter()
            .enumerate()
            .map(|(t, w)| {
                let (client, db, single) = (&ch.client, &db, ch.cluster.is_single());
                std::thread::Builder::new()
                    .name(format!("bare-{t}"))
                    .spawn_scoped(scope, move || {
                        bare_thread(client, (db, single), format, batch, w)
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut total = 0;
        for h in handles {
            total += h
                .join()
                .map_err(|_| anyhow::anyhow!("a bare insert thread panicked"))??;
        }
        Ok(total)
    })?;
    let secs = start.elapsed().as_secs_f64();
    let server_ns = ch.cpu_ns() - server0;
    let rows = filled.rows();
    let landed = ch.wait_count(&db, Table::Events, filled.events)?
        + ch.wait_count(&db, Table::Gaps, filled.gaps)?;
    ch.drop_database(&db)?;
    Ok(RunFigures {
        rows,
        secs,
        rows_per_s: rows as f64 / secs,
        server_cpu_ns_per_row: server_ns as f64 / rows as f64,
        client_cpu_ns_per_row: client_ns as f64 / rows as f64,
        process_cpu_ns_per_row: None,
        first_batch_secs: None,
        steady_rows_per_s: None,
        files_per_worker: Vec::new(),
        file_done_secs: Vec::new(),
        batches: 0,
        rows_in_clickhouse: landed,
    })
}

fn export_point(url: &str, db: &str, batch: u64, format: Format, nice: i32) -> ExportPoint {
    ExportPoint {
        host: HOST.to_string(),
        settings: eventd::export::ExportSettings {
            url: url.to_string(),
            database: db.to_string(),
            batch_rows: batch,
            nice,
            user: None,
            password_file: None,
            tls: Default::default(),
        },
        format,
    }
}

/// Rows of `files` the report shows exported (each file's cursors, capped
/// at what the file held when filled), and whether that is all of them.
fn exported(report: &ExportReport, files: &[StoreFile]) -> (u64, bool) {
    let mut rows = 0;
    let mut all = true;
    for f in files {
        match report.shards.iter().find(|s| s.instance == f.instance) {
            Some(s) => {
                rows += s.events.exported_through.min(f.events).max(0) as u64
                    + s.gaps.exported_through.min(f.gaps).max(0) as u64;
                all &= s.events.exported_through >= f.events && s.gaps.exported_through >= f.gaps;
            }
            None => all = false,
        }
    }
    (rows, all)
}

// Longer than the ~70 lines a function should be: one timed run (set-up,
// start, the polling loop, the figures), in the order it runs.
/// eventd started on the filled store with export on (a new database, no
/// export state), timed until its status shows every row exported.
fn export_run(
    ch: &mut Ch,
    setup: &pipeline::Setup,
    filled: &Filled,
    (format, batch, nice): (Format, u64, i32),
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<RunFigures> {
    let db = ch.fresh_database("export")?;
    let state = filled.dir.path().join("export");
    if state.exists() {
        std::fs::remove_dir_all(&state)?;
    }
    let point = export_point(&ch.url, &db, batch, format, nice);
    let (settings, tunables) =
        pipeline::configure(filled.dir.path(), Knobs::defaults(), Some(&point))?;
    ch.wait_quiet();
    let server0 = ch.cpu_ns();
    let start = Instant::now();
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let mut first_batch = None;
    let mut file_done: Vec<Option<f64>> = vec![None; filled.files.len()];
    let mut timeline: Vec<(f64, u64)> = Vec::new();
    let report = loop {
        let report = running.export_report()?.context("export is off")?;
        let (rows, done) = exported(&report, &filled.files);
        let secs = start.elapsed().as_secs_f64();
        if rows > 0 && first_batch.is_none() {
            first_batch = Some(secs);
        }
        timeline.push((secs, rows));
        for (f, done) in filled.files.iter().zip(file_done.iter_mut()) {
            let whole = std::slice::from_ref(f);
            if done.is_none() && exported(&report, whole).1 {
                *done = Some(secs);
            }
        }
        if done {
            break report;
        }
        if start.elapsed() > PATIENCE {
            bail!(
                "{} {batch}: {rows} of {} rows exported after {secs:.0} s: {}",
                format.name(),
                filled.rows(),
                serde_json::to_string(&report)?
            );
        }
        progress.set_message(format!(
            "export {} {batch}: {rows}/{} rows, {:.0} rows/s",
            format.name(),
            filled.rows(),
            rows as f64 / secs
        ));
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = start.elapsed().as_secs_f64();
    let (threads_ns, process_ns) = running.export_cpu_ns();
    let server_ns = ch.cpu_ns() - server0;
    running.stop()?;
    let rows = filled.rows();
    let landed = ch.wait_count(&db, Table::Events, filled.events)?
        + ch.wait_count(&db, Table::Gaps, filled.gaps)?;
    ch.drop_database(&db)?;
    let per_row = |ns: u64| ns as f64 / rows as f64;
    Ok(RunFigures {
        rows,
        secs,
        rows_per_s: rows as f64 / secs,
        server_cpu_ns_per_row: per_row(server_ns),
        client_cpu_ns_per_row: per_row(threads_ns),
        process_cpu_ns_per_row: process_ns.map(per_row),
        first_batch_secs: first_batch,
        steady_rows_per_s: steady_rate(&timeline, &filled.files, batch),
        files_per_worker: {
            let workers = filled.files.len().clamp(1, eventd::export::WORKERS_MAX);
            let mut n = vec![0; workers];
            for f in &filled.files {
                n[eventd::export::worker::owner(
                    &eventd::export::worker::file_name(&f.path),
                    workers,
                )] += 1;
            }
            n
        },
        file_done_secs: file_done.iter().map(|d| d.unwrap_or(secs)).collect(),
        batches: report
            .shards
            .iter()
            .map(|s| s.events.batches_sent + s.gaps.batches_sent)
            .sum(),
        rows_in_clickhouse: landed,
    })
}

/// The export rate between the first confirmed batch and the moment
/// only partial batches were left (`timeline`: seconds and rows exported).
fn steady_rate(timeline: &[(f64, u64)], files: &[StoreFile], batch: u64) -> Option<f64> {
    let batch = batch.max(1);
    let tails: u64 = files
        .iter()
        .map(|f| f.events as u64 % batch + f.gaps as u64 % batch)
        .sum();
    let total: u64 = files.iter().map(|f| (f.events + f.gaps) as u64).sum();
    let &(t1, r1) = timeline.iter().find(|(_, r)| *r > 0)?;
    let &(t2, r2) = timeline.iter().find(|(_, r)| *r >= total - tails)?;
    (r2 > r1 && t2 > t1).then(|| (r2 - r1) as f64 / (t2 - t1))
}

/// One format and batch size: the bare loop, then eventd.
#[derive(Debug, Clone, Serialize)]
struct Pair {
    /// Which round of `--repeat` (from 1).
    round: usize,
    format: Format,
    batch_rows: u64,
    export: RunFigures,
    /// The bare loop with batches encoded before the clock: ClickHouse
    /// alone, the ceiling.
    bare: RunFigures,
    ratio: f64,
    /// The bare loop reading and encoding each batch before sending it:
    /// the exporter's work without its protocol.
    bare_inline: RunFigures,
    ratio_inline: f64,
    /// Reading the rows from the shard files and encoding them, one
    /// thread (the bare loop's preparation).
    read_encode_rows_per_s: f64,
}

/// Lag samples, µs.
fn lag_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

/// The export lag right now, ns: the age of the oldest event stored and not
/// confirmed by ClickHouse, over every file (0 when none waits). From the
/// exporter's cursors (its state database, moved only after ClickHouse
/// accepted a batch) and the event after each cursor in its shard file.
fn cursor_lag_ns(state: &rusqlite::Connection, sources: &[ShardSource]) -> anyhow::Result<i64> {
    let now = eventd::rings::now_ns();
    let mut lag = 0;
    for s in sources {
        let through: i64 = state
            .query_row(
                "SELECT exported_through FROM cursors WHERE instance = ?1 AND tbl = 'events'",
                [&s.instance],
                |r| r.get(0),
            )
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(0),
                e => Err(e),
            })?;
        if let Some(ts) = s.first_time_after(Table::Events, through, 1)? {
            lag = lag.max(now - ts);
        }
    }
    Ok(lag)
}

#[derive(Debug, Clone, Serialize)]
struct LagFigures {
    rate: u64,
    secs: f64,
    emitted: u64,
    lost: u64,
    samples: u64,
    cursor_lag_ms_p50: f64,
    cursor_lag_ms_p99: f64,
    cursor_lag_ms_max: f64,
    status_lag_ms_p50: f64,
    status_lag_ms_p99: f64,
    status_lag_ms_max: f64,
    /// From the end of the load until every stored row was exported.
    catch_up_secs: f64,
    stored: u64,
    rows_in_clickhouse: u64,
}

// Longer than the ~70 lines a function should be: one timed phase (start,
// paced load with a sampler, drain, catch-up, check), in the order it runs.
/// The paced load with export on, its lag sampled every 100 ms.
fn lag_run(
    ch: &mut Ch,
    setup: &pipeline::Setup,
    work: &Path,
    sizes: Sizes,
    (rate, duration, nice): (u64, Duration, i32),
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<LagFigures> {
    let dir = tempfile::Builder::new()
        .prefix("export-lag-")
        .tempdir_in(work)?;
    let db = ch.fresh_database("lag")?;
    let point = export_point(&ch.url, &db, BATCH_DEFAULT, Format::RowBinary, nice);
    let (settings, tunables) = pipeline::configure(dir.path(), Knobs::defaults(), Some(&point))?;
    ch.wait_quiet();
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let rings = running.rings()?;
    let state_path = dir.path().join("export/state.db");
    let mut state = None;
    let mut sources: Vec<ShardSource> = Vec::new();
    let (mut by_cursor, mut by_status) = (lag_histogram()?, lag_histogram()?);
    let start = Instant::now();
    let producers = Producers::start(setup.producers, &rings, Mode::Rate(rate), sizes)?;
    let mut next = start;
    while start.elapsed() < duration {
        next += Duration::from_millis(100);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if state.is_none() && state_path.exists() {
            state = Some(rusqlite::Connection::open_with_flags(
                &state_path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )?);
        }
        let paths = eventd::store::list_databases(&settings.store_dir)?;
        if sources.len() != paths.len() {
            sources = paths
                .iter()
                .filter_map(|p| ShardSource::open(p).ok())
                .collect();
        }
        if let Some(state) = &state {
            let lag = cursor_lag_ns(state, &sources)?;
            by_cursor.saturating_record((lag / 1000).max(1) as u64);
        }
        if let Some(report) = running.export_report()? {
            let worst = report
                .shards
                .iter()
                .flat_map(|s| [s.events.lag_seconds, s.gaps.lag_seconds])
                .fold(0f64, f64::max);
            by_status.saturating_record(((worst * 1e6) as u64).max(1));
        }
        progress.set_message(format!(
            "lag at {rate}/s: {:.0}/{:.0} s, p99 {:.0} ms",
            start.elapsed().as_secs_f64(),
            duration.as_secs_f64(),
            by_cursor.value_at_quantile(0.99) as f64 / 1000.0
        ));
    }
    let (emitted, _) = producers.stop()?;
    let secs = start.elapsed().as_secs_f64();
    let (stored, lost) = loop {
        let (stored, lost) = running.progress()?;
        if stored + lost >= emitted {
            break (stored, lost);
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "the paced load did not drain");
        std::thread::sleep(Duration::from_millis(5));
    };
    let ended = Instant::now();
    let files = store_files(&settings.store_dir)?;
    loop {
        let report = running.export_report()?.context("export is off")?;
        if exported(&report, &files).1 {
            break;
        }
        anyhow::ensure!(ended.elapsed() < PATIENCE, "the export did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let catch_up_secs = ended.elapsed().as_secs_f64();
    drop(rings);
    running.stop()?;
    let events: u64 = files.iter().map(|f| f.events as u64).sum();
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let rows_in_clickhouse = ch.wait_count(&db, Table::Events, events)?;
    ch.drop_database(&db)?;
    Ok(LagFigures {
        rate,
        secs,
        emitted,
        lost,
        samples: by_cursor.len(),
        cursor_lag_ms_p50: ms(&by_cursor, 0.5),
        cursor_lag_ms_p99: ms(&by_cursor, 0.99),
        cursor_lag_ms_max: by_cursor.max() as f64 / 1000.0,
        status_lag_ms_p50: ms(&by_status, 0.5),
        status_lag_ms_p99: ms(&by_status, 0.99),
        status_lag_ms_max: by_status.max() as f64 / 1000.0,
        catch_up_secs,
        stored,
        rows_in_clickhouse,
    })
}

#[derive(Debug, Clone, Serialize)]
struct IngestFigures {
    off: Outcome,
    on: Outcome,
    ratio: f64,
    /// Events ClickHouse held when the point with export on ended.
    exported_during_point: u64,
    /// CPUs the ClickHouse servers and ZooKeeper used during each point.
    clickhouse_cpus_off: f64,
    clickhouse_cpus_on: f64,
    /// The export-on point again with every ClickHouse and ZooKeeper
    /// thread at niceness 19: the cluster then runs on the CPU time eventd
    /// leaves, a stand-in for a cluster on other machines.
    on_cluster_niced: Outcome,
    ratio_cluster_niced: f64,
    exported_during_niced_point: u64,
    clickhouse_cpus_niced: f64,
}

/// Sets the niceness of every thread of every ClickHouse server and of
/// ZooKeeper (niceness is per thread on Linux; threads they start later
/// inherit it from the thread that starts them).
fn renice_cluster(ch: &Ch, nice: i32) {
    for pid in ch.pids() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for tid in tasks.flatten() {
            let Some(tid) = tid.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
                continue;
            };
            // SAFETY: setpriority only reads its arguments; a thread that
            // ended meanwhile gives ESRCH, which is ignored.
            unsafe { libc::setpriority(libc::PRIO_PROCESS as _, tid as libc::id_t, nice) };
        }
    }
}

/// The harness's flat-out point with ExportUrl unset, then set, then set
/// with the cluster reniced to 19.
fn ingest(
    ch: &mut Ch,
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<IngestFigures>> {
    let duration = Duration::from_secs_f64(args.duration.unwrap_or(10.0));
    let mut rounds = Vec::new();
    for _ in 0..args.common.repeat.max(1) {
        let mut outcomes = Vec::new();
        let mut cpus = Vec::new();
        let mut exported = Vec::new();
        for (label, export, niced) in [
            ("export off", false, false),
            ("export on", true, false),
            ("export on, cluster at nice 19", true, true),
        ] {
            let db = ch.fresh_database("ingest")?;
            let point_export = export_point(
                &ch.url,
                &db,
                BATCH_DEFAULT,
                Format::RowBinary,
                args.export_nice,
            );
            ch.wait_quiet();
            if niced {
                renice_cluster(ch, 19);
            }
            let (cpu0, t0) = (ch.cpu_ns(), Instant::now());
            let point = pipeline::Point {
                label,
                knobs: Knobs::defaults(),
                mode: Mode::FlatOut,
                sizes,
                duration,
                with_ceiling: false,
                export: export.then_some(&point_export),
            };
            let o = pipeline::run(work, setup, &point, progress);
            cpus.push((ch.cpu_ns() - cpu0) as f64 / 1e9 / t0.elapsed().as_secs_f64());
            if niced {
                renice_cluster(ch, 0);
            }
            let o = o?;
            exported.push(ch.count(&db, Table::Events)?);
            ch.drop_database(&db)?;
            progress.suspend(|| {
                eprintln!(
                    "[{:3.0} s] ingest, {label}: {:.0} events/s, lost {}, p99 {} µs, largest \
                     WAL {:.0} MiB ({:.0} after the drain), export's WAL holds {:?}",
                    elapsed(),
                    o.events_per_s,
                    o.lost,
                    o.latency_us_p99,
                    o.wal_peak_mib,
                    o.wal_end_mib,
                    o.export_wal_holds
                )
            });
            outcomes.push(o);
        }
        let [off, on, on_cluster_niced]: [Outcome; 3] = outcomes
            .try_into()
            .map_err(|_| anyhow::anyhow!("three points"))?;
        rounds.push(IngestFigures {
            ratio: on.events_per_s / off.events_per_s,
            ratio_cluster_niced: on_cluster_niced.events_per_s / off.events_per_s,
            off,
            on,
            on_cluster_niced,
            exported_during_point: exported[1],
            exported_during_niced_point: exported[2],
            clickhouse_cpus_off: cpus[0],
            clickhouse_cpus_on: cpus[1],
            clickhouse_cpus_niced: cpus[2],
        });
    }
    Ok(rounds)
}

#[derive(Serialize)]
struct ExportReportFile<'a> {
    clickhouse: String,
    shards: usize,
    replicas: usize,
    host_shard: String,
    system: crate::system::SystemKind,
    fill_events: u64,
    fill_gaps: u64,
    fill_events_per_s: f64,
    pairs: &'a [Pair],
    ingest: &'a [IngestFigures],
    lag: &'a LagFigures,
    batch_rows_choice: u64,
    /// `--cluster-cpus`: the CPUs of ClickHouse and ZooKeeper, and of
    /// everything else; both empty when all share every CPU.
    cluster_cpus: Vec<u32>,
    client_cpus: Vec<u32>,
}

/// `--cluster-cpus`: which CPUs the cluster runs on and which the rest.
struct CpuSplit {
    cluster: Vec<u32>,
    client: Vec<u32>,
}

impl CpuSplit {
    /// Fails unless every process of `pids` (the cluster's) may run on the
    /// cluster's CPUs only, and this thread on the others only.
    fn check(&self, pids: &[u32]) -> anyhow::Result<()> {
        for pid in pids {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .with_context(|| format!("no Cpus_allowed_list in /proc/{pid}/status"))?;
            let cpus = parse_cpu_list(list.trim())
                .with_context(|| format!("/proc/{pid}/status: Cpus_allowed_list {list:?}"))?;
            anyhow::ensure!(
                cpus == self.cluster,
                "--cluster-cpus: cluster process {pid} may run on {cpus:?}, not {:?}",
                self.cluster
            );
        }
        let own = crate::load::allowed_cpus();
        anyhow::ensure!(
            own == self.client,
            "--cluster-cpus: the harness may run on {own:?}, not {:?}",
            self.client
        );
        Ok(())
    }

    fn describe(split: Option<&CpuSplit>) -> String {
        match split {
            None => "the cluster, eventd and the bare loop share every CPU".to_string(),
            Some(s) => format!(
                "the cluster on CPUs {:?}, eventd, the bare loop and the load on {:?}",
                s.cluster, s.client
            ),
        }
    }
}

/// The split `--cluster-cpus` asks for, checked against the CPUs this
/// process may use; None without the option.
fn split_cpus(args: &Args) -> anyhow::Result<Option<CpuSplit>> {
    if args.cluster_cpus.is_empty() {
        return Ok(None);
    }
    let all = crate::load::allowed_cpus();
    for c in &args.cluster_cpus {
        anyhow::ensure!(
            all.contains(c),
            "--cluster-cpus: CPU {c} is not one this process may run on ({all:?})"
        );
    }
    let client: Vec<u32> = all
        .iter()
        .filter(|c| !args.cluster_cpus.contains(c))
        .copied()
        .collect();
    anyhow::ensure!(
        !client.is_empty(),
        "--cluster-cpus {:?} leaves no CPU for eventd and the bare loop",
        args.cluster_cpus
    );
    let mut cluster = args.cluster_cpus.clone();
    cluster.sort_unstable();
    cluster.dedup();
    Ok(Some(CpuSplit { cluster, client }))
}

/// The round of `format` at the default batch whose export / bare ratio is
/// the median of its rounds (the upper one of an even count).
fn median_pair(pairs: &[Pair], format: Format) -> Option<&Pair> {
    let at = pairs
        .iter()
        .filter(|p| p.format == format && p.batch_rows == BATCH_DEFAULT);
    runner::median_by(at, |p| p.ratio)
}

/// The smallest batch whose export rate is within 10 % of the best
/// (smaller batches: less memory, less lag at low rates), RowBinary.
fn batch_choice(pairs: &[Pair]) -> u64 {
    let rb: Vec<&Pair> = pairs
        .iter()
        .filter(|p| p.format == Format::RowBinary)
        .collect();
    let best = rb.iter().map(|p| p.export.rows_per_s).fold(0f64, f64::max);
    rb.iter()
        .filter(|p| p.export.rows_per_s >= 0.9 * best)
        .map(|p| p.batch_rows)
        .min()
        .unwrap_or(BATCH_DEFAULT)
}

/// Stops with the `apt-get` line where the cluster cannot run.
pub(crate) fn require_cluster() -> anyhow::Result<()> {
    if let Err(why) = Cluster::available() {
        bail!(
            "the export scenario runs a private ClickHouse cluster and ZooKeeper, and this \
             machine cannot: {why}\ninstall them (as root) with: {APT_INSTALL}"
        );
    }
    Ok(())
}

/// The export scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::cli::Common,
    #[command(flatten)]
    system: crate::cli::System,
    /// Seconds of each ingest point, export off and on (default 10).
    #[arg(long)]
    duration: Option<f64>,
    #[command(flatten)]
    bytes: crate::cli::EventBytes,
    /// Events stored before they are exported.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// ExportBatchRows values measured (RowBinary).
    #[arg(long, value_delimiter = ',', default_value = "5000,50000,200000")]
    batch_rows: Vec<u64>,
    /// Replicas of each of the cluster's two ClickHouse shards.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// One ClickHouse server without ZooKeeper (the single-server schema)
    /// instead of 2 shards × --replicas.
    #[arg(long)]
    single: bool,
    /// Seconds of the paced load (export lag).
    #[arg(long, default_value_t = 15.0)]
    lag_secs: f64,
    /// ExportNice of every eventd started (default: eventd's own).
    #[arg(long, default_value_t = eventd::config::EXPORT_NICE_DEFAULT as i32)]
    export_nice: i32,
    /// CPUs the ClickHouse servers and ZooKeeper run on (default: all,
    /// shared with eventd and the bare loop); eventd, the bare loop and
    /// the load then run on the other CPUs, as they would beside a cluster
    /// on machines of its own.
    #[arg(long, value_delimiter = ',')]
    cluster_cpus: Vec<u32>,
}

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.system.setup()?, args.bytes.sizes()?, &work)
}

// Longer than the ~70 lines a function should be: the scenario's phases in
// the order they run, each a call and a progress line.
/// Runs the scenario; prints its tables; writes `export.json`; returns the
/// machine-readable summary line.
pub(crate) fn run(
    args: &Args,
    setup: &pipeline::Setup,
    sizes: Sizes,
    work: &Path,
) -> anyhow::Result<String> {
    require_cluster()?;
    elapsed();
    // The cluster's directory goes under the work directory (absolute: the
    // servers run in their own directories), where its processes are easy
    // to tell from anyone else's.
    let work = work.canonicalize()?;
    // Fails only when already set, to this same directory.
    let _ = tempfile::env::override_temp_dir(&work);
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(Duration::from_millis(200));
    progress.set_message(format!(
        "starting 2 × {} ClickHouse and ZooKeeper",
        args.replicas
    ));
    let t = Instant::now();
    let split = split_cpus(args)?;
    if let Some(s) = &split {
        crate::load::run_on(&s.cluster).context("--cluster-cpus")?;
    }
    let mut ch = Ch::start(args.replicas, args.single)?;
    // Whatever this thread starts from here on (eventd, the bare loop's
    // threads, producers) runs on the other CPUs.
    if let Some(s) = &split {
        crate::load::run_on(&s.client).context("--cluster-cpus")?;
        s.check(&ch.pids())?;
    }
    ch.split = split;
    let shards = ch.cluster.shards();
    let host_shard = ch
        .client
        .text(
            &format!("SELECT cityHash64({}) % {shards} + 1", quote(HOST)),
            &[],
        )?
        .trim()
        .to_string();
    progress.suspend(|| {
        eprintln!(
            "[{:3.0} s] ClickHouse {} {} in {} ({:.1} s); host {HOST} goes to shard \
             {host_shard}; {}",
            elapsed(),
            ch.version,
            ch.layout(),
            ch.cluster.dir().display(),
            t.elapsed().as_secs_f64(),
            CpuSplit::describe(ch.split.as_ref())
        )
    });
    let filled = fill(&work, setup, sizes, args.rows, &progress)?;
    progress.suspend(|| {
        eprintln!(
            "[{:3.0} s] store: {} events and {} gaps in {} files ({:.0} events/s), export off",
            elapsed(),
            filled.events,
            filled.gaps,
            filled.files.len(),
            filled.events_per_s
        )
    });
    let mut points: Vec<(Format, u64)> = args
        .batch_rows
        .iter()
        .map(|&b| (Format::RowBinary, b))
        .collect();
    points.push((Format::JsonEachRow, BATCH_DEFAULT));
    // Each point `--repeat` times, the rounds interleaved: the bare rate of
    // one point moved by up to 1.35x within minutes on this machine, so
    // the ratio is judged by its median over rounds.
    let rounds: Vec<(usize, Format, u64)> = (0..args.common.repeat.max(1))
        .flat_map(|round| points.iter().map(move |&(f, b)| (round + 1, f, b)))
        .collect();
    let mut pairs = Vec::new();
    for (round, format, batch) in rounds {
        progress.set_message(format!("bare {} {batch}", format.name()));
        let (bodies, encode_secs) = encode_all(&filled.files, format, batch)?;
        let bare_encoded = bare(&mut ch, &filled, format, batch, Some(&bodies))?;
        drop(bodies);
        progress.set_message(format!(
            "bare {} {batch}, reading in the loop",
            format.name()
        ));
        let bare_inline = bare(&mut ch, &filled, format, batch, None)?;
        let mut export = export_run(
            &mut ch,
            setup,
            &filled,
            (format, batch, args.export_nice),
            &progress,
        )?;
        export.batches = export.batches.max(1);
        let p = Pair {
            round,
            format,
            batch_rows: batch,
            ratio: export.rows_per_s / bare_encoded.rows_per_s,
            ratio_inline: export.rows_per_s / bare_inline.rows_per_s,
            export,
            bare: bare_encoded,
            bare_inline,
            read_encode_rows_per_s: filled.rows() as f64 / encode_secs,
        };
        progress.suspend(|| {
            eprintln!(
                "[{:3.0} s] round {round}, {} {batch}: export {:.0} rows/s, bare {:.0} rows/s (ratio {:.2}), bare reading \
                 in the loop {:.0} rows/s (ratio {:.2}); export CPU {:.0} ns/row; files per worker \
                 {:?}, done at {:.2?} s; in ClickHouse {}/{} and {}/{}",
                elapsed(),
                format.name(),
                p.export.rows_per_s,
                p.bare.rows_per_s,
                p.ratio,
                p.bare_inline.rows_per_s,
                p.ratio_inline,
                p.export.client_cpu_ns_per_row,
                p.export.files_per_worker,
                p.export.file_done_secs,
                p.export.rows_in_clickhouse,
                p.export.rows,
                p.bare.rows_in_clickhouse,
                p.bare.rows
            )
        });
        pairs.push(p);
    }
    let ingest = ingest(&mut ch, args, setup, sizes, &work, &progress)?;
    let ratios: Vec<f64> = ingest.iter().map(|r| r.ratio).collect();
    let median = runner::median(&ratios);
    let niced: Vec<f64> = ingest.iter().map(|r| r.ratio_cluster_niced).collect();
    let median_niced = runner::median(&niced);
    // Half of what the pipeline takes with export on: with the cluster on
    // the same CPUs, half the export-off rate can be more than that.
    let on_rate = ingest
        .iter()
        .map(|r| r.on.events_per_s)
        .fold(0f64, f64::max);
    let half = ((on_rate / 2.0) as u64).max(1);
    let lag = lag_run(
        &mut ch,
        setup,
        &work,
        sizes,
        (
            half,
            Duration::from_secs_f64(args.lag_secs),
            args.export_nice,
        ),
        &progress,
    )?;
    progress.finish_and_clear();
    let choice = batch_choice(&pairs);
    print_tables(&ch, args, &filled, &pairs, &ingest, &lag, choice);
    let report = ExportReportFile {
        clickhouse: ch.version.clone(),
        shards: ch.cluster.shards(),
        replicas: ch.cluster.replicas(),
        host_shard,
        system: setup.system.clone(),
        fill_events: filled.events,
        fill_gaps: filled.gaps,
        fill_events_per_s: filled.events_per_s,
        pairs: &pairs,
        ingest: &ingest,
        lag: &lag,
        batch_rows_choice: choice,
        cluster_cpus: ch
            .split
            .as_ref()
            .map(|s| s.cluster.clone())
            .unwrap_or_default(),
        client_cpus: ch
            .split
            .as_ref()
            .map(|s| s.client.clone())
            .unwrap_or_default(),
    };
    let json = runner::write_report(&args.common.output.results, "export", &report)?;
    println!("\nreport: {}", json.display());
    let headline = median_pair(&pairs, Format::RowBinary)
        .or(pairs.first())
        .context("no export point")?;
    let json_pair = median_pair(&pairs, Format::JsonEachRow);
    let lost_rows: u64 = pairs
        .iter()
        .map(|p| {
            [&p.export, &p.bare, &p.bare_inline]
                .iter()
                .map(|r| r.rows.abs_diff(r.rows_in_clickhouse))
                .sum::<u64>()
        })
        .sum::<u64>()
        + lag.stored.abs_diff(lag.rows_in_clickhouse);
    Ok(format!(
        "export_rows_per_s={:.0} bare_rows_per_s={:.0} export_ratio_to_bare={:.2} \
         json_to_rowbinary={:.2} ingest_on_to_off={median:.2} \
         ingest_on_to_off_cluster_niced={median_niced:.2} lag_p99_ms={:.0} \
         cpu_ns_per_row={:.0} batch_rows_choice={choice} mismatched_rows={lost_rows}",
        headline.export.rows_per_s,
        headline.bare.rows_per_s,
        headline.ratio,
        json_pair.map_or(f64::NAN, |j| j.export.rows_per_s
            / headline.export.rows_per_s),
        lag.cursor_lag_ms_p99,
        headline.export.client_cpu_ns_per_row,
    ))
}

// Longer than the ~70 lines a function should be: the scenario's tables,
// one println after another.
fn print_tables(
    ch: &Ch,
    args: &Args,
    filled: &Filled,
    pairs: &[Pair],
    ingest: &[IngestFigures],
    lag: &LagFigures,
    choice: u64,
) {
    let machine = runner::Machine::describe();
    println!(
        "\n## export ({} CPUs, {}; ClickHouse {} {}; {}; {} rows, \
         messages of {} bytes; eventd {:?})\n",
        machine.cpus,
        machine.model,
        ch.version,
        ch.layout(),
        CpuSplit::describe(ch.split.as_ref()),
        filled.rows(),
        args.bytes.event_bytes,
        args.system.system
    );
    println!(
        "| round | format | ExportBatchRows | export rows/s | export rows/s, first to last full batch \
         | bare rows/s | export / bare | bare, \
         read+encode in the loop, rows/s | export / that | export s | first batch s | batches | files per export worker \
         | export threads CPU ns/row | eventd process CPU ns/row | bare client CPU ns/row \
         (encoded / in the loop) | ClickHouse CPU ns/row (export / bare) | read+encode rows/s, \
         1 thread | rows in ClickHouse (export, bare, bare in the loop) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in pairs {
        println!(
            "| {} | {} | {} | {:.0} | {} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {:?} | {:.0} | {} | \
             {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {}, {}, {} of {} |",
            p.round,
            p.format.name(),
            p.batch_rows,
            p.export.rows_per_s,
            p.export
                .steady_rows_per_s
                .map_or("-".to_string(), |r| format!("{r:.0}")),
            p.bare.rows_per_s,
            p.ratio,
            p.bare_inline.rows_per_s,
            p.ratio_inline,
            p.export.secs,
            p.export
                .first_batch_secs
                .map_or("-".to_string(), |s| format!("{s:.2}")),
            p.export.batches,
            p.export.files_per_worker,
            p.export.client_cpu_ns_per_row,
            p.export
                .process_cpu_ns_per_row
                .map_or("n/a (in-process)".to_string(), |n| format!("{n:.0}")),
            p.bare.client_cpu_ns_per_row,
            p.bare_inline.client_cpu_ns_per_row,
            p.export.server_cpu_ns_per_row,
            p.bare.server_cpu_ns_per_row,
            p.read_encode_rows_per_s,
            p.export.rows_in_clickhouse,
            p.bare.rows_in_clickhouse,
            p.bare_inline.rows_in_clickhouse,
            p.export.rows,
        );
    }
    if args.common.repeat > 1 {
        let points = pairs
            .iter()
            .filter(|p| p.round == 1)
            .map(|p| (p.format, p.batch_rows));
        for (format, batch) in points {
            let mut ratios: Vec<f64> = pairs
                .iter()
                .filter(|p| p.format == format && p.batch_rows == batch)
                .map(|p| p.ratio)
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "\n{} {batch}: export / bare by round, sorted: {:.2?} (median {:.2})",
                format.name(),
                ratios,
                runner::median(&ratios)
            );
        }
    }
    let at = |f: Format| median_pair(pairs, f);
    if let (Some(rb), Some(js)) = (at(Format::RowBinary), at(Format::JsonEachRow)) {
        println!(
            "\nformats at {BATCH_DEFAULT}: export RowBinary {:.0} vs JSONEachRow {:.0} rows/s \
             (JSON / RowBinary {:.2}); bare {:.0} vs {:.0} ({:.2}); bare reading in the loop \
             {:.0} vs {:.0} ({:.2}); export threads' CPU {:.0} vs {:.0} ns/row; read+encode \
             {:.0} vs {:.0} rows/s",
            rb.export.rows_per_s,
            js.export.rows_per_s,
            js.export.rows_per_s / rb.export.rows_per_s,
            rb.bare.rows_per_s,
            js.bare.rows_per_s,
            js.bare.rows_per_s / rb.bare.rows_per_s,
            rb.bare_inline.rows_per_s,
            js.bare_inline.rows_per_s,
            js.bare_inline.rows_per_s / rb.bare_inline.rows_per_s,
            rb.export.client_cpu_ns_per_row,
            js.export.client_cpu_ns_per_row,
            rb.read_encode_rows_per_s,
            js.read_encode_rows_per_s,
        );
    }
    println!(
        "\n| ingest round | export off events/s | export on (RowBinary, ExportBatchRows \
         {BATCH_DEFAULT}) events/s | on / off | on, ClickHouse at nice 19 | that / off | lost off / \
         on / niced | ClickHouse CPUs busy off / on / niced | events in ClickHouse when the on / \
         niced point ended |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, r) in ingest.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {} / {} / {} | {:.2} / {:.2} / {:.2} \
             | {} / {} |",
            i + 1,
            r.off.events_per_s,
            r.on.events_per_s,
            r.ratio,
            r.on_cluster_niced.events_per_s,
            r.ratio_cluster_niced,
            r.off.lost,
            r.on.lost,
            r.on_cluster_niced.lost,
            r.clickhouse_cpus_off,
            r.clickhouse_cpus_on,
            r.clickhouse_cpus_niced,
            r.exported_during_point,
            r.exported_during_niced_point
        );
    }
    println!(
        "\n| ingest round | p99 emit→commit off / on / niced (ms) | largest WAL file during \
         the point off / on / niced (MiB) | after the drain (MiB) |"
    );
    println!("|---|---|---|---|");
    for (i, r) in ingest.iter().enumerate() {
        let [off, on, niced] = [&r.off, &r.on, &r.on_cluster_niced];
        println!(
            "| {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} |",
            i + 1,
            off.latency_us_p99 as f64 / 1e3,
            on.latency_us_p99 as f64 / 1e3,
            niced.latency_us_p99 as f64 / 1e3,
            off.wal_peak_mib,
            on.wal_peak_mib,
            niced.wal_peak_mib,
            off.wal_end_mib,
            on.wal_end_mib,
            niced.wal_end_mib,
        );
    }
    println!(
        "\nlag at {} events/s (half the export-on ingest rate) for {:.0} s, ExportBatchRows \
         {BATCH_DEFAULT}: oldest stored event ClickHouse has not confirmed (exporter's cursor, \
         {} samples every 100 ms) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; status lag_seconds \
         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; caught up {:.2} s after the load; lost {}; \
         {} stored, {} in ClickHouse",
        lag.rate,
        lag.secs,
        lag.samples,
        lag.cursor_lag_ms_p50,
        lag.cursor_lag_ms_p99,
        lag.cursor_lag_ms_max,
        lag.status_lag_ms_p50,
        lag.status_lag_ms_p99,
        lag.status_lag_ms_max,
        lag.catch_up_secs,
        lag.lost,
        lag.stored,
        lag.rows_in_clickhouse
    );
    println!(
        "\nExportBatchRows by measurement: {choice} (the smallest RowBinary batch within 10 % \
         of the best export rate)"
    );
    print_summary(pairs, ingest);
}

/// The two judgements of this run, each side's format named: ingest with
/// export on against off, and export against ClickHouse's bare insert.
fn print_summary(pairs: &[Pair], ingest: &[IngestFigures]) {
    let median = |v: Vec<f64>| runner::median(&v);
    let on_off = median(ingest.iter().map(|r| r.ratio).collect());
    let niced = median(ingest.iter().map(|r| r.ratio_cluster_niced).collect());
    println!(
        "\nsummary: ingest with export on / off {on_off:.2} (on: RowBinary, ExportBatchRows \
         {BATCH_DEFAULT}; off: no export; median of {} rounds), {niced:.2} with ClickHouse at \
         nice 19",
        ingest.len()
    );
    for format in [Format::RowBinary, Format::JsonEachRow] {
        if let Some(p) = median_pair(pairs, format) {
            println!(
                "summary: export / bare insert {:.2} (export: eventd, {} batches of {}; bare: \
                 the same rows as {} batches of {}, encoded before the clock, with the \
                 exporter's insert settings)",
                p.ratio,
                p.format.name(),
                p.batch_rows,
                p.format.name(),
                p.batch_rows
            );
        }
    }
}
