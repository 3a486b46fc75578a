//! Metrics in the Prometheus text exposition format (version 0.0.4), and an
//! optional loopback HTTP listener that serves them.
//!
//! The daemon keeps its figures in plain atomics and [`Buckets`] where
//! they are counted (drains, channels, writers, the query server,
//! retention); [`Exposition`] turns a snapshot of them into text when asked,
//! so scraping costs nothing between scrapes.

pub mod buckets;
pub mod http;

pub use buckets::Buckets;
pub use http::MetricsListener;

use std::fmt::Write;

/// What kind of metric a family is (the `# TYPE` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One sample's labels, as (name, value) pairs.
pub type Labels<'a> = &'a [(&'a str, String)];

/// The text of one scrape.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition::default()
    }

    pub fn finish(self) -> String {
        self.out
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        debug_assert!(valid_name(name), "{name}");
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: Labels<'_>, extra: Option<(&str, &str)>, value: f64) {
        self.out.push_str(name);
        let all = labels
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(extra)
            .collect::<Vec<_>>();
        if !all.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in all.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// A counter or gauge family with one sample per label set.
    pub fn family<'a>(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        samples: impl IntoIterator<Item = (Labels<'a>, f64)>,
    ) {
        self.header(name, help, kind.name());
        for (labels, value) in samples {
            self.sample(name, labels, None, value);
        }
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) {
        self.family(name, help, kind, [(&[][..], value)]);
    }

    /// A histogram family, one sample set per label set: each bucket, the
    /// `+Inf` one, `_sum` and `_count`, all exact ([`Buckets`]).
    pub fn histogram<'a>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels<'a>, &'a Buckets)>,
    ) {
        self.header(name, help, "histogram");
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        for (labels, h) in samples {
            for (le, n) in h.cumulative() {
                self.sample(&bucket, labels, Some(("le", &number(le))), n as f64);
            }
            self.sample(&bucket, labels, Some(("le", "+Inf")), h.count() as f64);
            self.sample(&sum, labels, None, h.sum());
            self.sample(&count, labels, None, h.count() as f64);
        }
    }
}

/// Metric names: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Integers without a fraction, others in Rust's shortest round-trip form.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_escaped_and_parse_back() {
        let mut e = Exposition::new();
        let path = [("path", "/var/lib/\"odd\"\\dir\nx".to_string())];
        e.family(
            "eventd_test_total",
            "A counter.\nSecond line",
            Kind::Counter,
            [(&path[..], 3.0)],
        );
        e.single("eventd_test_gauge", "A gauge.", Kind::Gauge, 0.25);
        let mut h = Buckets::new(buckets::Bounds {
            upper: &[100, 1_000, 10_000],
            per_exposed: 1_000_000,
        });
        for us in [50, 150, 1500, 1500] {
            h.record(us);
        }
        let shard = [("shard", "0".to_string())];
        e.histogram("eventd_test_seconds", "A histogram.", [(&shard[..], &h)]);
        let text = e.finish();
        assert!(
            text.contains(r#"path="/var/lib/\"odd\"\\dir\nx""#),
            "{text}"
        );
        assert!(text.contains("# HELP eventd_test_total A counter.\\nSecond line"));
        assert!(text.contains("eventd_test_gauge 0.25\n"));
        for line in [
            r#"eventd_test_seconds_bucket{shard="0",le="0.0001"} 1"#,
            r#"eventd_test_seconds_bucket{shard="0",le="0.001"} 2"#,
            r#"eventd_test_seconds_bucket{shard="0",le="0.01"} 4"#,
            r#"eventd_test_seconds_bucket{shard="0",le="+Inf"} 4"#,
            r#"eventd_test_seconds_count{shard="0"} 4"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        // An independent parser reads the same figures back.
        let parsed =
            prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let value = |name: &str| {
            parsed
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| s.value.clone())
                .unwrap()
        };
        assert_eq!(
            value("eventd_test_total"),
            prometheus_parse::Value::Counter(3.0)
        );
        assert_eq!(
            value("eventd_test_gauge"),
            prometheus_parse::Value::Gauge(0.25)
        );
        let prometheus_parse::Value::Histogram(buckets) = value("eventd_test_seconds") else {
            panic!("not a histogram");
        };
        let counts: Vec<f64> = buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, [1.0, 2.0, 4.0, 4.0]);
        let sum = text
            .lines()
            .find(|l| l.starts_with("eventd_test_seconds_sum"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        assert_eq!(sum, 0.0032);
    }

    #[test]
    fn names_and_numbers() {
        assert!(valid_name("eventd_ring_lost_events_total"));
        assert!(!valid_name("9lives") && !valid_name("a-b") && !valid_name(""));
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::INFINITY), "+Inf");
    }
}
