//! The filled store the export runs read: its shard files and the fill itself.

use super::PATIENCE;
use crate::load::{Mode, Sizes};
use crate::pipeline::{self, Knobs};
use crate::system::{Producers, Running};
use eventd::export::source::ShardSource;
use eventd::export::state::Table;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One shard file of the filled store.
pub(super) struct StoreFile {
    pub(super) path: PathBuf,
    pub(super) instance: String,
    pub(super) events: i64,
    pub(super) gaps: i64,
}

pub(super) fn store_files(store: &Path) -> anyhow::Result<Vec<StoreFile>> {
    let mut files = Vec::new();
    for path in eventd::store::list_databases(store)? {
        let s = ShardSource::open(&path)?;
        files.push(StoreFile {
            events: s.max_id(Table::Events)?,
            gaps: s.max_id(Table::Gaps)?,
            instance: s.instance.clone(),
            path,
        });
    }
    Ok(files)
}

/// The store every export run reads: filled once, export off.
pub(super) struct Filled {
    pub(super) dir: tempfile::TempDir,
    pub(super) files: Vec<StoreFile>,
    pub(super) events: u64,
    pub(super) gaps: u64,
    pub(super) events_per_s: f64,
}

impl Filled {
    pub(super) fn rows(&self) -> u64 {
        self.events + self.gaps
    }
}

/// Emits flat out until `rows` events are stored, then stops.
pub(super) fn fill(
    work: &Path,
    setup: &pipeline::Setup,
    sizes: Sizes,
    rows: u64,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Filled> {
    let dir = tempfile::Builder::new()
        .prefix("export-store-")
        .tempdir_in(work)?;
    let (settings, tunables) = pipeline::configure(dir.path(), Knobs::defaults(), None)?;
    let running = Running::start(&setup.system, &setup.eventd, &settings, tunables)?;
    let rings = running.rings()?;
    let start = Instant::now();
    let producers = Producers::start(setup.producers, &rings, Mode::FlatOut, sizes)?;
    loop {
        let (stored, _) = running.progress()?;
        progress.set_message(format!("filling the store: {stored}/{rows} events"));
        if stored >= rows {
            break;
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "only {stored} events stored");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (emitted, _) = producers.stop()?;
    let stored = loop {
        let (stored, lost) = running.progress()?;
        if stored + lost >= emitted {
            break stored;
        }
        anyhow::ensure!(start.elapsed() < PATIENCE, "the fill did not drain");
        std::thread::sleep(Duration::from_millis(5));
    };
    let events_per_s = stored as f64 / start.elapsed().as_secs_f64();
    drop(rings);
    running.stop()?;
    let files = store_files(&settings.store_dir)?;
    Ok(Filled {
        events: files.iter().map(|f| f.events as u64).sum(),
        gaps: files.iter().map(|f| f.gaps as u64).sum(),
        files,
        dir,
        events_per_s,
    })
}
