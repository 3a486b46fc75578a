//! `eventctl export init|status` and `eventctl query --cluster`.

use anyhow::{bail, Context};
use eventd::config::Settings;
use eventd::export::clickhouse::{Client, Endpoint};
use eventd::export::fleet::{FleetCursor, FleetQuery};
use eventd::export::status::ExportReport;
use eventd::query::render::{clean, json_safe, Output};
use eventd::query::{Filter, Request};
use std::io::Write;
use std::time::Duration;

use super::cli::{ClusterArgs, ExportCommand, InitArgs, SchemaArg, SqlArgs};
use super::sink::Sink;
use super::stdio::{say, Stdout};

/// The client and database `args` (or the configuration) name.
pub fn connect(settings: &Settings, args: &ClusterArgs) -> anyhow::Result<(Client, String)> {
    let configured = settings.export.as_ref();
    let Some(url) = args
        .url
        .clone()
        .or_else(|| configured.map(|e| e.url.clone()))
    else {
        bail!("no ClickHouse URL: give --url (or set ExportUrl in the configuration)");
    };
    if let Some(what) = eventd::redact::url_credentials(&url) {
        bail!(
            "the URL {} holds {what}: give the user with ExportUser (or --user for export \
             init) and the password on the first line of a file named by ExportPasswordFile \
             (or --password-file)",
            clean(&eventd::redact::url(&url))
        );
    }
    let database = args
        .database
        .clone()
        .or_else(|| configured.map(|e| e.database.clone()))
        .unwrap_or_else(|| eventd::config::EXPORT_DATABASE_DEFAULT.to_string());
    let user = args
        .user
        .clone()
        .or_else(|| configured.and_then(|e| e.user.clone()));
    let password_file = args
        .password_file
        .clone()
        .or_else(|| configured.and_then(|e| e.password_file.clone()));
    let password = match password_file {
        Some(path) => Some(eventd::export::read_password_file(&path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let mut tls_files = configured.map(|e| e.tls.clone()).unwrap_or_default();
    if let Some(ca) = &args.ca_file {
        tls_files.ca_file = Some(ca.clone());
    }
    let (tls, _) = eventd::export::tls::for_url(&url, &tls_files).map_err(anyhow::Error::msg)?;
    let endpoint = Endpoint {
        url,
        user,
        password,
        tls,
    };
    Ok((Client::new(endpoint, Duration::from_secs(60)), database))
}

pub fn run(settings: &Settings, command: ExportCommand) -> anyhow::Result<()> {
    let done = match command {
        ExportCommand::Init(args) => init(settings, &args),
        ExportCommand::Status(args) => status(settings, args.output),
        ExportCommand::Sql(args) => statements(&args),
    };
    done.map_err(shown)
}

/// An error whose text may quote the cluster (its errors, a server's DDL
/// failures), as one line with control characters escaped.
fn shown(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::msg(clean(&eventd::errors::error_chain(e.as_ref())).into_owned())
}

fn init(settings: &Settings, args: &InitArgs) -> anyhow::Result<()> {
    let (client, database) = connect(settings, &args.cluster)?;
    use eventd::export::init::Schema;
    let schema = args.schema.map(|s| match s {
        SchemaArg::Cluster => Schema::Cluster,
        SchemaArg::Single => Schema::Single,
    });
    // ClickHouse's errors name the URL already.
    let done = eventd::export::init::init(&client, &database, &args.cluster_name, schema)
        .context("creating eventd's tables")?;
    let mut out = Stdout::lock();
    for line in done {
        writeln!(out, "{}", clean(&line))?;
    }
    Ok(out.flush()?)
}

fn statements(args: &SqlArgs) -> anyhow::Result<()> {
    let mut out = Stdout::lock();
    for sent in eventd::export::catalogue::catalogue(&args.database, &args.cluster) {
        writeln!(out, "{}", serde_json::to_string(&sent)?)?;
    }
    Ok(out.flush()?)
}

fn status(settings: &Settings, output: Output) -> anyhow::Result<()> {
    let socket = settings.run_dir.join("query.sock");
    let mut answer = None;
    eventd::query::client::call(&socket, &Request::Export, |v| {
        answer = Some(v);
        Ok(true)
    })?;
    let Some(v) = answer else {
        bail!("eventd closed the connection without an answer");
    };
    if let Some(e) = v.get("error") {
        bail!(super::refusal("the request", e));
    }
    let export = v.get("export").cloned().unwrap_or_default();
    if export.is_null() {
        bail!("export is off in this eventd (ExportUrl is not set)");
    }
    let mut out = Stdout::lock();
    if output == Output::Json {
        writeln!(out, "{}", json_safe(serde_json::to_string_pretty(&export)?))?;
    } else {
        let report: ExportReport = serde_json::from_value(export).context("reading the report")?;
        print_report(&mut out, &report)?;
    }
    Ok(out.flush()?)
}

/// The report as text. Its texts (the cluster's name, version and errors,
/// file names) are printed through `clean`: they may come from the cluster.
fn print_report(out: &mut impl Write, r: &ExportReport) -> std::io::Result<()> {
    writeln!(
        out,
        "host {} exporting to {} database {}",
        clean(&r.host),
        clean(&r.url),
        clean(&r.database)
    )?;
    if let Some(c) = &r.cluster {
        let tokens = if c.dedup_token {
            ", deduplication tokens"
        } else {
            ""
        };
        if c.layout == "single" {
            writeln!(
                out,
                "single server, ClickHouse {}{tokens}",
                clean(&c.version)
            )?;
        } else {
            let shard = match c.shard {
                Some(n) => format!(
                    "; this host's rows on shard {n} ({} replicas)",
                    c.shard_replicas
                ),
                None => "; this host's rows on any shard".to_string(),
            };
            writeln!(
                out,
                "cluster {} ({} replicas){shard}, ClickHouse {}{tokens}",
                clean(&c.cluster),
                c.replicas,
                clean(&c.version),
            )?;
        }
    }
    writeln!(
        out,
        "{:<22} {:<7} {:>12} {:>10} {:>9} {:>8} {:>8} {:>7}  STATE",
        "SHARD", "TABLE", "THROUGH", "LAG_ROWS", "LAG_S", "BATCHES", "DEDUP", "RESENT"
    )?;
    for s in &r.shards {
        for (table, st) in [("events", &s.events), ("gaps", &s.gaps)] {
            writeln!(
                out,
                "{:<22} {:<7} {:>12} {:>10} {:>9.1} {:>8} {:>8} {:>7}  {}",
                clean(&s.file),
                table,
                st.exported_through,
                st.lag_rows,
                st.lag_seconds,
                st.batches_sent,
                st.batches_deduplicated,
                st.batches_resent,
                clean(&s.state)
            )?;
        }
        if let Some(e) = &s.last_error {
            writeln!(out, "  last error ({} in a row): {}", s.failures, clean(e))?;
        }
    }
    Ok(())
}

/// `eventctl query --cluster`: the same filters over the fleet, printed
/// through `sink` (turned around for `-n`), after `cursor`. When `paged`
/// (a `--limit` page), where the next page starts is said on stderr.
pub fn fleet_query(
    settings: &Settings,
    cluster: &ClusterArgs,
    hosts: &[String],
    filter: &Filter,
    cursor: Option<&str>,
    paged: bool,
    sink: Sink<Stdout>,
) -> anyhow::Result<()> {
    let (client, database) = connect(settings, cluster)?;
    let cursor = match cursor {
        Some(t) => FleetCursor::parse(t)
            .with_context(|| format!("--cursor {t:?} is not a fleet query's cursor"))?,
        None => FleetCursor::default(),
    };
    let out = std::cell::RefCell::new(sink);
    let query = FleetQuery {
        client: &client,
        database: &database,
        filter,
        hosts,
        cursor,
    };
    // A write that fails (other than to a reader that went away, which
    // ends eventctl in Stdout) stops the query and is the command's error:
    // FleetQuery::run takes a failed callback for a stop.
    let failed = std::cell::RefCell::new(None);
    let keep_going = |r: std::io::Result<()>| match r {
        Ok(()) => Ok(true),
        Err(e) => {
            failed.borrow_mut().get_or_insert(e);
            Ok(false)
        }
    };
    let (next, events, gaps) = query
        .run(
            |host, e| keep_going(out.borrow_mut().event(Some(host), e.clone())),
            |host, g| {
                if failed.borrow().is_some() {
                    return Ok(false);
                }
                keep_going(out.borrow_mut().gap(Some(host), g.clone()))
            },
        )
        .context("querying the fleet")
        .map_err(shown)?;
    if let Some(e) = failed.into_inner() {
        return Err(e.into());
    }
    let mut out = out.into_inner();
    out.listing_done()?;
    out.flush()?;
    if let (Some(limit), true) = (filter.limit, paged) {
        if events == limit || gaps == limit {
            say!("next page: --cursor {}", next.token());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventd::export::status::{ClusterStatus, SourceStatus};

    /// What a cluster says about itself and its errors is printed escaped,
    /// one line each.
    #[test]
    fn the_report_escapes_what_the_cluster_said() {
        let hostile = "x\u{1b}]0;owned\u{7}\u{9b}2J\u{202e}\nforged";
        let report = ExportReport {
            host: "h".to_string(),
            url: "http://127.0.0.1:8123/".to_string(),
            database: "eventd".to_string(),
            cluster: Some(ClusterStatus {
                version: hostile.to_string(),
                layout: "cluster".to_string(),
                cluster: hostile.to_string(),
                replicas: 1,
                dedup_token: false,
                ..ClusterStatus::default()
            }),
            shards: vec![SourceStatus {
                file: "shard-000.db".to_string(),
                state: "retrying".to_string(),
                failures: 1,
                last_error: Some(hostile.to_string()),
                ..SourceStatus::default()
            }],
        };
        let mut out = Vec::new();
        print_report(&mut out, &report).unwrap();
        let text = String::from_utf8(out).unwrap();
        // Header, cluster, column names, two tables, the error.
        assert_eq!(text.lines().count(), 6, "{text}");
        assert!(
            !text.contains(['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}']),
            "{text:?}"
        );
        assert_eq!(text.matches("x\\u{1b}]0;owned").count(), 3, "{text}");
    }
}
