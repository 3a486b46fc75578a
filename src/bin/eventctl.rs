//! `eventctl`: the command-line client of eventd.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use eventd::config::{ConfigFile, Settings, DATA_DIR_DEFAULT};
use eventd::rings::attach::EmitRingError;
use eventd::rings::{now_ns, Emitter, Event, Level};
use std::io::BufRead;
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "Client of the eventd event collection daemon")]
struct Args {
    /// eventd's data directory (rings in DIR/kmes, shards in DIR/store).
    #[arg(long, global = true, value_name = "DIR", default_value = DATA_DIR_DEFAULT)]
    data_dir: PathBuf,
    /// eventd's configuration file, when it moves directories (KmesDir, ...).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Emit one event (or one per line of standard input) into the ring of
    /// the CPU this process runs on.
    Emit(EmitArgs),
}

#[derive(clap::Args)]
struct EmitArgs {
    /// Who emits (at most 255 bytes).
    #[arg(long)]
    provider: String,
    /// Syslog level: emerg, alert, crit, err, warning, notice, info, debug.
    #[arg(long, default_value = "info")]
    level: Level,
    /// Event name (at most 255 bytes).
    #[arg(long, default_value = "message")]
    name: String,
    /// A structured field KEY=VALUE (repeatable); stored as a JSON object.
    #[arg(long = "field", value_name = "KEY=VALUE")]
    fields: Vec<String>,
    /// Read messages from standard input, one event per line.
    #[arg(long, conflicts_with = "message")]
    stdin: bool,
    /// The message.
    #[arg(required_unless_present = "stdin")]
    message: Option<String>,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eventctl: {e:#}");
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
    match args.command {
        Command::Emit(emit) => run_emit(&settings, emit),
    }
}

fn run_emit(settings: &Settings, args: EmitArgs) -> anyhow::Result<()> {
    let mut fields = serde_json::Map::new();
    for kv in &args.fields {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--field {kv:?}: expected KEY=VALUE");
        };
        fields.insert(k.to_string(), serde_json::Value::String(v.to_string()));
    }
    let fields = if fields.is_empty() {
        String::new()
    } else {
        serde_json::Value::Object(fields).to_string()
    };
    let kmes = &settings.kmes_dir;
    let emitter = Emitter::open(kmes)
        .with_context(|| format!("no rings in {} (is eventd running there?)", kmes.display()))?;
    // SAFETY: getpid, gettid and getuid have no preconditions.
    let (pid, tid, uid) = unsafe { (libc::getpid(), libc::gettid(), libc::getuid()) };
    let emit = |message: &str| -> Result<(), EmitRingError> {
        let event = Event {
            ts_ns: now_ns(),
            pid: pid as u32,
            tid: tid as u32,
            uid,
            level: args.level,
            provider: &args.provider,
            name: &args.name,
            message,
            fields: &fields,
        };
        emitter.emit(&event)?;
        Ok(())
    };
    match &args.message {
        Some(message) => Ok(emit(message)?),
        None => {
            // One bad line (too long, or lost to a lapping ring) does not stop
            // the stream; the count is reported at the end.
            let (mut total, mut failed) = (0u64, 0u64);
            let mut last_error = None;
            for line in std::io::stdin().lock().lines() {
                total += 1;
                if let Err(e) = emit(&line.context("reading standard input")?) {
                    failed += 1;
                    last_error = Some(e);
                }
            }
            match last_error {
                None => Ok(()),
                Some(e) => bail!("{failed} of {total} events not written (last: {e:#})"),
            }
        }
    }
}
