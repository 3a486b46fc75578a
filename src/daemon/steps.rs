//! The start-up steps, each a function `Daemon::start` calls in turn (the
//! steps docs/design/storage.md numbers): check the settings, prepare the
//! directories, lock, attach the rings, plan the shards (count, R1, and
//! descriptors, R2). Opening the shards, recovery and the threads belong to
//! their stages (`store`, `store::recovery`, `drain`).

use super::{DaemonError, DataDirLock, PreviousRun, Tunables};
use crate::access::{self, Policy};
use crate::channel::HandoffChannel;
use crate::config::Settings;
use crate::drain::{Handoff, RingMaker};
use crate::rings::{AttachedRing, CurrentRing, KmesDir, Ring};
use crate::routing::{self, RoutingError};
use crate::store;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Everything about the settings that can be refused before anything is
/// made: an explicit channel capacity, the paths against each other, the
/// two groups against each other. Returns the access policy.
pub(super) fn check_settings(
    settings: &Settings,
    tunables: &Tunables,
) -> Result<Policy, DaemonError> {
    if let Some(capacity) = tunables.channel {
        drop(HandoffChannel::<Handoff>::new(capacity)?);
    }
    settings.check_paths()?;
    Ok(Policy::new(
        &settings.query_group,
        &settings.producer_group,
    )?)
}

/// Gives eventd's directories the modes and groups of `policy` (creating
/// them if missing), whatever the umask, and makes everything eventd
/// creates from now on start private (its mode is set explicitly). Then
/// checks, by identity, that the directories are four different ones.
pub(super) fn prepare_directories(settings: &Settings, policy: &Policy) -> Result<(), DaemonError> {
    use access::Kind;
    access::files::restrict_umask();
    for (dir, kind) in [
        (&settings.data_dir, Kind::PublicDir),
        (&settings.run_dir, Kind::PublicDir),
        (&settings.store_dir, Kind::StoreDir),
        (&settings.kmes_dir, Kind::KmesDir),
    ] {
        access::files::ensure_dir(dir, policy.mode(kind))?;
    }
    let identity = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok()
    };
    let dirs = [
        ("StoreDir", &settings.store_dir),
        ("KmesDir", &settings.kmes_dir),
        ("RunDir", &settings.run_dir),
    ];
    for (i, (ka, a)) in dirs.iter().enumerate() {
        for (kb, b) in &dirs[i + 1..] {
            if identity(a).is_some() && identity(a) == identity(b) {
                return Err(crate::config::ConfigError::Paths {
                    first: ka,
                    first_path: a.to_path_buf(),
                    second: kb,
                    second_path: b.to_path_buf(),
                    problem: "are the same directory (through a symbolic link)",
                }
                .into());
            }
        }
    }
    Ok(())
}

/// Locks the data directory (and the store and KMES directories), saying
/// how the previous daemon ended.
pub(super) fn lock_data_dir(settings: &Settings) -> Result<DataDirLock, DaemonError> {
    let lock = DataDirLock::acquire(
        &settings.run_dir,
        &[&settings.store_dir, &settings.kmes_dir],
    )?;
    match lock.previous {
        PreviousRun::Clean => {}
        PreviousRun::Killed => {
            tracing::warn!("the previous eventd did not stop cleanly; recovering")
        }
        PreviousRun::KilledEarlierBoot => tracing::warn!(
            "the previous eventd did not stop cleanly and the machine restarted since; \
             recovering from every receipt (shards may have lost their last commits)"
        ),
    }
    Ok(lock)
}

/// The rings the drains read: the attached CPU rings (ordinals 0..C) and,
/// last, eventd's own syslog ring.
pub(super) struct Rings {
    pub cpus: Vec<AttachedRing>,
    pub syslog: Option<Arc<Ring>>,
    /// eventd's own kernel ring (`KernelLog`), after the syslog ring.
    pub kernel: Option<Arc<Ring>>,
}

