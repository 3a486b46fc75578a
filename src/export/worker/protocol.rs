//! The protocol of one (file, table), one batch at a time: intent, send,
//! advance; settle after a failure or an intent found at start; reconcile
//! once per run (see the steps in the worker's module documentation).

use super::{
    slot, Ctx, Outage, Prefetched, Source, StepError, BACKOFF_MAX, BACKOFF_MIN, BATCH_ROWS_MAX,
    FLUSH_INTERVAL, OUTAGE_ERRORS_SAID,
};
use crate::export::source::{Batch, Encoding, Identity, ShardSource, SourceError};
use crate::export::state::{Counts, Intent, Table};
use crate::export::status::ExportStatus;
use std::collections::BTreeSet;
use std::time::Instant;
/// A round of `source` without a failure; `busy` if it sent or settled.
/// The end of an outage is said once, with what it cost.
pub(super) fn succeeded(ctx: &Ctx, source: &mut Source, busy: bool) {
    if let Some(since) = source.outage.since {
        tracing::info!(shard = %source.shard.path.display(),
            failed_tries = source.outage.failures, resends_tried = source.outage.resends,
            outage = ?since.elapsed(), "export: sending again");
    }
    source.outage = Outage::default();
    source.backoff = BACKOFF_MIN;
    let waiting = source.waiting.iter().any(Option::is_some);
    ctx.status.update(&source.shard.instance, |s| {
        s.failures = 0;
        s.state = if busy || waiting { "exporting" } else { "idle" }.to_string();
    });
}

/// A failed step: the file backs off. Each error is logged the first time
/// an outage meets it; repeats are counted (the status shows the last
/// error, and [`succeeded`] says how many failures there were).
pub(super) fn backed_off(ctx: &mut Ctx, source: &mut Source, e: &StepError) {
    // What the cluster said is masked and escaped where it was read (the
    // client); this also covers the rest (a layout read off the server).
    let message = ctx.cluster.client().shown(&e.to_string());
    source.outage.since.get_or_insert_with(Instant::now);
    let said = &mut source.outage.said;
    if !said.contains(&message) && said.len() < OUTAGE_ERRORS_SAID {
        said.push(message.clone());
        tracing::warn!(
            shard = %source.shard.path.display(),
            error = %message,
            retry_in = ?source.backoff,
            "export: batch not sent; the cursor stays and the batch is checked before any \
             resend (each error said once until it works again)"
        );
    }
    source.outage.failures += 1;
    ctx.status.update(&source.shard.instance, |s| {
        s.failures += 1;
        s.state = "retrying".to_string();
        s.last_error = Some(message);
        s.last_error_at = Some(crate::rings::now_ns());
    });
    source.next_try = Instant::now() + source.backoff;
    source.backoff = (source.backoff * 2).min(BACKOFF_MAX);
}

