//! Queries: pages of every record in id order (`stream`, `stream_page`,
//! `list_ids`), served from the id index, and the secondary-index queries
//! `find` (equality) and `range` (key order), each hit checked against its
//! file.

use super::verify::Finding;
use super::{Collection, DocError, Result};
use crate::id::{self, Id};
use crate::index::{self, IndexKey};
use serde_json::Value;
use std::ops::Bound;

/// One result of [`Collection::range`]: the key it was found under (an
/// array field can list a record under several), its id and the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub key: Value,
    pub id: Id,
    pub doc: Value,
}

/// One page of [`Collection::stream_page`].
#[derive(Debug, Clone, Default)]
pub struct StreamPage {
    pub records: Vec<(Id, Value)>,
    /// Records that could not be read, with the reason.
    pub bad: Vec<Finding>,
    /// The cursor for the next page; `None` when this page was empty.
    pub last: Option<Id>,
}

impl Collection {
    /// Up to `limit` records in id order, after `after` (a cursor: the last
    /// id of the previous page; `None` for the first page). Pages are
    /// served from the id index, never by walking the buckets.
    pub fn stream(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<(Id, Value)>> {
        let page = self.list_ids(after, limit)?;
        let mut out = Vec::with_capacity(page.len());
        for id in page {
            if let Some(v) = self.get(&id)? {
                out.push((id, v));
            }
        }
        Ok(out)
    }

    /// Like [`stream`](Self::stream), but a record whose file cannot be
    /// read or parsed does not stop the walk: it is reported in the page's
    /// `bad` list (path and reason) and the page goes on. `last` is the
    /// cursor for the next page (the last id looked at).
    pub fn stream_page(&mut self, after: Option<&str>, limit: usize) -> Result<StreamPage> {
        let ids = self.list_ids(after, limit)?;
        let mut page = StreamPage {
            last: ids.last().cloned(),
            ..StreamPage::default()
        };
        for id in ids {
            match self.get(&id) {
                Ok(Some(v)) => page.records.push((id, v)),
                Ok(None) => {}
                Err(e) => page.bad.push(Finding {
                    path: self.path_of(&id)?,
                    reason: match e {
                        DocError::Json { message, .. } => format!("invalid JSONC: {message}"),
                        other => other.to_string(),
                    },
                }),
            }
        }
        Ok(page)
    }

    /// Up to `limit` record ids in order after `after`, from the id index
    /// (no file is read).
    pub fn list_ids(&mut self, after: Option<&str>, limit: usize) -> Result<Vec<Id>> {
        let start = match after {
            Some(a) => Bound::Excluded(cursor_num(a)?),
            None => Bound::Unbounded,
        };
        Ok(self
            .index()?
            .ids()
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|&n| id::from_u128(n))
            .collect())
    }

    /// Up to `limit` records whose `field` equals `value` (or, for an
    /// array field, contains it), in id order after the id cursor `after`.
    /// Served from the index on `field` if there is one; otherwise every
    /// record is read (a scan). Numbers compare as f64 (`2` finds `2.0`).
    pub fn find(
        &mut self,
        field: &str,
        value: &Value,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Id, Value)>> {
        let key = IndexKey::of(value).ok_or_else(|| DocError::NotAKey {
            value: value.to_string(),
        })?;
        let indexed = self.fields.iter().any(|f| f == field);
        let mut out = Vec::new();
        let mut cursor = after.map(cursor_num).transpose()?;
        while out.len() < limit {
            // Candidates in id order: the index's entries for the key, or
            // every id.
            let batch: Vec<index::IdNum> = if indexed {
                let lower = match cursor {
                    Some(c) => Bound::Excluded((key.clone(), c)),
                    None => Bound::Included((key.clone(), 0)),
                };
                self.indexed(field)?
                    .range((lower, Bound::Unbounded))
                    .take_while(|(k, _)| *k == key)
                    .take(limit.max(16))
                    .map(|&(_, id)| id)
                    .collect()
            } else {
                let lower = match cursor {
                    Some(c) => Bound::Excluded(c),
                    None => Bound::Unbounded,
                };
                self.index()?
                    .ids()
                    .range((lower, Bound::Unbounded))
                    .take(limit.max(16))
                    .copied()
                    .collect()
            };
            let Some(&last) = batch.last() else {
                break;
            };
            for id in batch {
                if let Some(hit) = self.checked(field, &key, id)? {
                    out.push(hit);
                    if out.len() == limit {
                        break;
                    }
                }
            }
            cursor = Some(last);
        }
        Ok(out)
    }

