//! Reports: a Markdown table on stdout, a JSON file and an SVG chart.

use crate::pipeline::Outcome;
use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;

#[derive(Serialize)]
pub struct Report<'a> {
    pub scenario: &'a str,
    pub machine: Machine,
    pub command: String,
    /// One per point: the median run.
    pub points: &'a [Outcome],
    /// Every run of every point.
    pub runs: &'a [Outcome],
    /// The point the last summary line describes.
    pub headline: &'a Outcome,
}

#[derive(Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub model: String,
    pub kernel: String,
    pub descriptor_limit: u64,
}

impl Machine {
    pub fn describe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map_or("unknown".to_string(), |m| m.trim().to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".to_string(), |k| k.trim().to_string());
        Machine {
            cpus: eventd::rings::online_cpus().len(),
            model,
            kernel,
            descriptor_limit: eventd::routing::soft_descriptor_limit().unwrap_or(0),
        }
    }
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

pub fn write_json(path: &Path, report: &Report<'_>) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)?;
    Ok(())
}

// Longer than the ~70 lines a function should be: one chart drawn top to
// bottom (axes, series, labels); a flat list of drawing steps.
/// Throughput (eventd and ceiling) and p99 latency across the points.
pub fn write_svg(path: &Path, title: &str, points: &[Outcome]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let n = points.len().max(1);
    let labels: Vec<String> = points.iter().map(|p| p.label.clone()).collect();
    let label_of = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let rate_max = points
        .iter()
        .flat_map(|p| [p.events_per_s, p.ceiling_per_s])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption(format!("{title}: events/s committed"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..rate_max)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|v| format!("{:.0}k", v / 1000.0))
        .draw()?;
    let series = |f: fn(&Outcome) -> f64| -> Vec<(f64, f64)> {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, f(p)))
            .filter(|(_, v)| v.is_finite())
            .collect()
    };
    let eventd = series(|p| p.events_per_s);
    let ceiling = series(|p| p.ceiling_per_s);
    chart
        .draw_series(LineSeries::new(eventd.clone(), BLUE.stroke_width(2)))?
        .label("eventd")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart.draw_series(eventd.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))?;
    chart
        .draw_series(LineSeries::new(ceiling.clone(), RED.stroke_width(2)))?
        .label("bare SQLite ceiling")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart.draw_series(ceiling.iter().map(|&p| Circle::new(p, 4, RED.filled())))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;

    let p99_max = points
        .iter()
        .map(|p| p.latency_us_p99 as f64 / 1000.0)
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&bottom)
        .caption("p99 emit-to-commit latency (ms)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..p99_max)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&label_of)
        .draw()?;
    let p99: Vec<(f64, f64)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| (i as f64, p.latency_us_p99 as f64 / 1000.0))
        .collect();
    chart.draw_series(LineSeries::new(p99.clone(), GREEN.stroke_width(2)))?;
    chart.draw_series(p99.iter().map(|&p| Circle::new(p, 4, GREEN.filled())))?;
    root.present()?;
    Ok(())
}