/// One step of `table` of `source`: settle, reconcile, or send one batch.
pub(super) fn step(ctx: &mut Ctx, source: &mut Source, table: Table) -> Result<bool, StepError> {
    let instance = source.shard.instance.clone();
    let position = ctx.state.position(&instance, table)?;
    if let Some(intent) = position.pending {
        let rolled = position.rolled_back_through;
        settle(ctx, source, table, (intent.lo, intent.hi), rolled)?;
        source.reconciled[slot(table)] = true;
        return Ok(true);
    }
    let through = position.exported_through;
    if !source.reconciled[slot(table)] {
        reconcile(ctx, source, table, through, position.rolled_back_through)?;
        source.reconciled[slot(table)] = true;
        return Ok(true);
    }
    let newest = source.shard.max_id(table)?;
    report_lag(ctx, source, table, through, newest)?;
    if newest <= through {
        source.waiting[slot(table)] = None;
        return Ok(false);
    }
    let waited = *source.waiting[slot(table)].get_or_insert_with(Instant::now);
    let full = (newest - through) as u64 >= ctx.batch_rows;
    if !full && waited.elapsed() < FLUSH_INTERVAL {
        return Ok(false);
    }
    let ahead = source.prefetched[slot(table)]
        .take()
        .filter(|p| p.after == through && p.batch_rows == ctx.batch_rows);
    let mut rows = match ahead {
        Some(p) => p.batch,
        None if !may_read(ctx, source) => return Ok(false),
        None => read_paced(
            &ctx.status,
            source,
            table,
            through,
            ctx.batch_rows,
            ctx.encoding(),
        )?,
    };
    let Some(hi) = rows.last_id() else {
        return Ok(false);
    };
    let intent = Intent {
        lo: through + 1,
        hi,
        rows: rows.len() as u64,
        recorded_at: crate::rings::now_ns(),
    };
    ctx.state.record(&instance, table, intent)?;
    ctx.status.update(&instance, |s| {
        s.state = "exporting".to_string();
        s.stream(table).pending = Some([intent.lo, intent.hi]);
    });
    let check = recheck(ctx, &rows, position.rolled_back_through);
    if !check.is_empty() {
        let present = ctx.cluster.present_by_identity(table, &check)?;
        if !present.is_empty() {
            tracing::info!(shard = %source.shard.path.display(), table = table.name(),
                lo = intent.lo, hi, rows = present.len(),
                "export: rows committed again after a rollback are in the cluster already: not sent");
            rows.retain(|id| !present.contains(&id));
        }
    }
    if !rows.is_empty() {
        // The next batch is read and encoded while this one is sent when
        // it will certainly be a full one.
        let read_ahead = newest - hi >= ctx.batch_rows as i64 && may_read(ctx, source);
        let ahead = send_reading_ahead(ctx, source, table, &rows, read_ahead.then_some(hi))?;
        source.prefetched[slot(table)] = ahead;
    }
    let sent = Counts {
        batches_sent: 1,
        rows_sent: rows.len() as u64,
        ..Counts::default()
    };
    advance(ctx, &source.shard, table, hi, sent)?;
    // Rows left over have waited since then already: their batch goes once
    // the interval is up, not a whole interval later.
    if newest <= hi {
        source.waiting[slot(table)] = None;
    }
    Ok(true)
}

/// Whether a batch may be read from `source` now (see `walroom`); a new
/// hold is counted in the status.
fn may_read(ctx: &Ctx, source: &mut Source) -> bool {
    let before = source.wal.holds();
    let ok = source.wal.may_read(Instant::now());
    count_holds(&ctx.status, source, before);
    ok
}

/// The batch of `table` after `after`, read in runs with room left for the
/// shard's WAL between them (see `walroom`).
fn read_paced(
    status: &ExportStatus,
    source: &mut Source,
    table: Table,
    after: i64,
    batch_rows: u64,
    encoding: Encoding<'_>,
) -> Result<Batch, SourceError> {
    let before = source.wal.holds();
    let wal = &mut source.wal;
    let batch = source
        .shard
        .after_paced(table, after, batch_rows, encoding, &mut || {
            wal.wait_for_room()
        });
    count_holds(status, source, before);
    batch
}

fn count_holds(status: &ExportStatus, source: &Source, before: u64) {
    let holds = source.wal.holds();
    if holds != before {
        status.update(&source.shard.instance, |s| s.wal_holds = holds);
    }
}

fn report_lag(
    ctx: &Ctx,
    source: &Source,
    table: Table,
    through: i64,
    newest: i64,
) -> Result<(), StepError> {
    let oldest = if newest > through {
        source.shard.first_time_after(table, through, 1)?
    } else {
        None
    };
    let now = crate::rings::now_ns();
    ctx.status.update(&source.shard.instance, |s| {
        s.file = source.shard.file.clone();
        let st = s.stream(table);
        st.exported_through = through;
        st.newest_id = newest;
        st.lag_rows = (newest - through).max(0) as u64;
        st.lag_seconds = oldest.map_or(0.0, |t| (now - t).max(0) as f64 / 1e9);
        st.pending = None;
    });
    Ok(())
}

/// The batch's body, sent (one insert).
fn send(ctx: &mut Ctx, shard: &ShardSource, table: Table, rows: &Batch) -> Result<(), StepError> {
    let (token, query_id) = insert_names(ctx, shard, table, rows);
    ctx.cluster
        .insert(table, ctx.format, rows.body(), &token, &query_id)?;
    Ok(())
}

