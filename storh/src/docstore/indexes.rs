//! Declaring the secondary indexes: `create_index` and `drop_index`, the
//! declared fields' file (`indexes.json`) they rewrite, `reindex`, and the
//! counts `stats` takes from the indexes.

use super::files::write_durably;
use super::{io, Collection, DocError, Result};
use crate::index;
use std::path::Path;

/// Counts from the indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub records: u64,
    /// Each indexed field and its number of entries.
    pub indexes: Vec<(String, u64)>,
}

impl Collection {
    /// Declares a secondary index on `field` (a dot path; an array field
    /// indexes each scalar element) and builds it, reading every record.
    /// False if it existed already.
    pub fn create_index(&mut self, field: &str) -> Result<bool> {
        self.create_index_with(field, |_| {})
    }

    /// [`create_index`](Self::create_index), reporting files read.
    pub fn create_index_with(&mut self, field: &str, progress: impl FnMut(u64)) -> Result<bool> {
        if !index::valid_field(field) {
            return Err(DocError::BadField {
                field: field.to_string(),
            });
        }
        if self.fields.iter().any(|f| f == field) {
            return Ok(false);
        }
        self.fields.push(field.to_string());
        // The journal's header still names the old fields: should we die
        // before the rebuild below finishes, the next load sees the
        // mismatch and rebuilds.
        write_fields(&self.dir, &self.fields)?;
        self.index = None;
        let state = self.rebuild(progress)?;
        self.index = Some(state);
        Ok(true)
    }

    /// Drops the index on `field`; false if there was none.
    pub fn drop_index(&mut self, field: &str) -> Result<bool> {
        if !self.fields.iter().any(|f| f == field) {
            return Ok(false);
        }
        self.fields.retain(|f| f != field);
        write_fields(&self.dir, &self.fields)?;
        // The remaining entries are re-derived from the files.
        self.index = None;
        let state = self.rebuild(|_| {})?;
        self.index = Some(state);
        Ok(true)
    }

    /// Records and index entries, from the indexes.
    pub fn stats(&mut self) -> Result<Stats> {
        let fields = self.fields.clone();
        let state = self.index()?;
        Ok(Stats {
            records: state.ids().len() as u64,
            indexes: fields
                .iter()
                .map(|f| (f.clone(), state.entries(f).map_or(0, |e| e.len() as u64)))
                .collect(),
        })
    }

    /// Rebuilds every index from the files (reading each one); returns
    /// the number of records.
    pub fn reindex(&mut self) -> Result<u64> {
        self.reindex_with(|_| {})
    }

    /// [`reindex`](Self::reindex), reporting files read.
    pub fn reindex_with(&mut self, progress: impl FnMut(u64)) -> Result<u64> {
        self.index = None;
        let state = self.rebuild(progress)?;
        let n = state.ids().len() as u64;
        self.index = Some(state);
        Ok(n)
    }
}

/// The declared index fields (`indexes.json`, a JSON list of strings).
pub(super) fn read_fields(dir: &Path) -> Result<Vec<String>> {
    let path = dir.join(index::FIELDS);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&path)(e)),
    };
    let fields: Vec<String> = serde_json::from_str(&text).map_err(|e| DocError::Declared {
        path: path.clone(),
        message: format!("not a JSON list of field names: {e}"),
    })?;
    if let Some(bad) = fields.iter().find(|f| !index::valid_field(f)) {
        return Err(DocError::Declared {
            path,
            message: format!("{bad:?} is not an indexable field"),
        });
    }
    Ok(fields)
}

fn write_fields(dir: &Path, fields: &[String]) -> Result<()> {
    let text = serde_json::to_vec_pretty(fields).unwrap_or_else(|_| b"[]".to_vec());
    write_durably(&dir.join(index::FIELDS), &text)
}
