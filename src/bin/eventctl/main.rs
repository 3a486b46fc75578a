//! `eventctl`: the command-line client of eventd.

use anyhow::{bail, Context};
use clap::Parser;
use cli::{Args, Command, EmitArgs, StatsArgs};
use eventd::config::{ConfigFile, Settings};
use eventd::query::Request;
use eventd::rings::attach::EmitRingError;
use eventd::rings::{now_ns, Emitter, Event};
use std::io::BufRead;
use std::path::PathBuf;
use stdio::{say, Stdout};

mod cli;
mod export;
mod pager;
mod query;
mod run;
mod sink;
mod stdio;

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say!("eventctl: {}", eventd::errors::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The data directory of the package's eventd.service.
const DATA_DIR_INSTALLED: &str = "/var/lib/eventd";
/// The package's configuration file (a conffile).
const CONFIG_INSTALLED: &str = "/etc/eventd/eventd.toml";

/// The data directory: `--data-dir` or `EVENTD_DATA_DIR`; else
/// `./eventd-data` if it is a directory (a developer's eventd), else the
/// package's `/var/lib/eventd` if it is one, else `./eventd-data` (whose
/// absence the command then names).
fn data_dir(given: Option<PathBuf>) -> PathBuf {
    if let Some(dir) = given {
        return dir;
    }
    let local = PathBuf::from(eventd::config::DATA_DIR_DEFAULT);
    if !local.is_dir() && std::path::Path::new(DATA_DIR_INSTALLED).is_dir() {
        return PathBuf::from(DATA_DIR_INSTALLED);
    }
    local
}

/// The configuration file: `--config` or `EVENTD_CONFIG`; else the
/// package's, when the data directory is the package's and the file is
/// there (so a KmesDir or RunDir moved there is followed); else none.
fn config_file(given: Option<PathBuf>, data_dir: &std::path::Path) -> Option<PathBuf> {
    given.or_else(|| {
        let installed = std::path::Path::new(CONFIG_INSTALLED);
        (data_dir == std::path::Path::new(DATA_DIR_INSTALLED) && installed.is_file())
            .then(|| installed.to_path_buf())
    })
}

fn run(args: Args) -> anyhow::Result<()> {
    let data_dir = data_dir(args.data_dir);
    let file = match config_file(args.config, &data_dir) {
        Some(path) => ConfigFile::load(&path)?,
        None => ConfigFile::default(),
    };
    let settings = file.resolve(&data_dir)?;
    let socket = settings.run_dir.join("query.sock");
    match args.command {
        Command::Emit(emit) => run_emit(&settings, emit),
        Command::Query(q) => query::run(&settings, q),
        Command::Stats(StatsArgs { prometheus: false }) => report(&socket, Request::Stats),
        Command::Stats(StatsArgs { prometheus: true }) => report(&socket, Request::Metrics),
        Command::Shards => report(&socket, Request::Shards),
        Command::Config => report(&socket, Request::Config),
        Command::Export(command) => export::run(&settings, command),
        Command::Run(r) => run::run(&settings, r),
    }
}

/// The message for an `{"error":{...}}` answer.
fn refusal(what: &str, error: &serde_json::Value) -> String {
    format!(
        "eventd refused {what} ({}): {}",
        error["code"].as_str().unwrap_or("?"),
        error["message"].as_str().unwrap_or("")
    )
}

fn report(socket: &std::path::Path, request: Request) -> anyhow::Result<()> {
    use std::io::Write;
    let mut failure = None;
    let mut out = Stdout::lock();
    eventd::query::client::call(socket, &request, |v| {
        if let Some(e) = v.get("error") {
            failure = Some(refusal("the request", e));
        } else {
            let text = match v.get("metrics").and_then(|m| m.as_str()) {
                Some(metrics) => metrics.to_string(),
                None => serde_json::to_string_pretty(&v).map_err(std::io::Error::other)? + "\n",
            };
            out.write_all(text.as_bytes())?;
        }
        Ok(true)
    })?;
    out.flush()?;
    match failure {
        Some(f) => bail!(f),
        None => Ok(()),
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
    let emitter = Emitter::open(kmes).map_err(|e| match e {
        // Says all there is to say (who may emit, and the way everyone may).
        e @ eventd::rings::RingError::NotAProducer { .. } => anyhow::Error::new(e),
        other => anyhow::Error::new(other).context(format!(
            "no rings in {} (is eventd running there?)",
            kmes.display()
        )),
    })?;
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
                Some(e) => bail!(
                    "{failed} of {total} events not written (last: {})",
                    eventd::errors::error_chain(&e)
                ),
            }
        }
    }
}