/// The deduplication token and query id of an insert of `rows`.
fn insert_names(ctx: &Ctx, shard: &ShardSource, table: Table, rows: &Batch) -> (String, String) {
    let token = format!(
        "{}:{}:{}:{}-{}:{}",
        ctx.host,
        shard.instance,
        table.name(),
        rows.first_id().unwrap_or(0),
        rows.last_id().unwrap_or(0),
        rows.len()
    );
    let query_id = format!(
        "{}{}",
        query_prefix(&ctx.host, &shard.instance, table),
        crate::rings::now_ns()
    );
    (token, query_id)
}

/// Sends `rows` and, while the insert is under way on a thread of its
/// own, reads and encodes the batch after `read_ahead` if asked: the insert
/// waits on ClickHouse, the read on SQLite and this thread's CPU, so a
/// worker keeps both busy. The read is read-only and its result is only
/// kept, so the protocol (intent before the send, cursor after it) is the
/// same as without it. A read that fails is dropped: the next step reads
/// again and says why.
fn send_reading_ahead(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    rows: &Batch,
    read_ahead: Option<i64>,
) -> Result<Option<Prefetched>, StepError> {
    let Some(after) = read_ahead else {
        send(ctx, &source.shard, table, rows)?;
        return Ok(None);
    };
    let (token, query_id) = insert_names(ctx, &source.shard, table, rows);
    let (batch_rows, format) = (ctx.batch_rows, ctx.format);
    let encoding = Encoding {
        format,
        host: &ctx.host,
    };
    let cluster = &mut ctx.cluster;
    let status = &ctx.status;
    let mut read = || -> Option<Prefetched> {
        let batch = read_paced(status, source, table, after, batch_rows, encoding).ok()?;
        (batch.len() as u64 == batch_rows).then_some(Prefetched {
            after,
            batch_rows,
            batch,
        })
    };
    let body = rows.body();
    let overlapped = std::thread::scope(|scope| {
        let sender = std::thread::Builder::new()
            .name("eventd-export-send".to_string())
            .spawn_scoped(scope, || {
                cluster.insert(table, format, body, &token, &query_id)
            });
        sender.map(|sender| {
            let ahead = read();
            // A panic in the insert is a bug: it goes on up as one.
            let sent = sender
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            sent.map(|()| ahead)
        })
    });
    match overlapped {
        Ok(sent) => Ok(sent?),
        // No thread to be had: the same insert here, nothing read ahead.
        Err(e) => {
            tracing::debug!(error = %e, "export: no thread to read ahead with");
            ctx.cluster
                .insert(table, ctx.format, body, &token, &query_id)?;
            Ok(None)
        }
    }
}

/// What the query id of every insert of (`host`, `instance`, `table`)
/// starts with.
fn query_prefix(host: &str, instance: &str, table: Table) -> String {
    format!("eventd:{host}:{instance}:{}:", table.name())
}

/// The cursor to `hi`, the intent gone, `counted` added to the counters
/// (in the state database and the status); retention learns the cursor.
fn advance(
    ctx: &mut Ctx,
    shard: &ShardSource,
    table: Table,
    hi: i64,
    counted: Counts,
) -> Result<(), StepError> {
    ctx.state
        .advance(&shard.instance, table, &shard.file, hi, counted)?;
    ctx.status.update(&shard.instance, |s| {
        let st = s.stream(table);
        st.batches_sent += counted.batches_sent;
        st.rows_sent += counted.rows_sent;
        st.batches_deduplicated += counted.batches_deduplicated;
        st.batches_resent += counted.batches_resent;
        st.rows_resent += counted.rows_resent;
    });
    let mut floor = ctx.floors.get(&shard.path);
    match table {
        Table::Events => floor.events = floor.events.max(hi),
        Table::Gaps => floor.gaps = floor.gaps.max(hi),
    }
    ctx.floors.set(&shard.path, floor);
    Ok(())
}

