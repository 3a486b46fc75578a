//! `eventctl query`: the options turned into a filter and a way of
//! printing, the listing asked of the daemon (or read from the files with
//! `--offline`, or from the fleet with `--cluster`), boots.

use super::cli::{ClusterArgs, QueryArgs};
use super::pager::Pager;
use super::sink::Sink;
use super::stdio::{say, Stdout};
use anyhow::{bail, Context};
use eventd::config::Settings;
use eventd::query::boots::{BootSpec, Boots, MARKER_NAME, MARKER_PROVIDER};
use eventd::query::filter::{grep_pattern, unit_pattern};
use eventd::query::render::{Format, Renderer};
use eventd::query::{
    when, Cursor, EventRow, FanOut, Filter, GapCursor, GapRow, Order, PageCursor, Request,
};
use eventd::rings::Level;
use jiff::tz::TimeZone;
use std::io::Write;

/// How many events a listing shows, as `-n` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lines {
    All,
    Newest(u64),
    Oldest(u64),
}

/// `-n`'s value: N, `+N`, `all`.
fn parse_lines(text: &str) -> anyhow::Result<Lines> {
    let bad = || anyhow::anyhow!("-n {text:?}: expected a count N, +N (the oldest N) or all");
    match text.trim() {
        "all" => Ok(Lines::All),
        t => match t.strip_prefix('+') {
            Some(n) => Ok(Lines::Oldest(n.parse().map_err(|_| bad())?)),
            None => Ok(Lines::Newest(t.parse().map_err(|_| bad())?)),
        },
    }
}

/// What `-n`, `--limit`, `--follow` and `--since` make of the listing:
/// with `--follow`, the newest 10 unless told otherwise (all since
/// `--since`, as journalctl), `--limit` counting as `-n`.
fn lines_of(q: &QueryArgs) -> anyhow::Result<Lines> {
    if let Some(n) = &q.lines {
        return parse_lines(n);
    }
    if q.follow {
        return Ok(match (q.limit, &q.since) {
            (Some(n), _) => Lines::Newest(n),
            (None, Some(_)) => Lines::All,
            (None, None) => Lines::Newest(10),
        });
    }
    Ok(Lines::All)
}

/// `-p`: a level (it and those more severe) or a range `FROM..TO`, in
/// either order: `(level, level_min)` of the filter.
fn priority(text: &str) -> anyhow::Result<(u8, Option<u8>)> {
    let level = |t: &str| -> anyhow::Result<u8> {
        Ok(t.parse::<Level>().with_context(|| format!("-p {text:?}"))? as u8)
    };
    match text.split_once("..") {
        None => Ok((level(text)?, None)),
        Some((from, to)) => {
            let (a, b) = (level(from)?, level(to)?);
            Ok((a.max(b), Some(a.min(b))))
        }
    }
}

/// The filter the options give, before boots and `-n`.
fn filter_of(q: &QueryArgs, now: &jiff::Zoned) -> anyhow::Result<Filter> {
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
    let time = |t: &Option<String>, flag: &str| -> anyhow::Result<Option<i64>> {
        t.as_deref()
            .map(|t| when::parse(t, now).map_err(|e| anyhow::anyhow!("{flag}: {e}")))
            .transpose()
    };
    let (level, level_min) = match &q.priority {
        Some(p) => {
            let (l, min) = priority(p)?;
            (Some(l), min)
        }
        None => (None, None),
    };
    // One provider as `provider` (its index answers it), several as a list.
    let (provider, providers) = match &q.providers[..] {
        [one] => (Some(one.clone()), Vec::new()),
        many => (None, many.to_vec()),
    };
    let filter = Filter {
        since_ns: time(&q.since, "--since")?,
        until_ns: time(&q.until, "--until")?,
        cpu: q.cpu,
        level,
        level_min,
        provider,
        providers,
        units: q.units.iter().map(|u| unit_pattern(u)).collect(),
        kernel: q.dmesg,
        name: q.name.clone(),
        pid: q.pid,
        uid: q.uid,
        grep: q.grep.as_deref().map(|g| grep_pattern(g, q.case_sensitive)),
        fields,
        order: if q.reverse {
            Order::NewestFirst
        } else {
            Order::OldestFirst
        },
        after: page.events,
        gaps_after: page.gaps,
        limit: q.limit,
        ..Filter::default()
    };
    filter.check().map_err(anyhow::Error::msg)?;
    Ok(filter)
}

