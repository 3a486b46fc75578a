//! The runner every scenario uses: the rounds (`--repeat`, interleaved),
//! medians and percentiles, the machine description, and the reports (JSON
//! files with one header, two-panel SVG line charts). A scenario measures
//! its points and says what to print; how often, how it is summarised and
//! how it is written is here.

use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The machine a report was measured on.
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

/// The order of the points within each round of [`interleave`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The list as given every round (A B C A B C ...).
    Same,
    /// The list as given, then reversed, by turns (A B C C B A ...), so
    /// that no point always runs first or right after another.
    Alternate,
}

/// Runs every point `repeat` times (at least once), each once per round,
/// the whole list again each round, so slow drifts of a shared machine
/// spread over every point. `run` gets the round (from 1) and the point;
/// the result holds each point's samples, in its order in `points`, each
/// in round order.
pub fn interleave<P, O>(
    points: &[P],
    repeat: usize,
    order: Order,
    mut run: impl FnMut(usize, &P) -> anyhow::Result<O>,
) -> anyhow::Result<Vec<Vec<O>>> {
    let mut samples: Vec<Vec<O>> = points.iter().map(|_| Vec::new()).collect();
    for round in 1..=repeat.max(1) {
        let reversed = order == Order::Alternate && round % 2 == 0;
        for k in 0..points.len() {
            let i = if reversed { points.len() - 1 - k } else { k };
            let sample = run(round, &points[i])?;
            samples[i].push(sample);
        }
    }
    Ok(samples)
}

/// The value at quantile `q` (0 to 1) of a histogram: every percentile a
/// scenario reports is read here.
pub fn percentile(histogram: &Histogram<u64>, q: f64) -> u64 {
    histogram.value_at_quantile(q)
}

/// The median of `values`: the upper middle one of an even count, so it
/// is always a value that was measured; NaN when there is none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `values` with an even count's two middle values
/// averaged; NaN when there is none. The fields scenario's: its warm query
/// figure is the median of two runs (the first of three is the cold one),
/// of which the upper middle would be the slower run alone. Everywhere
/// else [`median`], so that a median printed is the run [`median_by`]
/// picks.
pub fn median_midpoint(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The run whose `key` is the median of the runs' (the upper middle one of
/// an even count); None when there is none.
pub fn median_by<T>(runs: impl IntoIterator<Item = T>, key: impl Fn(&T) -> f64) -> Option<T> {
    let mut runs: Vec<T> = runs.into_iter().collect();
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = runs.len() / 2;
    (mid < runs.len()).then(|| runs.swap_remove(mid))
}

/// A scenario's JSON report: the scenario, the machine and the command
/// line, then the scenario's own fields.
#[derive(Serialize)]
struct Headed<'a, T: Serialize> {
    scenario: &'a str,
    machine: Machine,
    command: String,
    #[serde(flatten)]
    body: &'a T,
}

/// Writes `results/NAME.json` with the header (scenario, machine,
/// command) before `body`'s own fields; returns its path.
pub fn write_report(results: &Path, name: &str, body: &impl Serialize) -> anyhow::Result<PathBuf> {
    let report = Headed {
        scenario: name,
        machine: Machine::describe(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        body,
    };
    write_json(results, name, &report)
}

/// Writes `results/NAME.json` as `value` is, without a header; returns
/// its path.
pub fn write_json(results: &Path, name: &str, value: &impl Serialize) -> anyhow::Result<PathBuf> {
    let path = results.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(value)?)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(path)
}

