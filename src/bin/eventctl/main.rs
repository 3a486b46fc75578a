//! `eventctl`: the command-line client of eventd.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use eventd::config::{ConfigFile, Settings, DATA_DIR_DEFAULT};
use eventd::query::render::{Output, Renderer};
use eventd::query::{
    Cursor, EventRow, FanOut, Filter, GapCursor, GapRow, Order, PageCursor, Request,
};
use eventd::rings::attach::EmitRingError;
use eventd::rings::{now_ns, Emitter, Event, Level};
use std::io::BufRead;
use std::path::PathBuf;
use stdio::{say, Stdout};

mod export;
mod run;
mod stdio;

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
    /// List stored events from every shard, merged in time order.
    Query(QueryArgs),
    /// What the daemon knows now: per ring, channel and shard, queries and
    /// retention.
    Stats(StatsArgs),
    /// Shard files: size, event count, active or historical.
    Shards,
    /// The daemon's effective settings.
    Config,
    /// The ClickHouse export: create the tables, see how far it got.
    #[command(subcommand)]
    Export(export::ExportCommand),
    /// Run a command with each line of its stdout and stderr stored as an
    /// event, record how it ended, and exit as it did (systemd-cat's role).
    Run(run::RunArgs),
}

#[derive(clap::Args)]
struct QueryArgs {
    /// Events at or after this time: RFC 3339 ("2026-11-30T10:00:00Z") or
    /// an age ("10m", "2h", "1d").
    #[arg(long)]
    since: Option<String>,
    /// Events before this time (same forms as --since).
    #[arg(long)]
    until: Option<String>,
    #[arg(long)]
    cpu: Option<u32>,
    /// This level or more severe (emerg … debug).
    #[arg(long)]
    level: Option<Level>,
    #[arg(long)]
    provider: Option<String>,
    #[arg(long)]
    name: Option<String>,
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long)]
    uid: Option<u32>,
    /// Only messages containing this text.
    #[arg(long)]
    grep: Option<String>,
    /// Structured field equality KEY=VALUE (repeatable).
    #[arg(long = "field", value_name = "KEY=VALUE")]
    fields: Vec<String>,
    /// At most this many events and this many gaps; the cursor of the next
    /// page is printed.
    #[arg(long)]
    limit: Option<u64>,
    /// Continue after a previous page's cursor (its events and its gaps).
    #[arg(long)]
    cursor: Option<String>,
    /// Newest first.
    #[arg(long)]
    reverse: bool,
    /// Keep streaming events as they commit.
    #[arg(long, short = 'f', conflicts_with_all = ["offline", "limit"])]
    follow: bool,
    /// Read the shard files directly instead of asking the daemon.
    #[arg(long)]
    offline: bool,
    /// Query the whole fleet in this ClickHouse cluster (its HTTP URL, e.g.
    /// http://127.0.0.1:8123/) instead of this host's daemon.
    #[arg(long, value_name = "URL", conflicts_with_all = ["offline", "follow"])]
    cluster: Option<String>,
    /// With --cluster: only this host (repeatable).
    #[arg(long = "host", value_name = "NAME", requires = "cluster")]
    hosts: Vec<String>,
    /// With --cluster: the database of eventd's tables (default:
    /// ExportDatabase, "eventd").
    #[arg(long, requires = "cluster")]
    database: Option<String>,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
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

#[derive(clap::Args)]
struct StatsArgs {
    /// Print the Prometheus text exposition format instead of JSON.
    #[arg(long)]
    prometheus: bool,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say!("eventctl: {}", eventd::errors::error_chain(e.as_ref()));
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
    let socket = settings.run_dir.join("query.sock");
    match args.command {
        Command::Emit(emit) => run_emit(&settings, emit),
        Command::Query(q) => run_query(&settings, q),
        Command::Stats(StatsArgs { prometheus: false }) => report(&socket, Request::Stats),
        Command::Stats(StatsArgs { prometheus: true }) => report(&socket, Request::Metrics),
        Command::Shards => report(&socket, Request::Shards),
        Command::Config => report(&socket, Request::Config),
        Command::Export(command) => export::run(&settings, command),
        Command::Run(r) => run::run(&settings, r),
    }
}

/// A point in time from the command line: RFC 3339, or an age before now.
fn parse_time(text: &str) -> anyhow::Result<i64> {
    let system_ns = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    };
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(system_ns(t));
    }
    match humantime::parse_duration(text) {
        Ok(age) => Ok(now_ns() - age.as_nanos() as i64),
        Err(_) => bail!(
            "{text:?} is neither an RFC 3339 time (2026-11-30T10:00:00Z) nor an age (10m, 2h)"
        ),
    }
}

