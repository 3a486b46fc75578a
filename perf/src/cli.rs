//! The option groups several scenarios share, each flattened into the
//! scenarios' own `Args` (a scenario takes only the groups it uses).

use crate::load::Sizes;
use crate::pipeline;
use crate::system::{ProducerKind, SystemKind};
use anyhow::{bail, Context};
use std::path::PathBuf;

/// Where a scenario's reports go; every scenario has it.
#[derive(clap::Args, Clone)]
pub(crate) struct Output {
    /// Where the JSON report and the SVG chart go.
    #[arg(long, default_value = "perf/results")]
    pub(crate) results: PathBuf,
}

impl Output {
    /// Creates the results directory and its `work` directory (the
    /// scenarios' scratch space); returns the latter.
    pub(crate) fn work(&self) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(&self.results)
            .with_context(|| format!("creating {}", self.results.display()))?;
        let work = self.results.join("work");
        std::fs::create_dir_all(&work)?;
        Ok(work)
    }
}

/// The reports and the rounds: every scenario that measures its points
/// more than once.
#[derive(clap::Args, Clone)]
pub(crate) struct Common {
    #[command(flatten)]
    pub(crate) output: Output,
    /// Run every point this many times (interleaved) and report the median.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
}

/// The eventd binary a scenario starts.
#[derive(clap::Args, Clone)]
pub(crate) struct Binary {
    /// The eventd binary (default: next to this program).
    #[arg(long)]
    pub(crate) eventd: Option<PathBuf>,
}

impl Binary {
    pub(crate) fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.eventd {
            Some(p) => Ok(p.clone()),
            None => Ok(std::env::current_exe()?
                .parent()
                .context("locating eventd next to this program")?
                .join("eventd")),
        }
    }
}

/// The system under test and its producers: the scenarios that run the
/// harness's pipeline points.
#[derive(clap::Args, Clone)]
pub(crate) struct System {
    /// The system under test: the pipeline in this process, or the eventd
    /// binary as a child process.
    #[arg(long, value_enum, default_value = "in-process")]
    pub(crate) system: SystemKind,
    #[command(flatten)]
    pub(crate) binary: Binary,
    /// Producers as threads of this process or as one process per ring.
    #[arg(long, value_enum, default_value = "threads")]
    pub(crate) producers: ProducerKind,
}

impl System {
    pub(crate) fn setup(&self) -> anyhow::Result<pipeline::Setup> {
        Ok(pipeline::Setup {
            system: self.system.clone(),
            eventd: self.binary.path()?,
            producers: self.producers,
        })
    }
}

/// The generated events' message sizes.
#[derive(clap::Args, Clone)]
pub(crate) struct EventBytes {
    /// Message bytes per event: N, or MIN-MAX for a uniform distribution.
    #[arg(long, default_value = "64-256")]
    pub(crate) event_bytes: String,
}

impl EventBytes {
    pub(crate) fn sizes(&self) -> anyhow::Result<Sizes> {
        parse_sizes(&self.event_bytes)
    }
}

pub(crate) fn parse_sizes(text: &str) -> anyhow::Result<Sizes> {
    let parse = |s: &str| -> anyhow::Result<usize> {
        s.trim()
            .parse()
            .with_context(|| format!("--event-bytes: {s:?} is not a number"))
    };
    let sizes = match text.split_once('-') {
        Some((a, b)) => Sizes {
            min: parse(a)?,
            max: parse(b)?,
        },
        None => {
            let n = parse(text)?;
            Sizes { min: n, max: n }
        }
    };
    if sizes.min > sizes.max || sizes.max > 8192 {
        bail!("--event-bytes {text}: need MIN <= MAX <= 8192");
    }
    Ok(sizes)
}