pub fn run(settings: &Settings, q: QueryArgs) -> anyhow::Result<()> {
    let zone = when::zone(q.utc);
    let now = jiff::Timestamp::now().to_zoned(zone.clone());
    if q.list_boots {
        return list_boots(settings, &q, &zone);
    }
    let mut filter = filter_of(&q, &now)?;
    narrow_to_boot(settings, &q, &mut filter)?;
    let lines = lines_of(&q)?;
    // Turned around: the newest N asked for newest first, printed oldest
    // first (newest first with -r, as asked).
    let mut turn = None;
    match lines {
        Lines::All => {}
        Lines::Newest(n) => {
            filter.order = Order::NewestFirst;
            filter.limit = Some(n);
            turn = (!q.reverse).then_some(n);
        }
        Lines::Oldest(n) => filter.limit = Some(n),
    }
    // Only a --limit page says where the next one starts.
    let paged = q.limit.is_some() && !q.follow;
    let _pager = if q.no_pager || q.follow {
        None
    } else {
        Pager::start()
    };
    let sink = sink_of(settings, &q, zone, turn);
    if let Some(url) = &q.cluster {
        let cluster = ClusterArgs {
            url: Some(url.clone()),
            database: q.database.clone(),
            user: None,
            password_file: None,
            ca_file: None,
        };
        let cursor = q.cursor.as_deref();
        return super::export::fleet_query(
            settings, &cluster, &q.hosts, &filter, cursor, paged, sink,
        );
    }
    let mut page = Page {
        events: 0,
        gaps: 0,
        next: PageCursor {
            events: filter.after,
            gaps: filter.gaps_after,
        },
        sink,
    };
    if q.offline {
        query_files(settings, &filter, &mut page)?;
    } else {
        query_daemon(settings, &filter, q.follow, &mut page)?;
    }
    page.sink.listing_done()?;
    page.sink.flush()?;
    // A full page of either listing may have more behind it.
    if let (Some(limit), true) = (filter.limit, paged) {
        if page.events == limit || page.gaps == limit {
            say!("next page: --cursor {}", page.next.token());
        }
    }
    Ok(())
}

/// Where the rows go: the renderer in the asked format and zone, turned
/// around when the newest N were read newest first.
fn sink_of(
    settings: &Settings,
    q: &QueryArgs,
    zone: jiff::tz::TimeZone,
    turn: Option<u64>,
) -> Sink<Stdout> {
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let out = Renderer::new(Stdout::lock(), q.output, colour)
        .in_zone(zone)
        .on_host(&settings.host_name);
    match turn {
        Some(n) => Sink::turned_around(out, n),
        None => Sink::direct(out),
    }
}

/// `-b` (and `-k`, which means the current boot unless `-b` says another):
/// the window narrowed to that boot's time range.
fn narrow_to_boot(settings: &Settings, q: &QueryArgs, filter: &mut Filter) -> anyhow::Result<()> {
    let spec = match (&q.boot, q.dmesg && q.cluster.is_none()) {
        (Some(b), _) => BootSpec::parse(b).map_err(anyhow::Error::msg)?,
        (None, true) => BootSpec::FromNewest(0),
        (None, false) => return Ok(()),
    };
    let boots = boots(settings, q.offline)?;
    if boots.0.is_empty() && q.boot.is_none() {
        say!("eventctl: no boot is recorded in the store: -k shows the kernel's events of every boot");
        return Ok(());
    }
    let i = boots.find(&spec).map_err(anyhow::Error::msg)?;
    let (start, end) = boots.range(i);
    filter.since_ns = Some(filter.since_ns.map_or(start, |s| s.max(start)));
    filter.until_ns = match (filter.until_ns, end) {
        (Some(u), Some(e)) => Some(u.min(e)),
        (u, e) => u.or(e),
    };
    Ok(())
}

/// The boots the store records.
fn boots(settings: &Settings, offline: bool) -> anyhow::Result<Boots> {
    let markers = Filter {
        provider: Some(MARKER_PROVIDER.to_string()),
        name: Some(MARKER_NAME.to_string()),
        ..Filter::default()
    };
    let events = events_of(settings, &markers, offline).context("reading the boot markers")?;
    Ok(Boots::from_markers(&events))
}

/// Every event `filter` lists (warnings on stderr), for boots.
fn events_of(settings: &Settings, filter: &Filter, offline: bool) -> anyhow::Result<Vec<EventRow>> {
    let mut events = Vec::new();
    if offline {
        let mut fan = FanOut::open(&settings.store_dir, filter.clone(), None)
            .with_context(|| format!("reading {}", settings.store_dir.display()))?;
        events.extend(std::iter::from_fn(|| fan.next_event()));
        for w in &fan.warnings {
            say!("eventctl: warning: {w}");
        }
        return Ok(events);
    }
    let request = Request::Query {
        filter: filter.clone(),
        follow: false,
    };
    let mut failure = None;
    eventd::query::client::call(&settings.run_dir.join("query.sock"), &request, |v| {
        if let Some(e) = v.get("event") {
            events.push(serde_json::from_value(e.clone()).map_err(std::io::Error::other)?);
        } else if let Some(e) = v.get("error") {
            failure = Some(super::refusal("the query", e));
        }
        Ok(true)
    })?;
    match failure {
        Some(f) => bail!(f),
        None => Ok(events),
    }
}

