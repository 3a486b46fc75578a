//! The fields scenario's options and the fixed parameters of its phases.

/// Threads that fill and index the shard files (this machine's CPUs).
pub(super) const THREADS: usize = 2;
/// The indexes whose cost is measured.
pub(super) const CANDIDATES: &[&str] = &["provider", "name", "pid", "uid", "fields.unit"];
/// The indexes of the query phase's indexed configuration.
pub(super) const QUERIED: &[&str] = &["provider", "name", "fields.unit"];
/// Runs of each query: the first is reported as cold, the median of the
/// others as warm.
pub(super) const RUNS: usize = 3;
/// Events each query asks for.
pub(super) const LIMIT: usize = 100;

pub(super) fn check_args(args: &Args) -> anyhow::Result<()> {
    let max = eventd::routing::STORAGE_SHARDS_MAX as usize;
    anyhow::ensure!(
        (1..=max).contains(&args.day_shards),
        "--day-shards {}: expected 1..={max}",
        args.day_shards
    );
    anyhow::ensure!(
        args.day_events > 0 && args.insert_rows > 0,
        "--day-events and --insert-rows must be positive"
    );
    Ok(())
}

/// The fields scenario's options.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(super) common: crate::cli::Common,
    #[command(flatten)]
    pub(super) system: crate::cli::System,
    /// Seconds of load of each eventd insert-cost point (default 10).
    #[arg(long)]
    pub(super) duration: Option<f64>,
    #[command(flatten)]
    pub(super) bytes: crate::cli::EventBytes,
    /// Events of the day-long store.
    #[arg(long, default_value_t = 100_000_000)]
    pub(super) day_events: u64,
    /// Shard files of the store (and of the insert-cost databases).
    #[arg(long, default_value_t = 16)]
    pub(super) day_shards: usize,
    /// Rows of each insert-cost measurement.
    #[arg(long, default_value_t = 4_000_000)]
    pub(super) insert_rows: u64,
}
