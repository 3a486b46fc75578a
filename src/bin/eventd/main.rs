//! `eventd`: argument parsing and a call into the library.

mod cli;

use anyhow::Context;
use clap::Parser;
use cli::{Args, LogFormat};
use eventd::config::ConfigFile;
use eventd::daemon::notify;
use eventd::daemon::signals::ShutdownSignals;
use eventd::daemon::watchdog::Watchdog;
use eventd::daemon::{Activation, Daemon, Tunables};

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
    // SAFETY: no thread runs yet (logging starts none), and nothing has
    // taken the descriptors the service manager passed.
    let sockets = unsafe { Activation::from_service_manager() }?;
    let file = match &args.config {
        Some(path) => ConfigFile::load(path)?,
        None => ConfigFile::default(),
    };
    let mut settings = file.resolve(&args.data_dir)?;
    settings.config_file = args.config.clone();
    let signals = ShutdownSignals::block().context("blocking shutdown signals")?;
    // A drain or writer that stops on its own ends the process (exit 1),
    // so that the service manager restarts it: SIGTERM to ourselves wakes
    // the main thread's sigwait.
    let on_failure: eventd::daemon::FailureHook = std::sync::Arc::new(|_what: &str| {
        // SAFETY: kill with our own pid has no memory effects.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    });
    let daemon = Daemon::start_with(&settings, tunables(&args), on_failure, sockets)?;
    let status = format!(
        "running: {} rings, {} shards",
        daemon.state.rings.len(),
        daemon.state.shards.len()
    );
    notify::ready(&status);
    let watchdog = start_watchdog(&daemon);
    tracing::info!(data_dir = %settings.data_dir.display(), "eventd running");
    let signal = loop {
        match signals.wait().context("waiting for a signal")? {
            libc::SIGHUP => {
                notify::reloading();
                daemon.reload();
                notify::ready(&status);
            }
            other => break other,
        }
    };
    notify::stopping();
    drop(watchdog);
    tracing::info!(signal, "stopping; writers commit what they hold");
    daemon.join()?;
    tracing::info!("stopped");
    Ok(())
}

/// The watchdog, when the service manager asks for one (WATCHDOG_USEC).
fn start_watchdog(daemon: &Daemon) -> Option<Watchdog> {
    let timeout = notify::watchdog_timeout()?;
    let ping: eventd::daemon::watchdog::Ping = Box::new(notify::watchdog_ping);
    match Watchdog::start(daemon.state.clone(), timeout, ping) {
        Ok(w) => Some(w),
        Err(e) => {
            // Without pings the service manager restarts eventd: said here.
            tracing::error!(error = %e, "cannot start the watchdog thread");
            None
        }
    }
}

/// The internal sizes: the defaults, or what the hidden options set.
fn tunables(args: &Args) -> Tunables {
    let defaults = Tunables::default();
    Tunables {
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
    }
}