/// `--list-boots`: index, boot id, first and last event of each boot, as
/// journalctl lists them (`-o json`: an array of objects, times in ns).
fn list_boots(settings: &Settings, q: &QueryArgs, zone: &TimeZone) -> anyhow::Result<()> {
    let boots = boots(settings, q.offline)?;
    let mut rows = Vec::new();
    for i in 0..boots.0.len() {
        let (start, end) = boots.range(i);
        let edge = |order| -> anyhow::Result<Option<i64>> {
            let f = Filter {
                since_ns: Some(start),
                until_ns: end,
                order,
                limit: Some(1),
                ..Filter::default()
            };
            Ok(events_of(settings, &f, q.offline)?.first().map(|e| e.ts))
        };
        let (first, last) = (edge(Order::OldestFirst)?, edge(Order::NewestFirst)?);
        rows.push((boots.offset(i), &boots.0[i].id, first, last));
    }
    let mut out = Stdout::lock();
    if matches!(q.output, Format::Json | Format::JsonPretty) {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(index, id, first, last)| {
                serde_json::json!({ "index": index, "boot_id": id, "first_entry": first,
                                    "last_entry": last })
            })
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(list))?;
        return Ok(out.flush()?);
    }
    let shown = |t: &Option<i64>| {
        t.map_or_else(
            || "-".to_string(),
            |t| when::format(t, zone, when::Style::Day),
        )
    };
    writeln!(
        out,
        "IDX BOOT ID                          FIRST ENTRY                 LAST ENTRY"
    )?;
    for (index, id, first, last) in &rows {
        writeln!(out, "{index:>3} {id} {} {}", shown(first), shown(last))?;
    }
    Ok(out.flush()?)
}

/// Rows of one page, where each listing stands after it, and where they
/// go.
struct Page {
    events: u64,
    gaps: u64,
    next: PageCursor,
    sink: Sink<Stdout>,
}

impl Page {
    fn event(&mut self, e: EventRow) -> std::io::Result<()> {
        self.next.events = Some(e.cursor());
        self.events += 1;
        self.sink.event(None, e)
    }

    fn gap(&mut self, g: GapRow) -> std::io::Result<()> {
        self.next.gaps = Some(g.cursor());
        self.gaps += 1;
        self.sink.gap(None, g)
    }
}

/// `--offline`: the same streaming reader the daemon runs, on the files.
fn query_files(settings: &Settings, filter: &Filter, page: &mut Page) -> anyhow::Result<()> {
    let mut fan = FanOut::open(&settings.store_dir, filter.clone(), None)
        .with_context(|| format!("reading {}", settings.store_dir.display()))?;
    while let Some(e) = fan.next_event() {
        page.event(e)?;
    }
    while let Some(g) = fan.next_gap() {
        page.gap(g)?;
    }
    for w in &fan.warnings {
        say!("eventctl: warning: {w}");
    }
    Ok(())
}

/// Asks the daemon, printing its answer as it comes (a follow's listing,
/// when turned around, once the daemon says it is complete).
fn query_daemon(
    settings: &Settings,
    filter: &Filter,
    follow: bool,
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
            page.event(serde_json::from_value(e.clone()).map_err(std::io::Error::other)?)?;
            if follow {
                page.sink.flush()?;
            }
        } else if let Some(g) = v.get("gap") {
            page.gap(serde_json::from_value(g.clone()).map_err(std::io::Error::other)?)?;
        } else if v.get("following").is_some() {
            page.sink.listing_done()?;
            page.sink.flush()?;
        } else if let Some(w) = v.get("warning") {
            say!("eventctl: warning: {}", w.as_str().unwrap_or_default());
        } else if let Some(e) = v.get("error") {
            failure = Some(super::refusal("the query", e));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_a_level_or_a_range_in_either_order() {
        assert_eq!(priority("err").unwrap(), (3, None));
        assert_eq!(priority("4").unwrap(), (4, None));
        assert_eq!(priority("warning..err").unwrap(), (4, Some(3)));
        assert_eq!(priority("err..warning").unwrap(), (4, Some(3)));
        assert_eq!(priority("0..debug").unwrap(), (7, Some(0)));
        let e = format!("{:#}", priority("warning..loud").unwrap_err());
        assert!(e.contains("loud") && e.contains("warning..loud"), "{e}");
    }

    #[test]
    fn lines_are_a_count_plus_a_count_or_all() {
        assert_eq!(parse_lines("20").unwrap(), Lines::Newest(20));
        assert_eq!(parse_lines("+5").unwrap(), Lines::Oldest(5));
        assert_eq!(parse_lines("all").unwrap(), Lines::All);
        assert!(parse_lines("-3").is_err());
    }
}