/// One line of a chart.
pub struct Series {
    /// The legend's text; None leaves the line out of the legend.
    pub label: Option<String>,
    pub colour: RGBColor,
    /// Dashed and thin, without markers (a reference beside a measured
    /// line); otherwise solid with a circle at each point.
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// One of a chart's two panels.
pub struct Panel {
    pub caption: String,
    pub series: Vec<Series>,
    /// The y axis in thousands ("12k").
    pub thousands: bool,
    pub legend: Option<Legend>,
}

/// Where a panel's legend goes.
#[derive(Clone, Copy)]
pub enum Legend {
    LowerLeft,
    LowerRight,
    UpperLeft,
}

/// A chart of two panels over the same categories on the x axis.
pub struct Chart {
    pub size: (u32, u32),
    /// Pixels of the top panel.
    pub split: u32,
    pub x_range: Range<f64>,
    /// The label of each whole x value from 0.
    pub x_labels: Vec<String>,
    pub top: Panel,
    pub bottom: Panel,
}

impl Chart {
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<()> {
        let root = SVGBackend::new(path, self.size).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(self.split);
        self.draw(&top, &self.top)?;
        self.draw(&bottom, &self.bottom)?;
        root.present()?;
        Ok(())
    }

    fn draw(
        &self,
        area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        panel: &Panel,
    ) -> anyhow::Result<()> {
        let label_of = |x: &f64| -> String {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                self.x_labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let y_max = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|v| v.is_finite())
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(self.x_range.clone(), 0f64..y_max)?;
        let mut mesh = chart.configure_mesh();
        mesh.x_labels(self.x_labels.len().max(1))
            .x_label_formatter(&label_of);
        let thousands = |v: &f64| format!("{:.0}k", v / 1000.0);
        if panel.thousands {
            mesh.y_label_formatter(&thousands);
        }
        mesh.draw()?;
        for s in &panel.series {
            let colour = s.colour;
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|p| p.1.is_finite())
                .collect();
            if s.dashed {
                chart.draw_series(DashedLineSeries::new(points, 6, 4, colour.stroke_width(1)))?;
                continue;
            }
            let line =
                chart.draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?;
            if let Some(label) = &s.label {
                line.label(label).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            }
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
        if let Some(legend) = panel.legend {
            let position = match legend {
                Legend::LowerLeft => SeriesLabelPosition::LowerLeft,
                Legend::LowerRight => SeriesLabelPosition::LowerRight,
                Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            };
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(position)
                .draw()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_pick_a_measured_value_or_the_midpoint() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
        assert_eq!(median_midpoint(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(
            median_by(vec![(1, 9.0), (2, 1.0), (3, 5.0)], |r| r.1),
            Some((3, 5.0))
        );
        assert_eq!(median_by(Vec::<(u8, f64)>::new(), |r| r.1), None);
    }

    #[test]
    fn interleave_runs_each_point_once_a_round() {
        let mut ran = Vec::new();
        let samples = interleave(&['a', 'b'], 2, Order::Same, |round, p| {
            ran.push((round, *p));
            Ok((round, *p))
        })
        .unwrap();
        assert_eq!(ran, [(1, 'a'), (1, 'b'), (2, 'a'), (2, 'b')]);
        assert_eq!(
            samples,
            [vec![(1, 'a'), (2, 'a')], vec![(1, 'b'), (2, 'b')]]
        );
    }

    #[test]
    fn interleave_alternates_the_order_and_runs_at_least_once() {
        let mut ran = Vec::new();
        let samples = interleave(&['a', 'b', 'c'], 3, Order::Alternate, |round, p| {
            ran.push((round, *p));
            Ok(round)
        })
        .unwrap();
        let order: Vec<char> = ran.iter().map(|r| r.1).collect();
        assert_eq!(order, ['a', 'b', 'c', 'c', 'b', 'a', 'a', 'b', 'c']);
        assert_eq!(samples, [vec![1, 2, 3], vec![1, 2, 3], vec![1, 2, 3]]);
        let once = interleave(&[()], 0, Order::Alternate, |round, _| Ok(round)).unwrap();
        assert_eq!(once, [vec![1]]);
    }

    #[test]
    fn percentile_reads_the_histogram() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=100u64 {
            h.record(v).unwrap();
        }
        assert_eq!(percentile(&h, 0.5), 50);
        assert_eq!(percentile(&h, 0.99), 99);
        assert_eq!(percentile(&h, 1.0), 100);
    }
}
