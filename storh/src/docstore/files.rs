//! The collection's files on disk: where a record's file lies (its
//! bucket), atomic durable writes (one file, or a batch with two `syncfs`
//! calls), temporary files and their removal after a crash, and walks of
//! the buckets with the layout they find.

use super::{io, Collection, DocError, Result};
use crate::id;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// How a temporary file's name ends (see [`temp_path`]).
pub(super) const TEMP_SUFFIX: &str = ".tmp";

impl Collection {
    /// The file of record `id` (whether or not it exists).
    pub fn path_of(&self, id: &str) -> Result<PathBuf> {
        let bucket = id::bucket(id).ok_or_else(|| DocError::BadId { id: id.to_string() })?;
        Ok(self
            .dir
            .join("data")
            .join(bucket)
            .join(format!("{id}.jsonc")))
    }

    /// Writes the batch's files: temporaries, `syncfs`, renames, `syncfs`.
    /// `renamed` counts the files renamed into place; on an error the
    /// temporaries not renamed are removed.
    pub(super) fn land_batch(
        &self,
        staged: &[(PathBuf, Vec<u8>)],
        renamed: &mut usize,
    ) -> Result<()> {
        let mut temps = Vec::with_capacity(staged.len());
        let written = (|| {
            let mut buckets = std::collections::BTreeSet::new();
            for (path, text) in staged {
                let dir = path.parent().unwrap_or(&self.dir);
                if buckets.insert(dir.to_path_buf()) {
                    std::fs::create_dir_all(dir).map_err(io(dir))?;
                }
                let temp = temp_path(path);
                temps.push(temp.clone());
                std::fs::write(&temp, text).map_err(io(&temp))?;
            }
            let data = self.dir.join("data");
            let handle = File::open(&data).map_err(io(&data))?;
            // Every temporary file's bytes are on disk before any is
            // renamed into place, so no record is ever seen half written.
            syncfs(&handle, &data)?;
            for (temp, (path, _)) in temps.iter().zip(staged) {
                std::fs::rename(temp, path).map_err(io(path))?;
                *renamed += 1;
            }
            // And the renames, with any new bucket directory (directory
            // entries are filesystem metadata): one call for them all.
            syncfs(&handle, &data)
        })();
        if written.is_err() {
            for temp in &temps[*renamed..] {
                let _ = std::fs::remove_file(temp);
            }
        }
        written
    }

    /// Files in the buckets, counted from the directory listings alone
    /// (no file is opened): a quick total for progress reports.
    pub fn count_files(&self) -> Result<u64> {
        let mut n = 0;
        walk(&self.dir.join("data"), |_, _, _| n += 1)?;
        Ok(n)
    }

    /// Walks the buckets for their sizes, reporting files seen.
    pub fn layout_with(&self, mut progress: impl FnMut(u64)) -> Result<Layout> {
        let mut per_bucket = std::collections::BTreeMap::<String, u64>::new();
        let mut layout = Layout::default();
        walk(&self.dir.join("data"), |path, _, bucket| {
            layout.files += 1;
            progress(layout.files);
            *per_bucket.entry(bucket.to_string()).or_default() += 1;
            layout.bytes += std::fs::symlink_metadata(path).map_or(0, |m| m.len());
        })?;
        layout.buckets = per_bucket.len() as u64;
        layout.min_per_bucket = per_bucket.values().copied().min().unwrap_or(0);
        layout.max_per_bucket = per_bucket.values().copied().max().unwrap_or(0);
        Ok(layout)
    }
}

/// How a collection's files lie in its buckets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// Bucket directories present (at most 256).
    pub buckets: u64,
    /// Files in them, of any kind.
    pub files: u64,
    /// Fewest and most files in one bucket.
    pub min_per_bucket: u64,
    pub max_per_bucket: u64,
    /// Bytes in those files.
    pub bytes: u64,
}

/// Where a write of `path` stages its bytes: a hidden `.tmp` file beside
/// it, removed as an orphan after a crash.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}{TEMP_SUFFIX}", std::process::id()))
}

/// Writes `bytes` to `path` atomically and durably: a temporary file in
/// the same directory, fsync, rename, fsync of the directory.
pub(super) fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // A new bucket must be durable in its parent, too.
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    let temp = temp_path(path);
    let staged = (|| {
        let mut file = File::create(&temp).map_err(io(&temp))?;
        file.write_all(bytes).map_err(io(&temp))?;
        file.sync_all().map_err(io(&temp))?;
        drop(file);
        std::fs::rename(&temp, path).map_err(io(path))
    })();
    if staged.is_err() {
        // Not left for `verify` to report until some later crash.
        let _ = std::fs::remove_file(&temp);
    }
    staged?;
    sync_dir(dir)
}

/// Flushes the whole filesystem `handle` lives on (Linux `syncfs`).
fn syncfs(handle: &File, path: &Path) -> Result<()> {
    // SAFETY: syncfs on a descriptor we own; no memory involved.
    if unsafe { libc::syncfs(handle.as_raw_fd()) } != 0 {
        return Err(io(path)(std::io::Error::last_os_error()));
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Calls `each(path, file name, bucket name)` for every file in every
/// bucket of `data`.
pub(super) fn walk(data: &Path, mut each: impl FnMut(&Path, &str, &str)) -> Result<()> {
    for bucket in std::fs::read_dir(data).map_err(io(data))? {
        let bucket = bucket.map_err(io(data))?.path();
        if !bucket.is_dir() {
            continue;
        }
        let bucket_name = bucket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for entry in std::fs::read_dir(&bucket).map_err(io(&bucket))? {
            let path = entry.map_err(io(&bucket))?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            each(&path, &name, &bucket_name);
        }
    }
    Ok(())
}

/// What lies directly in `data` that is not a directory: files outside
/// every bucket, which [`walk`] does not visit.
pub(super) fn outside_buckets(data: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(data).map_err(io(data))? {
        let path = entry.map_err(io(data))?.path();
        if !path.is_dir() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// Removes `*.tmp` files in every bucket of `data`; returns how many.
pub(super) fn remove_temp_files(data: &Path) -> Result<u64> {
    let mut removed = 0;
    for bucket in std::fs::read_dir(data).map_err(io(data))? {
        let bucket = bucket.map_err(io(data))?.path();
        if bucket.is_dir() {
            removed += remove_temps_in(&bucket)?;
        }
    }
    Ok(removed)
}

/// Removes the `*.tmp` files directly in `dir`; returns how many.
pub(super) fn remove_temps_in(dir: &Path) -> Result<u64> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_file() && path.to_string_lossy().ends_with(TEMP_SUFFIX) {
            std::fs::remove_file(&path).map_err(io(&path))?;
            removed += 1;
        }
    }
    Ok(removed)
}
