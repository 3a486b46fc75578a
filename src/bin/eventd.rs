//! `eventd`: argument parsing and a call into the library.

use anyhow::Context;
use clap::Parser;
use eventd::config::{ConfigFile, DATA_DIR_DEFAULT};
use eventd::daemon::signals::ShutdownSignals;
use eventd::daemon::{Daemon, Tunables};
use std::path::PathBuf;

/// Per-host event collection daemon: drains the per-CPU KMES rings into
/// sharded SQLite databases.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Data directory: rings in DIR/kmes, shards in DIR/store, sockets in DIR/run.
    #[arg(long, global = true, value_name = "DIR", default_value = DATA_DIR_DEFAULT)]
    data_dir: PathBuf,
    /// TOML configuration file (seed key names; see packaging/eventd.toml).
    /// Without it eventd runs with embedded defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Stripe length L (R5); internal, for tests and the load harness.
    #[arg(long, hide = true, value_name = "N")]
    stripe_len: Option<std::num::NonZeroU32>,
    /// Slots of each shard channel; internal, for tests and the load harness.
    #[arg(long, hide = true, value_name = "N")]
    channel_slots: Option<usize>,
    /// Byte budget of each shard channel; internal, as above.
    #[arg(long, hide = true, value_name = "BYTES")]
    channel_bytes: Option<u64>,
    /// Log line format on stderr. The level filter comes from EVENTD_LOG
    /// (tracing's EnvFilter syntax, e.g. "info" or "eventd=debug"; default
    /// "info").
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Milliseconds between retention passes; internal, for tests.
    #[arg(long, hide = true, value_name = "MS")]
    retention_interval_ms: Option<u64>,
    /// The export stage's HTTP deadline in milliseconds; internal, for
    /// tests.
    #[arg(long, hide = true, value_name = "MS")]
    export_timeout_ms: Option<u64>,
    /// The export stage's batch format; internal, for the load harness.
    #[arg(long, hide = true, value_enum)]
    export_format: Option<eventd::export::format::Format>,
    /// Export worker threads (0 = one per shard, at most 4); internal.
    #[arg(long, hide = true)]
    export_workers: Option<usize>,
    /// Attach the rings of CPUs 0..N, not of the online CPUs: for the load
    /// harness only (`eventd-perf scale` simulates a bigger machine).
    #[arg(long, hide = true, value_name = "N")]
    simulate_cpus: Option<u32>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// One human-readable line per event, fields as key=value.
    Text,
    /// One JSON object per line (for journald or a log shipper).
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = match std::env::var("EVENTD_LOG") {
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
        Ok(text) => tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!("eventd: EVENTD_LOG={text:?} is not a log filter ({e}); using \"info\"");
            tracing_subscriber::EnvFilter::new("info")
        }),
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not for a file or journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The whole chain of causes, as text: it names the file, key or
            // limit that stopped eventd.
            tracing::error!("{}", eventd::errors::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let mut settings = file.resolve(&args.data_dir)?;
    settings.config_file = args.config.clone();
    let signals = ShutdownSignals::block().context("blocking shutdown signals")?;
    let defaults = Tunables::default();
    let tunables = Tunables {
        stripe_len: args.stripe_len.unwrap_or(defaults.stripe_len),
        channel: match (args.channel_slots, args.channel_bytes) {
            (None, None) => None,
            (slots, bytes) => {
                let auto = defaults.channel_for(1);
                Some(eventd::channel::Capacity {
                    slots: slots.unwrap_or(auto.slots),
                    bytes: bytes.unwrap_or(auto.bytes),
                })
            }
        },
        retention_interval: args.retention_interval_ms.map_or(
            defaults.retention_interval,
            std::time::Duration::from_millis,
        ),
        export: eventd::export::ExportTunables {
            timeout: args
                .export_timeout_ms
                .map_or(defaults.export.timeout, std::time::Duration::from_millis),
            format: args.export_format.unwrap_or(defaults.export.format),
            workers: args.export_workers.unwrap_or(defaults.export.workers),
        },
        simulated_cpus: args.simulate_cpus,
    };
    // A drain or writer that stops on its own ends the process (exit 1),
    // so that the service manager restarts it: SIGTERM to ourselves wakes
    // the main thread's sigwait.
    let on_failure: eventd::daemon::FailureHook = std::sync::Arc::new(|_what: &str| {
        // SAFETY: kill with our own pid has no memory effects.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    });
    let daemon = Daemon::start(&settings, tunables, on_failure)?;
    tracing::info!(data_dir = %settings.data_dir.display(), "eventd running");
    let signal = loop {
        match signals.wait().context("waiting for a signal")? {
            libc::SIGHUP => daemon.reload(),
            other => break other,
        }
    };
    tracing::info!(signal, "stopping; writers commit what they hold");
    daemon.join()?;
    tracing::info!("stopped");
    Ok(())
}