/// Makes sure every row of `lo..=hi` still in the shard is in the cluster,
/// sending only those that are not, then moves the cursor to `hi`. First
/// waits until no insert of this file and table is still running anywhere
/// (one the client gave up on may yet land, and would then land twice).
/// Works through the range at most `ExportBatchRows` rows at a time (a
/// reconcile's range can be a whole file); between chunks the rest of the
/// range stays the intent.
fn settle(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    (lo, hi): (i64, i64),
    rolled: i64,
) -> Result<(), StepError> {
    let prefix = query_prefix(&ctx.host, &source.shard.instance, table);
    let running = ctx.cluster.running(&prefix)?;
    if running > 0 {
        return Err(StepError::StillRunning(running));
    }
    let mut from = lo;
    loop {
        let shard = &source.shard;
        let rows = shard.select(table, (from, hi), ctx.batch_rows, ctx.encoding())?;
        let end = match rows.last_id() {
            Some(last) if (rows.len() as u64) >= ctx.batch_rows && last < hi => last,
            _ => hi,
        };
        settle_chunk(ctx, source, table, (from, end), rows, rolled)?;
        if end >= hi {
            return Ok(());
        }
        from = end + 1;
        let intent = Intent {
            lo: from,
            hi,
            rows: 0,
            recorded_at: crate::rings::now_ns(),
        };
        ctx.state.record(&source.shard.instance, table, intent)?;
    }
}

/// One chunk of [`settle`]: `rows` are what the shard holds of `lo..=hi`.
fn settle_chunk(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    (lo, hi): (i64, i64),
    mut rows: Batch,
    rolled: i64,
) -> Result<(), StepError> {
    let shard = &source.shard;
    let Some(times) = rows.time_range() else {
        // Nothing left of the range (retention deleted it, counted).
        return advance(ctx, shard, table, hi, Counts::default());
    };
    // Rows that may be in the cluster under other ids are looked for by
    // identity, the others by their file and id.
    let check = recheck(ctx, &rows, rolled);
    let mut present = ctx.cluster.present_by_identity(table, &check)?;
    if check.len() < rows.len() {
        let by_id = ctx
            .cluster
            .present(table, &shard.instance, (lo, hi), times)?;
        let checked: BTreeSet<i64> = check.iter().map(|(id, _, _)| *id).collect();
        present.extend(by_id.into_iter().filter(|id| !checked.contains(id)));
    }
    let had = rows.len();
    rows.retain(|id| !present.contains(&id));
    if rows.is_empty() {
        tracing::info!(shard = %shard.path.display(), table = table.name(), lo, hi,
            "export: a batch whose send was not confirmed is in the cluster: not resent");
    } else {
        // Said once per outage: while sends keep failing, every retry
        // finds the same rows missing (`succeeded` counts them at the end).
        if source.outage.resends == 0 {
            tracing::info!(shard = %shard.path.display(), table = table.name(), lo, hi,
                missing = rows.len(), of = had,
                "export: resending the rows the cluster does not hold");
        }
        source.outage.resends += 1;
        send(ctx, shard, table, &rows)?;
    }
    let resent = rows.len() as u64;
    let counted = if resent == 0 {
        Counts {
            batches_deduplicated: 1,
            ..Counts::default()
        }
    } else {
        Counts {
            batches_resent: 1,
            rows_resent: resent,
            ..Counts::default()
        }
    };
    advance(ctx, shard, table, hi, counted)?;
    ctx.status
        .update(&shard.instance, |s| s.stream(table).pending = None);
    Ok(())
}

/// The rows of `rows` to look for by identity: ids in a rolled-back range
/// (at or below `rolled`), and, after a rollback was found at start, rows
/// older than the start (see `rewind_rolled_back`).
fn recheck(ctx: &Ctx, rows: &Batch, rolled: i64) -> Vec<(i64, Identity, i64)> {
    if rolled == 0 && ctx.recheck_before.is_none() {
        return Vec::new();
    }
    let mut ids = rows.identities();
    ids.retain(|(id, _, time)| *id <= rolled || ctx.recheck_before.is_some_and(|t| *time < t));
    ids
}

/// Before the first batch of a run: settles whatever of this file the
/// cluster holds above the cursor (a batch sent under an intent the state
/// database no longer has).
fn reconcile(
    ctx: &mut Ctx,
    source: &mut Source,
    table: Table,
    through: i64,
    rolled: i64,
) -> Result<(), StepError> {
    let Some(since) = source
        .shard
        .first_time_after(table, through, BATCH_ROWS_MAX)?
    else {
        return Ok(());
    };
    let instance = source.shard.instance.clone();
    if let Some(highest) = ctx
        .cluster
        .highest_after(table, &instance, through, since)?
    {
        tracing::warn!(shard = %source.shard.path.display(), table = table.name(), through, highest,
            "export: the cluster holds rows past the recorded cursor; checking them");
        settle(ctx, source, table, (through + 1, highest), rolled)?;
    }
    Ok(())
}
