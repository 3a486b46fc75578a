//! The sweeps' report: a Markdown table on stdout, the JSON body and the
//! chart the runner writes.

use crate::pipeline::Outcome;
use crate::runner::{Chart, Legend, Panel, Series};
use plotters::prelude::{BLUE, GREEN, RED};
use serde::Serialize;

/// The sweeps' report, after the runner's header.
#[derive(Serialize)]
pub struct Report<'a> {
    /// One per point: the median run.
    pub points: &'a [Outcome],
    /// Every run of every point.
    pub runs: &'a [Outcome],
    /// The point the last summary line describes.
    pub headline: &'a Outcome,
}

/// The table, one row per point.
pub fn table(points: &[Outcome]) -> String {
    let mut out = String::from(
        "| point | shards | batch | L | slots | bytes | events/s | ceiling/s | ratio | lost \
         | p50 µs | p99 µs | p99.9 µs | max µs | full stalls | batch mean | RSS MiB | fds |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} |\n",
            p.label,
            p.shards,
            p.knobs.max_batch,
            p.knobs.stripe_len,
            p.channel_slots,
            p.channel_bytes,
            p.events_per_s,
            p.ceiling_per_s,
            p.ratio_to_ceiling,
            p.lost,
            p.latency_us_p50,
            p.latency_us_p99,
            p.latency_us_p999,
            p.latency_us_max,
            p.channel_full_stalls
                .map_or("n/a".to_string(), |n| n.to_string()),
            p.batch_items_mean,
            p.peak_rss_mib,
            p.descriptors,
        ));
    }
    out
}

/// The machine-readable last line.
pub fn summary_line(p: &Outcome) -> String {
    format!(
        "ratio_to_ceiling={:.2} events_per_s={:.0} lost={} p99_us={}",
        p.ratio_to_ceiling, p.events_per_s, p.lost, p.latency_us_p99
    )
}

/// Throughput (eventd and ceiling) and p99 latency across the points.
pub fn chart(title: &str, points: &[Outcome]) -> Chart {
    let along = |f: fn(&Outcome) -> f64| -> Vec<(f64, f64)> {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, f(p)))
            .collect()
    };
    let line = |label: &str, colour, f| Series {
        label: Some(label.to_string()),
        colour,
        dashed: false,
        points: along(f),
    };
    Chart {
        size: (960, 720),
        split: 400,
        x_range: -0.5f64..(points.len().max(1) as f64 - 0.5),
        x_labels: points.iter().map(|p| p.label.clone()).collect(),
        top: Panel {
            caption: format!("{title}: events/s committed"),
            series: vec![
                line("eventd", BLUE, |p| p.events_per_s),
                line("bare SQLite ceiling", RED, |p| p.ceiling_per_s),
            ],
            thousands: true,
            legend: Some(Legend::LowerRight),
        },
        bottom: Panel {
            caption: "p99 emit-to-commit latency (ms)".to_string(),
            series: vec![Series {
                label: None,
                colour: GREEN,
                dashed: false,
                points: along(|p| p.latency_us_p99 as f64 / 1000.0),
            }],
            thousands: false,
            legend: None,
        },
    }
}
