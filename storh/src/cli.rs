//! The `storh` commands. `--dir` names a DocStore collection, a segmented
//! log or a queue; `verify` and `stats` tell which from what it holds, the
//! record commands need a collection. Long walks (verify, reindex, stats,
//! index create) show a progress bar on a terminal.
//!
//! Exit status: 0 done, 1 `verify` found problems or `get` found nothing,
//! 2 an error (said on stderr).

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use storh::docstore::Collection;

#[derive(Parser)]
#[command(
    name = "storh",
    version,
    about = "Inspect and maintain storh collections, logs and queues"
)]
struct Cli {
    /// The collection, log or queue directory.
    #[arg(long, global = true, default_value = ".")]
    dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print one record as JSON.
    Get { id: String },
    /// Store a record (JSON from the argument, or stdin); prints its id.
    Put {
        /// Replace this record instead of inserting a new one.
        #[arg(long)]
        id: Option<String>,
        json: Option<String>,
    },
    /// Remove a record.
    Delete { id: String },
    /// Print records in id order, one JSON object per line.
    Stream {
        /// Start after this id (the last one of a previous page).
        #[arg(long)]
        after: Option<String>,
        /// At most this many records (default: all).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Print records whose FIELD equals VALUE (JSON, or else a string),
    /// from the field's index if it has one.
    Find {
        field: String,
        value: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Create, drop or list secondary indexes.
    Index {
        #[command(subcommand)]
        action: IndexAction,
    },
    /// Check every record file (or log segment, or the queue file).
    Verify,
    /// Rebuild every index of a collection from its files.
    Reindex,
    /// Print counts and sizes as JSON.
    Stats,
}

#[derive(Subcommand)]
enum IndexAction {
    Create { field: String },
    Drop { field: String },
    List,
}

/// What a directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Collection,
    Log,
    Queue,
}

fn kind(dir: &Path) -> Result<Kind> {
    if dir.join("data").is_dir() {
        Ok(Kind::Collection)
    } else if dir.join("segments").is_dir() {
        Ok(Kind::Log)
    } else if dir.join("queue.log").is_file() {
        Ok(Kind::Queue)
    } else {
        bail!(
            "{} holds no storh collection (data/), log (segments/) or queue (queue.log)",
            dir.display()
        )
    }
}

pub fn run() -> i32 {
    let cli = Cli::parse();
    match execute(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("storh: {e:#}");
            2
        }
    }
}

/// Runs `f` on the collection in `dir` and closes it, also when `f`
/// fails (an error must not leave the collection looking crashed).
fn with_collection<T>(dir: &Path, f: impl FnOnce(&mut Collection) -> Result<T>) -> Result<T> {
    if kind(dir)? != Kind::Collection {
        bail!("{} is not a collection (no data/ directory)", dir.display());
    }
    let mut c = Collection::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let result = f(&mut c);
    let closed = c.close();
    let value = result?;
    closed?;
    Ok(value)
}

fn bar(total: u64, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} files ({per_sec}, {eta})")
    {
        bar.set_style(style);
    }
    bar.set_message(what);
    bar
}

/// Runs `walk` under a progress bar of `total` files (a listing of the
/// buckets gives it).
fn with_bar<T>(
    total: u64,
    what: &'static str,
    walk: impl FnOnce(&mut dyn FnMut(u64)) -> Result<T>,
) -> Result<T> {
    let bar = bar(total, what);
    let result = walk(&mut |n| bar.set_position(n));
    bar.finish_and_clear();
    result
}

fn print_line(value: &Value) {
    println!("{value}");
}

