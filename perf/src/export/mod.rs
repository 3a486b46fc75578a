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

mod bare;
mod ch;
mod export_run;
mod ingest;
mod lag;
mod options;
mod pairs;
mod report;
mod scenario;
mod store;

use anyhow::bail;
use eventd::export::format::Format;
use eventd::export::source::Encoding;
use eventd_cluster::Cluster;
pub(crate) use options::Args;
use scenario::run;
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

pub(crate) fn main(args: &Args) -> anyhow::Result<String> {
    let work = args.common.output.work()?;
    run(args, &args.system.setup()?, args.bytes.sizes()?, &work)
}
