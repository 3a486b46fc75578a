//! The records: `insert`, `insert_many`, `put`, `update`, `get` and
//! `delete`, each journaled around its file write, and the JSONC a record
//! file holds.

use super::files::{sync_dir, write_durably};
use super::{io, Collection, DocError, Result};
use crate::id::{self, Id};
use crate::index;
use serde_json::Value;
use std::path::Path;

impl Collection {
    /// Stores `value` under a new id; returns the id.
    pub fn insert(&mut self, value: &Value) -> Result<Id> {
        let id = id::new_id();
        self.put(&id, value)?;
        Ok(id)
    }

    /// Stores `value` under `id`, replacing what was there.
    pub fn put(&mut self, id: &str, value: &Value) -> Result<()> {
        let path = self.path_of(id)?;
        let text = encode(&path, value)?;
        self.journal_append(&index::intent_line(id))?;
        let written = write_durably(&path, &text)
            .and_then(|()| self.journal_append(&index::put_lines(&self.fields, id, value)));
        if let Err(e) = written {
            // The file may or may not have changed: the index follows it.
            self.recheck([id]);
            return Err(e);
        }
        if let Some(state) = &mut self.index {
            state.set_record(id, Some(Some(value)));
        }
        self.compact_journal_if_long();
        Ok(())
    }

    /// After a failed write: makes the loaded index say what the files of
    /// `ids` say now (the journal's unfinished intents do the same for the
    /// next load).
    fn recheck<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        if self.index.is_none() {
            return;
        }
        for id in ids {
            // Unreadable: leave the entry; the intent re-checks it later.
            if let Ok(record) = self.read_record(id) {
                if let Some(state) = &mut self.index {
                    state.set_record(id, record.as_ref().map(Option::as_ref));
                }
            }
        }
    }

    /// Stores each of `docs` under a new id, durably and each atomically,
    /// with two filesystem syncs for the whole batch instead of two fsyncs
    /// per record: every temporary file is written, `syncfs` makes them
    /// durable, they are renamed into place, and `syncfs` again makes the
    /// renames durable. For bulk loads (`syncfs` flushes the whole
    /// filesystem the collection lives on). Returns the ids, in order. On
    /// an error none of the batch is kept (files already renamed into
    /// place are removed again), so the batch can be retried.
    pub fn insert_many(&mut self, docs: &[Value]) -> Result<Vec<Id>> {
        let ids: Vec<Id> = docs.iter().map(|_| id::new_id()).collect();
        let mut staged = Vec::with_capacity(docs.len());
        for (id, doc) in ids.iter().zip(docs) {
            let path = self.path_of(id)?;
            let text = encode(&path, doc)?;
            staged.push((path, text));
        }
        let intents: String = ids.iter().map(|id| index::intent_line(id)).collect();
        self.journal_append(&intents)?;
        let mut renamed = 0;
        let landed = self.land_batch(&staged, &mut renamed).and_then(|()| {
            let mut commits = String::new();
            for (id, doc) in ids.iter().zip(docs) {
                commits.push_str(&index::put_lines(&self.fields, id, doc));
            }
            self.journal_append(&commits)
        });
        if let Err(e) = landed {
            for (path, _) in &staged[..renamed] {
                let _ = std::fs::remove_file(path);
            }
            self.recheck(ids.iter().map(String::as_str));
            return Err(e);
        }
        if let Some(state) = &mut self.index {
            for (id, doc) in ids.iter().zip(docs) {
                state.set_record(id, Some(Some(doc)));
            }
        }
        self.compact_journal_if_long();
        Ok(ids)
    }

    /// Changes record `id` in place with `change`; false (and nothing
    /// written) if there is no such record.
    pub fn update(&mut self, id: &str, change: impl FnOnce(&mut Value)) -> Result<bool> {
        let Some(mut doc) = self.get(id)? else {
            return Ok(false);
        };
        change(&mut doc);
        self.put(id, &doc)?;
        Ok(true)
    }

    /// The record `id`, if it exists. Comments in the file are accepted.
    pub fn get(&self, id: &str) -> Result<Option<Value>> {
        let path = self.path_of(id)?;
        match read_bounded(&path) {
            Ok(bytes) => parse_jsonc(&path, &bytes).map(Some),
            Err(DocError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Removes record `id`; false if there was none.
    pub fn delete(&mut self, id: &str) -> Result<bool> {
        let path = self.path_of(id)?;
        self.journal_append(&index::intent_line(id))?;
        let removed = match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(path.parent().unwrap_or(&self.dir)).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        };
        let existed = match removed.and_then(|existed| {
            self.journal_append(&index::delete_lines(id))
                .map(|()| existed)
        }) {
            Ok(existed) => existed,
            Err(e) => {
                self.recheck([id]);
                return Err(e);
            }
        };
        if let Some(state) = &mut self.index {
            state.set_record(id, None);
        }
        self.compact_journal_if_long();
        Ok(existed)
    }

    /// What the file of `id` holds: `None` if there is none, `Some(None)`
    /// if it does not parse.
    pub(super) fn read_record(&self, id: &str) -> Result<Option<Option<Value>>> {
        let path = self.path_of(id)?;
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(parse_jsonc(&path, &bytes).ok())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }
}

/// The deepest nesting of arrays and objects a record may have: the JSON
/// reader refuses a 128th level (`[]` is one level, a scalar none).
pub const RECORD_DEPTH_MAX: usize = 127;
/// The largest record file written or read (its JSON text).
pub const RECORD_BYTES_MAX: usize = 16 << 20;

/// How deeply `value` nests, counted without recursion (so a hostile
/// value cannot overflow the stack here), stopping once past `limit`.
fn depth_beyond(value: &Value, limit: usize) -> Option<usize> {
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        if depth + 1 > limit {
            return Some(depth + 1);
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    None
}

/// The text a record is stored as, or why `get` could not read it back
/// (nothing is written then).
fn encode(path: &Path, value: &Value) -> Result<Vec<u8>> {
    if let Some(depth) = depth_beyond(value, RECORD_DEPTH_MAX) {
        return Err(DocError::Unreadable {
            path: path.to_path_buf(),
            reason: format!(
                "it nests at least {depth} levels deep; the reader allows {RECORD_DEPTH_MAX}"
            ),
        });
    }
    let text = serde_json::to_vec_pretty(value).map_err(|e| DocError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if text.len() > RECORD_BYTES_MAX {
        return Err(DocError::Unreadable {
            path: path.to_path_buf(),
            reason: format!(
                "it is {} bytes as JSON; a record may have {RECORD_BYTES_MAX}",
                text.len()
            ),
        });
    }
    Ok(text)
}

/// Reads a record file of at most [`RECORD_BYTES_MAX`] bytes.
pub(super) fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(io(path))?;
    let mut bytes = Vec::new();
    file.take(RECORD_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path))?;
    if bytes.len() > RECORD_BYTES_MAX {
        return Err(DocError::Json {
            path: path.to_path_buf(),
            message: format!("the file is over the limit of {RECORD_BYTES_MAX} bytes"),
        });
    }
    Ok(bytes)
}

/// Parses JSON with `//` and `/* */` comments.
pub fn parse_jsonc(path: &Path, bytes: &[u8]) -> Result<Value> {
    serde_json::from_reader(json_comments::StripComments::new(bytes)).map_err(|e| DocError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