impl Rings {
    /// Every drained ring in ordinal order.
    pub fn all(&self) -> Vec<Arc<Ring>> {
        self.cpus
            .iter()
            .map(|r| r.ring.clone())
            .chain(self.syslog.iter().cloned())
            .chain(self.kernel.iter().cloned())
            .collect()
    }

    pub fn count(&self) -> usize {
        self.cpus.len() + usize::from(self.syslog.is_some()) + usize::from(self.kernel.is_some())
    }

    /// How the drain of `ring` makes a new ring in its place.
    pub fn maker(ring: &Ring, policy: &Policy) -> RingMaker {
        RingMaker {
            path: ring.path().to_path_buf(),
            geometry: ring.geometry(),
            cpu: ring.cpu(),
            mode: if crate::rings::is_own_ring(ring.cpu()) {
                access::Mode::PRIVATE
            } else {
                policy.mode(access::Kind::Ring)
            },
        }
    }
}

/// Attaches the ring of every online CPU (creating missing ones with the
/// producer mode, mending or replacing unusable ones) and, if a syslog
/// socket is on (configured or passed), eventd's own syslog ring.
pub(super) fn attach_rings(
    settings: &Settings,
    policy: &Policy,
    cpus: &[u32],
    syslog_on: bool,
) -> Result<Rings, DaemonError> {
    let kmes = KmesDir::new(&settings.kmes_dir);
    let attached = kmes.attach_all(
        cpus,
        settings.ring_bytes as usize,
        policy.mode(access::Kind::Ring),
    )?;
    for (cpu, repair) in &attached.repairs {
        tracing::warn!(cpu, repair = %repair, "ring mended at attach");
    }
    for (cpu, error) in &attached.failures {
        tracing::error!(cpu, error = %error, "ring not attached; its events are not collected");
    }
    if attached.rings.is_empty() {
        return Err(match attached.failures.into_iter().next() {
            Some((_, e)) => e.into(),
            None => RoutingError::NoRings.into(),
        });
    }
    let syslog = if syslog_on {
        let mut repairs = Vec::new();
        let ring = kmes.attach_syslog(settings.ring_bytes as usize, &mut repairs);
        for repair in &repairs {
            tracing::warn!(repair = %repair, "syslog ring mended at attach");
        }
        Some(Arc::new(ring?))
    } else {
        None
    };
    Ok(Rings {
        cpus: attached.rings,
        syslog,
        kernel: super::sources::attach_kernel_ring(settings, &kmes)?,
    })
}

/// The shard plan: how many active shards (R1), and every database
/// queries will see, checked against the descriptor limit (R2) before any
/// database is opened.
pub(super) struct Layout {
    pub shards: usize,
    /// Every `*.db` in the store now, and the active shards' files.
    pub databases: BTreeSet<PathBuf>,
    pub needed_descriptors: u64,
    /// MaxConcurrentQueries as served (the default shrinks to fit).
    pub max_queries: u64,
}

/// Plans the shards for `rings` (R1) and checks the descriptor allowance
/// (R2): `E` is every database already in the store plus the active shards
/// about to be created, `C` every drained ring.
pub(super) fn plan_shards(settings: &Settings, rings: &Rings) -> Result<Layout, DaemonError> {
    let shards = routing::shard_count(settings.storage_shards, rings.cpus.len())?;
    let mut databases: BTreeSet<PathBuf> = store::list_databases(&settings.store_dir)?
        .into_iter()
        .collect();
    databases.extend((0..shards).map(|j| store::shard_path(&settings.store_dir, j)));
    let limit = routing::soft_descriptor_limit().map_err(DaemonError::Limit)?;
    let (e, c) = (databases.len() as u64, rings.count() as u64);
    let max_queries = queries(settings, e, c, limit);
    let needed = routing::check_descriptors(max_queries, e, c, limit)?;
    tracing::info!(
        rings = rings.cpus.len(),
        syslog_ring = rings.syslog.is_some(),
        shards,
        databases = databases.len(),
        store = %settings.store_dir.display(),
        descriptor_allowance = needed,
        descriptor_soft_limit = limit,
        "rings attached, shards planned"
    );
    Ok(Layout {
        shards,
        databases,
        needed_descriptors: needed,
        max_queries,
    })
}

