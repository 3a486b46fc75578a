//! A collection's indexes: the id index (every record id, in order) and
//! the secondary indexes on declared fields, held in memory and journaled
//! to `<collection>/index.log`.
//!
//! # The journal
//!
//! A header line names the indexed fields; then one line per change:
//!
//! | line | meaning |
//! |---|---|
//! | `?<id>` | a write of `<id>` begins (before its file is touched) |
//! | `*<id>` | drop every index entry of `<id>` |
//! | `k<id> <field> <key>` | `<id>` has `<key>` (compact JSON) under `<field>` |
//! | `+<id>` | the record exists |
//! | `-<id>` | the record is gone (and so are its entries) |
//! | `!<id>` | the write of `<id>` is finished |
//!
//! A put appends `?id`, writes the file durably, then appends `*id`, its
//! `k` lines, `+id` and `!id` in one `write`. A writer killed anywhere in
//! that leaves an intent without its `!`: replay re-checks exactly those
//! ids against their files (the half-done write's index entries), so
//! recovery after a crash costs one read of the journal, not a walk of the
//! collection. The journal is not fsynced per write: a process crash loses
//! nothing that reached `write`, and a machine crash (a new boot id) or a
//! journal that does not parse throws it away and rebuilds from the files.

use crate::id::{self, Id};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// The journal's file name in the collection directory.
pub const JOURNAL: &str = "index.log";
/// The declared fields' file name in the collection directory.
pub const FIELDS: &str = "indexes.json";
const HEADER_PREFIX: &str = "storh-index 1 ";

/// A value as an index orders it: null, then booleans, numbers (as f64),
/// strings. Objects and arrays are not keys (an array field gives one key
/// per scalar element).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IndexKey {
    Null,
    Bool(bool),
    /// An f64's bits, mapped so that unsigned order is numeric order.
    Number(u64),
    String(String),
}

impl IndexKey {
    /// The key of a scalar value; `None` for objects and arrays.
    pub fn of(value: &Value) -> Option<IndexKey> {
        match value {
            Value::Null => Some(IndexKey::Null),
            Value::Bool(b) => Some(IndexKey::Bool(*b)),
            Value::Number(n) => n.as_f64().map(|f| IndexKey::Number(ordered_bits(f))),
            Value::String(s) => Some(IndexKey::String(s.clone())),
            Value::Array(_) | Value::Object(_) => None,
        }
    }

    /// The key as a JSON value (numbers as f64).
    pub fn to_value(&self) -> Value {
        match self {
            IndexKey::Null => Value::Null,
            IndexKey::Bool(b) => Value::Bool(*b),
            IndexKey::Number(bits) => serde_json::Number::from_f64(from_ordered_bits(*bits))
                .map_or(Value::Null, Value::Number),
            IndexKey::String(s) => Value::String(s.clone()),
        }
    }
}