    /// Up to `limit` records with a key of `field` between `lower` and
    /// `upper`, in key order then id order, after the cursor `after` (the
    /// key and id of the last hit of the previous page). Needs an index on
    /// `field`.
    pub fn range(
        &mut self,
        field: &str,
        lower: Bound<&Value>,
        upper: Bound<&Value>,
        after: Option<(&Value, &str)>,
        limit: usize,
    ) -> Result<Vec<Hit>> {
        let as_key = |v: &Value| {
            IndexKey::of(v).ok_or_else(|| DocError::NotAKey {
                value: v.to_string(),
            })
        };
        // (key, 0) sorts before every entry of that key, (key, MAX) after
        // (ids are hex digits and dashes).
        let mut start = match lower {
            Bound::Included(v) => Bound::Included((as_key(v)?, 0)),
            Bound::Excluded(v) => Bound::Excluded((as_key(v)?, u128::MAX)),
            Bound::Unbounded => Bound::Unbounded,
        };
        if let Some((k, id)) = after {
            let cursor = (as_key(k)?, cursor_num(id)?);
            let past = match &start {
                Bound::Included(s) | Bound::Excluded(s) => cursor >= *s,
                Bound::Unbounded => true,
            };
            if past {
                start = Bound::Excluded(cursor);
            }
        }
        let end = match upper {
            Bound::Included(v) => Bound::Included((as_key(v)?, u128::MAX)),
            Bound::Excluded(v) => Bound::Excluded((as_key(v)?, 0)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        while out.len() < limit && nonempty(&start, &end) {
            let batch: Vec<(IndexKey, index::IdNum)> = self
                .indexed(field)?
                .range((start.clone(), end.clone()))
                .take(limit.max(16))
                .cloned()
                .collect();
            let Some(last) = batch.last().cloned() else {
                break;
            };
            for (key, id) in batch {
                if let Some((id, doc)) = self.checked(field, &key, id)? {
                    out.push(Hit {
                        key: key.to_value(),
                        id,
                        doc,
                    });
                    if out.len() == limit {
                        break;
                    }
                }
            }
            start = Bound::Excluded(last);
        }
        Ok(out)
    }

    fn indexed(
        &mut self,
        field: &str,
    ) -> Result<&std::collections::BTreeSet<(IndexKey, index::IdNum)>> {
        let state = self.index()?;
        state.entries(field).ok_or_else(|| DocError::NotIndexed {
            field: field.to_string(),
            indexed: state.fields().to_vec(),
        })
    }

    /// Record `id` with its text id, if its file still has `key` under
    /// `field`: the file decides, an index entry never overrides what the
    /// record says now.
    fn checked(
        &self,
        field: &str,
        key: &IndexKey,
        id: index::IdNum,
    ) -> Result<Option<(Id, Value)>> {
        let id = id::from_u128(id);
        Ok(self
            .get(&id)?
            .filter(|doc| index::keys_of(doc, field).contains(key))
            .map(|doc| (id, doc)))
    }
}

/// A cursor id as the indexes hold it.
fn cursor_num(id: &str) -> Result<index::IdNum> {
    id::to_u128(id).ok_or_else(|| DocError::BadId { id: id.to_string() })
}

/// Whether `start..end` holds anything (and `BTreeSet::range` accepts it:
/// it panics on a start past the end, or equal ones both excluded).
fn nonempty<T: Ord>(start: &Bound<T>, end: &Bound<T>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s <= e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => s < e,
        _ => true,
    }
}