fn filter_of(q: &QueryArgs) -> anyhow::Result<Filter> {
    let mut fields = Vec::new();
    for kv in &q.fields {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--field {kv:?}: expected KEY=VALUE");
        };
        fields.push((k.to_string(), v.to_string()));
    }
    // A fleet query's cursor is its own (it names hosts too).
    let page = match (&q.cursor, &q.cluster) {
        (Some(t), None) => {
            PageCursor::parse(t).with_context(|| format!("--cursor {t:?} is not a cursor"))?
        }
        _ => PageCursor::default(),
    };
    Ok(Filter {
        since_ns: q.since.as_deref().map(parse_time).transpose()?,
        until_ns: q.until.as_deref().map(parse_time).transpose()?,
        cpu: q.cpu,
        level: q.level.map(|l| l as u8),
        provider: q.provider.clone(),
        name: q.name.clone(),
        pid: q.pid,
        uid: q.uid,
        text: q.grep.clone(),
        fields,
        order: if q.reverse {
            Order::NewestFirst
        } else {
            Order::OldestFirst
        },
        after: page.events,
        gaps_after: page.gaps,
        limit: q.limit,
    })
}

fn run_query(settings: &Settings, q: QueryArgs) -> anyhow::Result<()> {
    if let Some(url) = &q.cluster {
        let filter = filter_of(&q)?;
        let cluster = export::ClusterArgs {
            url: Some(url.clone()),
            database: q.database.clone(),
            user: None,
            password_file: None,
        };
        return export::fleet_query(
            settings,
            &cluster,
            &q.hosts,
            &filter,
            q.cursor.as_deref(),
            q.output,
        );
    }
    let filter = filter_of(&q)?;
    let stdout = Stdout::lock();
    let colour = stdout.is_terminal();
    let mut out = Renderer::new(stdout, q.output, colour);
    let mut page = Page {
        events: 0,
        gaps: 0,
        next: PageCursor {
            events: filter.after,
            gaps: filter.gaps_after,
        },
    };
    if q.offline {
        query_files(settings, &filter, &mut out, &mut page)?;
    } else {
        query_daemon(settings, &filter, q.follow, &mut out, &mut page)?;
    }
    out.flush()?;
    // A full page of either listing may have more behind it.
    if let Some(limit) = filter.limit {
        if page.events == limit || page.gaps == limit {
            say!("next page: --cursor {}", page.next.token());
        }
    }
    Ok(())
}

/// Rows of one page, and where each listing stands after it.
struct Page {
    events: u64,
    gaps: u64,
    next: PageCursor,
}

/// `--offline`: the same streaming reader the daemon runs, on the files.
fn query_files<W: std::io::Write>(
    settings: &Settings,
    filter: &Filter,
    out: &mut Renderer<W>,
    page: &mut Page,
) -> anyhow::Result<()> {
    let mut fan = FanOut::open(&settings.store_dir, filter.clone(), None)
        .with_context(|| format!("reading {}", settings.store_dir.display()))?;
    while let Some(e) = fan.next_event() {
        page.next.events = Some(e.cursor());
        page.events += 1;
        out.event(&e)?;
    }
    while let Some(g) = fan.next_gap() {
        page.next.gaps = Some(g.cursor());
        page.gaps += 1;
        out.gap(&g)?;
    }
    for w in &fan.warnings {
        say!("eventctl: warning: {w}");
    }
    Ok(())
}

/// Asks the daemon, printing its answer as it comes.
fn query_daemon<W: std::io::Write>(
    settings: &Settings,
    filter: &Filter,
    follow: bool,
    out: &mut Renderer<W>,
    page: &mut Page,
) -> anyhow::Result<()> {
    let request = Request::Query {
        filter: filter.clone(),
        follow,
    };
    let mut failure = None;
    let mut ended = false;
    eventd::query::client::call(&settings.run_dir.join("query.sock"), &request, |v| {
        if let Some(end) = v.get("end") {
            ended = true;
            // The daemon says where both listings stand; an older daemon
            // sends no gap cursor.
            let token = |key: &str| end.get(key).and_then(|t| t.as_str()).map(str::to_string);
            if let Some(c) = token("cursor").as_deref().and_then(Cursor::parse) {
                page.next.events = Some(c);
            }
            if let Some(c) = token("gap_cursor").as_deref().and_then(GapCursor::parse) {
                page.next.gaps = Some(c);
            }
        } else if let Some(e) = v.get("event") {
            let e: EventRow = serde_json::from_value(e.clone()).map_err(std::io::Error::other)?;
            page.next.events = Some(e.cursor());
            page.events += 1;
            out.event(&e)?;
            if follow {
                out.flush()?;
            }
        } else if let Some(g) = v.get("gap") {
            let g: GapRow = serde_json::from_value(g.clone()).map_err(std::io::Error::other)?;
            page.next.gaps = Some(g.cursor());
            page.gaps += 1;
            out.gap(&g)?;
        } else if let Some(w) = v.get("warning") {
            say!("eventctl: warning: {}", w.as_str().unwrap_or_default());
        } else if let Some(e) = v.get("error") {
            failure = Some(refusal("the query", e));
        }
        Ok(true)
    })?;
    if let Some(f) = failure {
        bail!(f);
    }
    if !follow && !ended {
        bail!("eventd closed the connection before the end of the results");
    }
    Ok(())
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