/// Maps an f64 to a u64 whose order is the numbers' order (-0 and 0 are
/// one key; JSON has no NaN).
fn ordered_bits(f: f64) -> u64 {
    let f = if f == 0.0 { 0.0 } else { f };
    let bits = f.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn from_ordered_bits(bits: u64) -> f64 {
    if bits >> 63 == 1 {
        f64::from_bits(bits & !(1 << 63))
    } else {
        f64::from_bits(!bits)
    }
}

/// Whether `field` can be indexed: a dot path of names made of ASCII
/// letters, digits, `_` and `-`.
pub fn valid_field(field: &str) -> bool {
    !field.is_empty()
        && field.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

/// The keys `doc` has under `field` (a dot path), sorted and distinct: a
/// scalar gives one, an array one per scalar element, anything else none.
pub fn keys_of(doc: &Value, field: &str) -> Vec<IndexKey> {
    let mut value = doc;
    for part in field.split('.') {
        match value.get(part) {
            Some(v) => value = v,
            None => return Vec::new(),
        }
    }
    let mut keys: Vec<IndexKey> = match value {
        Value::Array(items) => items.iter().filter_map(IndexKey::of).collect(),
        other => IndexKey::of(other).into_iter().collect(),
    };
    keys.sort();
    keys.dedup();
    keys
}

/// An id as the indexes hold it ([`id::to_u128`]).
pub type IdNum = u128;

/// The indexes of one collection, in memory.
#[derive(Debug, Default)]
pub struct IndexState {
    fields: Vec<String>,
    ids: BTreeSet<IdNum>,
    /// Per field (in `fields` order), its `(key, id)` entries.
    by_key: Vec<BTreeSet<(IndexKey, IdNum)>>,
    /// Each record's entries (field position, key), so a rewrite can drop
    /// them without reading the old file.
    entries_of: HashMap<IdNum, Vec<(usize, IndexKey)>>,
}

/// What reading a journal gave.
#[derive(Debug)]
pub struct Replayed {
    pub state: IndexState,
    /// Ids whose write began and never finished.
    pub unfinished: BTreeSet<Id>,
    /// Lines read (to decide when the journal is worth compacting).
    pub lines: u64,
}

impl IndexState {
    pub fn new(fields: &[String]) -> IndexState {
        IndexState {
            fields: fields.to_vec(),
            by_key: fields.iter().map(|_| BTreeSet::new()).collect(),
            ..IndexState::default()
        }
    }

    pub fn fields(&self) -> &[String] {
        &self.fields
    }

    pub fn ids(&self) -> &BTreeSet<IdNum> {
        &self.ids
    }

    /// The `(key, id)` entries of `field`, if it is indexed.
    pub fn entries(&self, field: &str) -> Option<&BTreeSet<(IndexKey, IdNum)>> {
        let at = self.fields.iter().position(|f| f == field)?;
        self.by_key.get(at)
    }

    /// Makes the state say what the file of `id` says: `None` if it does
    /// not exist, `Some(None)` if it exists but does not parse (listed,
    /// with no entries), `Some(Some(doc))` otherwise.
    /// (An `id` that is not canonical is never a record: ignored.)
    pub fn set_record(&mut self, id: &str, record: Option<Option<&Value>>) {
        let Some(n) = id::to_u128(id) else { return };
        self.set_record_num(n, record);
    }

    fn set_record_num(&mut self, id: IdNum, record: Option<Option<&Value>>) {
        self.drop_entries(id);
        match record {
            None => {
                self.ids.remove(&id);
            }
            Some(doc) => {
                self.ids.insert(id);
                if let Some(doc) = doc {
                    for at in 0..self.fields.len() {
                        for key in keys_of(doc, &self.fields[at]) {
                            self.add_entry(id, at, key);
                        }
                    }
                }
            }
        }
    }

    fn drop_entries(&mut self, id: IdNum) {
        if let Some(entries) = self.entries_of.remove(&id) {
            for (at, key) in entries {
                if let Some(set) = self.by_key.get_mut(at) {
                    set.remove(&(key, id));
                }
            }
        }
    }

    fn add_entry(&mut self, id: IdNum, at: usize, key: IndexKey) {
        if let Some(set) = self.by_key.get_mut(at) {
            set.insert((key.clone(), id));
            self.entries_of.entry(id).or_default().push((at, key));
        }
    }

    /// The whole state as a fresh journal (header and one `+`/`k` group
    /// per record).
    pub fn snapshot(&self) -> String {
        let mut out = header(&self.fields);
        for &n in &self.ids {
            let id = id::from_u128(n);
            out.push('+');
            out.push_str(&id);
            out.push('\n');
            for (at, key) in self.entries_of.get(&n).into_iter().flatten() {
                push_entry(&mut out, &id, &self.fields[*at], key);
            }
        }
        out
    }

    /// About the lines a fresh journal of this state has (header, one per
    /// record, one per distinct entry), for deciding on compaction. Asked
    /// after every write: a sum over the indexed fields' sets (each length
    /// is kept by the set), never a walk of the records.
    pub fn live_lines(&self) -> u64 {
        (self.ids.len() + self.by_key.iter().map(BTreeSet::len).sum::<usize>()) as u64 + 1
    }

    /// Reads a journal. `Err` says why it cannot be trusted (then the
    /// indexes are rebuilt from the files).
    pub fn replay(text: &str, fields: &[String]) -> Result<Replayed, String> {
        if !text.ends_with('\n') {
            return Err("its last line is torn".into());
        }
        let mut lines = text.lines();
        let head = lines.next().unwrap_or_default();
        if head != header(fields).trim_end() {
            return Err(format!(
                "its header {head:?} does not name the declared fields {fields:?}"
            ));
        }
        let mut state = IndexState::new(fields);
        let mut unfinished = BTreeSet::new();
        let mut count = 1;
        for (n, line) in lines.enumerate() {
            count += 1;
            let bad = || format!("line {} is malformed: {line:?}", n + 2);
            let (op, rest) = line.split_at_checked(1).ok_or_else(bad)?;
            if op == "k" {
                let mut parts = rest.splitn(3, ' ');
                let (Some(id), Some(field), Some(key)) = (parts.next(), parts.next(), parts.next())
                else {
                    return Err(bad());
                };
                let key = serde_json::from_str::<Value>(key)
                    .ok()
                    .and_then(|v| IndexKey::of(&v))
                    .ok_or_else(bad)?;
                let id = id::to_u128(id).ok_or_else(bad)?;
                let at = state
                    .fields
                    .iter()
                    .position(|f| f == field)
                    .ok_or_else(bad)?;
                state.add_entry(id, at, key);
                continue;
            }
            let id = id::to_u128(rest).ok_or_else(bad)?;
            match op {
                "?" => {
                    unfinished.insert(rest.to_string());
                }
                "!" => {
                    unfinished.remove(rest);
                }
                "*" => state.drop_entries(id),
                "+" => {
                    state.ids.insert(id);
                }
                "-" => state.set_record_num(id, None),
                _ => return Err(bad()),
            }
        }
        Ok(Replayed {
            state,
            unfinished,
            lines: count,
        })
    }
}

/// Every `(field, key)` entry `doc` has under `fields` (for journal lines).
fn entries_of_doc(fields: &[String], doc: &Value) -> Vec<(String, IndexKey)> {
    fields
        .iter()
        .flat_map(|f| keys_of(doc, f).into_iter().map(move |k| (f.clone(), k)))
        .collect()
}

/// The journal's first line for `fields`.
pub fn header(fields: &[String]) -> String {
    let list = serde_json::to_string(fields).unwrap_or_else(|_| "[]".into());
    format!("{HEADER_PREFIX}{list}\n")
}

fn push_entry(out: &mut String, id: &str, field: &str, key: &IndexKey) {
    out.push('k');
    out.push_str(id);
    out.push(' ');
    out.push_str(field);
    out.push(' ');
    out.push_str(&key.to_value().to_string());
    out.push('\n');
}

/// The line that opens a write of `id`.
pub fn intent_line(id: &str) -> String {
    format!("?{id}\n")
}

/// The lines that finish a put of `doc` under `id`.
pub fn put_lines(fields: &[String], id: &str, doc: &Value) -> String {
    let mut out = format!("*{id}\n");
    for (field, key) in entries_of_doc(fields, doc) {
        push_entry(&mut out, id, &field, &key);
    }
    out.push_str(&format!("+{id}\n!{id}\n"));
    out
}

/// The lines that finish a delete of `id`.
pub fn delete_lines(id: &str) -> String {
    format!("-{id}\n!{id}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_order_like_their_values() {
        let values = [
            json!(null),
            json!(false),
            json!(true),
            json!(-1e300),
            json!(-2),
            json!(-0.5),
            json!(0),
            json!(0.25),
            json!(3),
            json!(1e300),
            json!(""),
            json!("a"),
            json!("b"),
        ];
        let keys: Vec<IndexKey> = values.iter().map(|v| IndexKey::of(v).unwrap()).collect();
        for pair in keys.windows(2) {
            assert!(pair[0] < pair[1], "{pair:?}");
        }
        for (v, k) in values.iter().zip(&keys) {
            assert_eq!(IndexKey::of(&k.to_value()).as_ref(), Some(k), "{v}");
        }
        assert_eq!(IndexKey::of(&json!(-0.0)), IndexKey::of(&json!(0)));
        assert_eq!(IndexKey::of(&json!(2)), IndexKey::of(&json!(2.0)));
    }

    #[test]
    fn fields_are_dot_paths_and_arrays_give_one_key_per_element() {
        let doc = json!({"user": {"name": "ada", "tags": ["x", 1, "x", {"no": 1}]}});
        assert_eq!(
            keys_of(&doc, "user.name"),
            vec![IndexKey::String("ada".into())]
        );
        assert_eq!(keys_of(&doc, "user.tags").len(), 2);
        assert!(keys_of(&doc, "user").is_empty(), "objects are not keys");
        assert!(keys_of(&doc, "user.missing").is_empty());
        assert!(valid_field("user.name") && valid_field("a-b_c.d1"));
        assert!(!valid_field("") && !valid_field("a..b") && !valid_field("a b"));
    }

    #[test]
    fn a_journal_replays_and_names_unfinished_writes() {
        let fields = vec!["n".to_string()];
        let a = "018bcfe5-6800-7000-8000-2d5dba6274da";
        let b = "018bcfe5-6800-7001-8000-aa5dba6274da";
        let mut text = header(&fields);
        text += &intent_line(a);
        text += &put_lines(&fields, a, &json!({"n": 1}));
        text += &intent_line(a);
        text += &put_lines(&fields, a, &json!({"n": 2}));
        text += &intent_line(b);
        let r = IndexState::replay(&text, &fields).unwrap();
        assert_eq!(r.unfinished.iter().collect::<Vec<_>>(), vec![b]);
        let entries: Vec<_> = r.state.entries("n").unwrap().iter().cloned().collect();
        let a_num = id::to_u128(a).unwrap();
        assert_eq!(entries, vec![(IndexKey::of(&json!(2)).unwrap(), a_num)]);
        // A snapshot says the same in fewer lines.
        let again = IndexState::replay(&r.state.snapshot(), &fields).unwrap();
        assert_eq!(
            again.state.entries("n").unwrap(),
            r.state.entries("n").unwrap()
        );
        assert_eq!(again.state.ids(), r.state.ids());
        // Torn, foreign or undeclared: not trusted.
        assert!(IndexState::replay(&text[..text.len() - 3], &fields).is_err());
        assert!(IndexState::replay(&text, &["m".to_string()]).is_err());
        let bad = format!("{text}k{a} n {{\n");
        assert!(IndexState::replay(&bad, &fields)
            .unwrap_err()
            .contains("line"));
    }
}