/// MaxConcurrentQueries as eventd will serve it: an explicit setting as
/// set (R2 then refuses it if it does not fit); the default, lowered to
/// the most queries that fit the descriptor limit, said in one log line
/// (a stock `ulimit -n` of 1024 fits 62 on two CPUs). If not even one
/// fits, the default is kept and R2 refuses with the numbers.
fn queries(settings: &Settings, e: u64, c: u64, limit: u64) -> u64 {
    let asked = settings.max_concurrent_queries;
    if settings.max_concurrent_queries_explicit {
        return asked;
    }
    match routing::queries_that_fit(asked, e, c, limit) {
        Some(q) if q < asked => {
            tracing::warn!(
                max_concurrent_queries = q,
                default = asked,
                descriptors_at_default = routing::descriptor_allowance(asked, e, c),
                descriptor_soft_limit = limit,
                "MaxConcurrentQueries is not set and the descriptor limit is too low for its \
                 default: serving at most {q} queries at once (raise LimitNOFILE, or ulimit -n, \
                 for the default)"
            );
            q
        }
        _ => asked,
    }
}

impl Layout {
    /// Every database recovery reads: those of the plan, and the active
    /// shards' files (new generations made past damaged files included).
    pub fn with_files<'a>(&self, files: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
        let mut all = self.databases.clone();
        all.extend(files.cloned());
        all.into_iter().collect()
    }
}

/// The shards each drained ring sends to: R4 for the CPU rings, every shard
/// for eventd's own rings.
pub(super) fn assignment(rings: &Rings, shards: usize) -> Vec<Vec<usize>> {
    let mut assignment = routing::assign(rings.cpus.len(), shards);
    for _own in rings.syslog.iter().chain(&rings.kernel) {
        assignment.push((0..shards).collect());
    }
    assignment
}

/// The epochs of every ring that exists: the drained ones (as they are now:
/// a drain may have replaced its ring) and any other ring file in the KMES
/// directory (a CPU now offline, a ring that failed to attach). Retention
/// never deletes their receipts. `None` if some ring file's epoch cannot be
/// read: then no receipt is deleted at all.
pub(super) fn ring_epochs(kmes_dir: &Path, drained: &[Arc<CurrentRing>]) -> Option<Vec<u64>> {
    let drained: Vec<Arc<Ring>> = drained.iter().map(|c| c.get()).collect();
    let mut epochs: Vec<u64> = drained.iter().map(|r| r.epoch()).collect();
    let entries = std::fs::read_dir(kmes_dir).ok()?;
    for entry in entries {
        let path = entry.ok()?.path();
        let is_ring = path.extension().is_some_and(|x| x == "ring");
        if !is_ring || drained.iter().any(|r| r.path() == path) {
            continue;
        }
        match Ring::open(&path, None) {
            Ok(ring) => epochs.push(ring.epoch()),
            Err(e) => {
                tracing::warn!(
                    ring = %path.display(),
                    error = %e,
                    "cannot read this ring's epoch: retention keeps every receipt"
                );
                return None;
            }
        }
    }
    Some(epochs)
}

/// Brings the historical shards' schema up to date (their instance ids, for
/// the export stage); a file that cannot be migrated is logged and left.
pub(super) fn migrate_historical(settings: &Settings, health: &store::StoreHealth) {
    let found = store::migrate_historical(&settings.store_dir, health);
    for (path, damage) in found.damaged {
        tracing::error!(
            shard = %path.display(),
            damage = %damage,
            "historical shard file damaged: left as it is (queries read what they still can; \
             retention and the export stage leave it alone)"
        );
    }
    for (path, error) in found.failed {
        tracing::warn!(
            shard = %path.display(),
            error = %error,
            "historical shard not migrated: left as it is (queries still read it; \
             the export stage skips it)"
        );
    }
}
