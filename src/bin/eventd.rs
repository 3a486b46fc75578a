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
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let settings = file.resolve(&args.data_dir)?;
    let signals = ShutdownSignals::block().context("blocking shutdown signals")?;
    let daemon = Daemon::start(&settings, Tunables::default())?;
    log::info!(
        "eventd running, data directory {}",
        settings.data_dir.display()
    );
    let signal = signals.wait().context("waiting for a shutdown signal")?;
    log::info!("signal {signal}: stopping; writers commit what they hold");
    daemon.join()?;
    log::info!("stopped");
    Ok(())
}
