//! How far the export stage has got in each shard file, as retention needs
//! to know it: rows the export stage has not sent yet are not deleted by
//! age, and a deletion the size limit forces counts them in a gap row.
//!
//! The export stage writes this (it learns the file of each instance and
//! moves its cursors); the retention coordinator reads it before every
//! request. Until the export stage has said anything about a file, nothing
//! of that file counts as exported.

use super::trim::Exported;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct ExportFloors {
    by_path: Mutex<HashMap<PathBuf, Exported>>,
}

impl ExportFloors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Exported>> {
        // Every update is one insert: a poisoned map is still consistent.
        self.by_path.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The export stage has sent every row of `path` up to `exported`.
    pub fn set(&self, path: &Path, exported: Exported) {
        self.lock().insert(path.to_path_buf(), exported);
    }

    /// How far `path` is exported (nothing, if the export stage has not
    /// said).
    pub fn get(&self, path: &Path) -> Exported {
        self.lock().get(path).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_not_reported_counts_as_not_exported() {
        let floors = ExportFloors::default();
        let p = Path::new("/s/shard-000.db");
        assert_eq!(floors.get(p), Exported::default());
        floors.set(p, Exported { events: 9, gaps: 2 });
        assert_eq!(floors.get(p), Exported { events: 9, gaps: 2 });
        assert_eq!(floors.get(Path::new("/s/shard-001.db")).events, 0);
    }
}