// Longer than the ~70 lines a function should be: one arm per subcommand, each
// a few straight lines; split up, the arms would only hand the same arguments
// on.
fn execute(cli: &Cli) -> Result<i32> {
    let dir = &cli.dir;
    match &cli.command {
        Command::Get { id } => match with_collection(dir, |c| Ok(c.get(id)?))? {
            Some(doc) => {
                println!("{}", serde_json::to_string_pretty(&doc)?);
                Ok(0)
            }
            None => {
                eprintln!("storh: no record {id} in {}", dir.display());
                Ok(1)
            }
        },
        Command::Put { id, json } => {
            let text = match json {
                Some(t) => t.clone(),
                None => {
                    let mut t = String::new();
                    std::io::stdin()
                        .read_to_string(&mut t)
                        .context("reading the record from stdin")?;
                    t
                }
            };
            let doc = storh::docstore::parse_jsonc(Path::new("<input>"), text.as_bytes())?;
            // `put` may create a collection, but never inside a log or a
            // queue.
            if matches!(kind(dir), Ok(Kind::Log | Kind::Queue)) {
                bail!("{} holds a log or a queue, not a collection", dir.display());
            }
            std::fs::create_dir_all(dir.join("data"))
                .with_context(|| format!("creating {}", dir.display()))?;
            let id = with_collection(dir, |c| match id {
                Some(id) => {
                    c.put(id, &doc)?;
                    Ok(id.clone())
                }
                None => Ok(c.insert(&doc)?),
            })?;
            println!("{id}");
            Ok(0)
        }
        Command::Delete { id } => {
            if with_collection(dir, |c| Ok(c.delete(id)?))? {
                Ok(0)
            } else {
                eprintln!("storh: no record {id} in {}", dir.display());
                Ok(1)
            }
        }
        Command::Stream { after, limit } => with_collection(dir, |c| {
            // A record that cannot be read is named on stderr and the walk
            // goes on; the exit status says some were.
            let mut cursor = after.clone();
            let mut left = limit.unwrap_or(usize::MAX);
            let mut bad = 0;
            while left > 0 {
                let page = c.stream_page(cursor.as_deref(), left.min(1000))?;
                let Some(last) = page.last else { break };
                cursor = Some(last);
                left = left.saturating_sub(page.records.len() + page.bad.len());
                for (id, doc) in page.records {
                    print_line(&json!({ "id": id, "doc": doc }));
                }
                for f in page.bad {
                    eprintln!("storh: {}: {}", f.path.display(), f.reason);
                    bad += 1;
                }
            }
            Ok(if bad == 0 { 0 } else { 1 })
        }),
        Command::Find {
            field,
            value,
            after,
            limit,
        } => {
            let value: Value =
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.clone()));
            let hits = with_collection(dir, |c| {
                Ok(c.find(field, &value, after.as_deref(), limit.unwrap_or(usize::MAX))?)
            })?;
            for (id, doc) in hits {
                print_line(&json!({ "id": id, "doc": doc }));
            }
            Ok(0)
        }
        Command::Index { action } => with_collection(dir, |c| {
            match action {
                IndexAction::Create { field } => {
                    let total = c.count_files()?;
                    let created =
                        with_bar(total, "indexing", |p| Ok(c.create_index_with(field, p)?))?;
                    if !created {
                        eprintln!("storh: {field} was indexed already");
                    }
                }
                IndexAction::Drop { field } => {
                    if !c.drop_index(field)? {
                        eprintln!("storh: {field} had no index");
                    }
                }
                IndexAction::List => {
                    for field in c.indexed_fields() {
                        println!("{field}");
                    }
                }
            }
            Ok(0)
        }),
        Command::Reindex => {
            let n = with_collection(dir, |c| {
                let total = c.count_files()?;
                with_bar(total, "reindexing", |p| Ok(c.reindex_with(p)?))
            })?;
            eprintln!("storh: {n} records indexed");
            Ok(0)
        }
        Command::Verify => verify(dir),
        Command::Stats => {
            print_line(&stats(dir)?);
            Ok(0)
        }
    }
}

/// The log or queue in `dir`, opened read-only (so this works beside a
/// running writer and never changes a file), and its check.
fn verify_records(dir: &Path, kind: Kind) -> Result<storh::verify::Verified> {
    let what = || format!("verifying {}", dir.display());
    if kind == Kind::Log {
        let log = storh::log::SegmentedLog::open_read_only(dir).with_context(what)?;
        Ok(log.verify().with_context(what)?)
    } else {
        let queue = storh::queue::Queue::open_read_only(dir).with_context(what)?;
        Ok(queue.verify().with_context(what)?)
    }
}

fn verify(dir: &Path) -> Result<i32> {
    let mut problems = 0u64;
    let mut report = |line: String| {
        println!("{line}");
        problems += 1;
    };
    let good = match kind(dir)? {
        Kind::Collection => {
            let (ok, findings) = with_collection(dir, |c| {
                with_bar(c.count_files()?, "verifying", |p| Ok(c.verify_with(p)?))
            })?;
            for f in findings {
                report(format!("{}: {}", f.path.display(), f.reason));
            }
            ok
        }
        k @ (Kind::Log | Kind::Queue) => {
            let verified = verify_records(dir, k)?;
            for f in &verified.findings {
                report(f.to_string());
            }
            verified.records
        }
    };
    eprintln!("storh: {good} good records, {problems} problems");
    Ok(if problems == 0 { 0 } else { 1 })
}

fn stats(dir: &Path) -> Result<Value> {
    Ok(match kind(dir)? {
        Kind::Collection => {
            let (s, layout, recovery) = with_collection(dir, |c| {
                let s = c.stats()?;
                let layout = with_bar(c.count_files()?, "measuring", |p| Ok(c.layout_with(p)?))?;
                Ok((s, layout, c.recovery()))
            })?;
            json!({
                "kind": "collection",
                "records": s.records,
                "indexes": s.indexes.iter().map(|(f, n)| (f.clone(), json!(n)))
                    .collect::<serde_json::Map<String, Value>>(),
                "buckets": layout.buckets,
                "files": layout.files,
                "files_per_bucket": {"min": layout.min_per_bucket, "max": layout.max_per_bucket},
                "bytes": layout.bytes,
                "opened_after_crash": recovery.crashed,
            })
        }
        Kind::Log => {
            let log = storh::log::SegmentedLog::open_read_only(dir)
                .with_context(|| format!("opening {}", dir.display()))?;
            let verified = log.verify()?;
            json!({
                "kind": "log",
                "segments": log.segment_count(),
                "records": verified.records,
                "bytes": verified.bytes,
                "problems": verified.findings.len(),
            })
        }
        Kind::Queue => {
            let queue = storh::queue::Queue::open_read_only(dir)
                .with_context(|| format!("opening {}", dir.display()))?;
            let verified = queue.verify()?;
            let consumers: serde_json::Map<String, Value> = queue
                .consumers()?
                .into_iter()
                .map(|(name, position)| (name, json!(position)))
                .collect();
            json!({
                "kind": "queue",
                "records": verified.records,
                "bytes": verified.bytes,
                "consumers": consumers,
                "problems": verified.findings.len(),
            })
        }
    })
}
