//! Where shard files are and what their names say: shard indexes and
//! generations (`shard-NNN.db`, `shard-NNN-gG.db`), the markers beside
//! damaged files, and the listing every reader starts from (R7).

use super::StoreError;
use std::path::{Path, PathBuf};

/// The file of shard `index` in generation `generation`: 1 is
/// `shard-NNN.db`, later ones `shard-NNN-gG.db` (made when the one before
/// was found damaged, which is left in place).
pub fn shard_generation_path(store_dir: &Path, index: usize, generation: u32) -> PathBuf {
    if generation <= 1 {
        store_dir.join(format!("shard-{index:03}.db"))
    } else {
        store_dir.join(format!("shard-{index:03}-g{generation}.db"))
    }
}

/// The shard index and generation a file name names, if it is one of
/// eventd's shard names.
fn shard_name(name: &str) -> Option<(usize, u32)> {
    let rest = name.strip_prefix("shard-")?.strip_suffix(".db")?;
    let (index, generation) = match rest.split_once("-g") {
        Some((i, g)) => (i, g.parse().ok().filter(|g| *g >= 2)?),
        None => (rest, 1),
    };
    let digits_ok = index.len() >= 3 && index.bytes().all(|b| b.is_ascii_digit());
    digits_ok
        .then(|| index.parse().ok())
        .flatten()
        .map(|i| (i, generation))
}

/// Whether `path`'s name is one of eventd's shard names (`shard-NNN.db`,
/// `shard-NNN-gG.db`): a file eventd made whole, so one without its schema
/// is damage, not a stranger's database.
pub fn is_shard_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(shard_name)
        .is_some()
}

/// The newest generation of shard `index` in the store, if any exists.
fn newest_generation(store_dir: &Path, index: usize) -> Option<u32> {
    let entries = std::fs::read_dir(store_dir).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| shard_name(e.file_name().to_str()?))
        .filter(|(i, _)| *i == index)
        .map(|(_, g)| g)
        .max()
}

/// The file shard `index` writes: its newest generation in the store (the
/// first, `shard-NNN.db`, if there is none yet).
pub fn shard_path(store_dir: &Path, index: usize) -> PathBuf {
    shard_generation_path(
        store_dir,
        index,
        newest_generation(store_dir, index).unwrap_or(1),
    )
}

/// The file shard `index` moves on to when `current` (the file it writes
/// now, which may be gone already) is damaged: the generation after
/// `current`'s and after every generation that still has a file in the
/// store, its database or a `-wal` or `-shm` file left behind. So a name is
/// never used twice: a database made at the name of a removed one whose WAL
/// is still there would take that WAL's pages for its own.
pub fn next_shard_path(store_dir: &Path, index: usize, current: &Path) -> PathBuf {
    let in_store = std::fs::read_dir(store_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let database = name
                .strip_suffix("-wal")
                .or_else(|| name.strip_suffix("-shm"))
                .or_else(|| name.strip_suffix(DAMAGE_SUFFIX))
                .unwrap_or(&name);
            shard_name(database)
        })
        .filter(|(i, _)| *i == index)
        .map(|(_, g)| g);
    let current = current
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(shard_name)
        .map(|(_, g)| g);
    let next = in_store
        .chain(current)
        .max()
        .map_or(1, |g| g.saturating_add(1));
    shard_generation_path(store_dir, index, next.max(2))
}

/// What a damaged shard file's marker is called: `NAME.db` + this.
const DAMAGE_SUFFIX: &str = ".damaged";

/// The file beside a damaged shard file that records why it was given up,
/// so that a later start never writes it again (the damaged file itself is
/// never touched). Not a `*.db`: queries and recovery do not see it.
pub fn damage_marker(path: &Path) -> PathBuf {
    side_file(path, DAMAGE_SUFFIX)
}

/// Why `path` was found damaged before, if its marker says so.
pub fn recorded_damage(path: &Path) -> Option<String> {
    std::fs::read_to_string(damage_marker(path))
        .ok()
        .map(|text| text.trim().to_string())
}

/// Writes `path`'s damage marker (once: an existing one keeps the first
/// reason), with `mode`, as a whole file renamed into place.
pub fn record_damage(path: &Path, reason: &str, mode: crate::access::Mode) -> std::io::Result<()> {
    let marker = damage_marker(path);
    if marker.exists() {
        return Ok(());
    }
    let tmp = side_file(&marker, ".new");
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        crate::access::files::set_mode_fd(&f, mode)?;
        writeln!(f, "{reason}")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &marker)
}

/// Every shard file of the store that a marker records as damaged, with the
/// reason and when the marker was written (ns since the Unix epoch).
pub fn recorded_damages(store_dir: &Path) -> Vec<(PathBuf, String, i64)> {
    let Ok(entries) = std::fs::read_dir(store_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, String, i64)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let database = name.strip_suffix(DAMAGE_SUFFIX)?;
            let path = store_dir.join(database);
            let reason = recorded_damage(&path)?;
            let at = e
                .metadata()
                .ok()?
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_nanos()
                .min(i64::MAX as u128) as i64;
            Some((path, reason, at))
        })
        .collect();
    found.sort();
    found
}

/// Every `*.db` file in the store directory, sorted by name (R7: whatever
/// configuration wrote it).
pub fn list_databases(store_dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    Ok(list_database_files(store_dir)?
        .into_iter()
        .map(|(p, _)| p)
        .collect())
}

/// [`list_databases`] with each file's identity `(dev, inode)`, from the
/// one `stat` that tells it is a file (a query lists the store every time:
/// 256 files, one system call each).
pub fn list_database_files(
    store_dir: &Path,
) -> Result<Vec<(PathBuf, super::zones::FileId)>, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let entries = std::fs::read_dir(store_dir).map_err(|source| StoreError::Dir {
        path: store_dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<(PathBuf, super::zones::FileId)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            m.is_file().then(|| (p, (m.dev(), m.ino())))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// `path` with `suffix` added to its name (`-wal`, `-shm`, `.new`, ...).
pub fn side_file(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
