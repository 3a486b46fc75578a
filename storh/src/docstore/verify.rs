//! `verify`: a walk of every file in the buckets that names each one that
//! is not a good record (a temporary file, a wrong name, a wrong bucket,
//! invalid JSONC) with the reason, and of the files in `data/` outside
//! every bucket.

use super::crud::parse_jsonc;
use super::files::{outside_buckets, walk, TEMP_SUFFIX};
use super::{Collection, DocError, Result};
use crate::id;
use std::path::PathBuf;

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: PathBuf,
    pub reason: String,
}

impl Collection {
    /// Checks every file: a record must be valid JSONC, named `<id>.jsonc`
    /// with a canonical id, in the bucket its id names; nothing else lies in
    /// `data/` beside the buckets. Returns what is wrong, with the path and
    /// the reason; `ok` counts the good records.
    pub fn verify(&self) -> Result<(u64, Vec<Finding>)> {
        self.verify_with(|_| {})
    }

    /// [`verify`](Self::verify), reporting files checked.
    pub fn verify_with(&self, mut progress: impl FnMut(u64)) -> Result<(u64, Vec<Finding>)> {
        let mut ok = 0;
        let mut done = 0;
        let data = self.dir.join("data");
        let mut findings = Vec::new();
        for path in outside_buckets(&data)? {
            done += 1;
            progress(done);
            findings.push(Finding {
                path,
                reason: "outside the buckets (a record lives in data/<bucket>/)".into(),
            });
        }
        walk(&data, |path, name, bucket| {
            done += 1;
            progress(done);
            let finding = |reason: String| Finding {
                path: path.to_path_buf(),
                reason,
            };
            if name.ends_with(TEMP_SUFFIX) {
                findings.push(finding(
                    "temporary file left by an interrupted write".into(),
                ));
                return;
            }
            let Some(id) = name.strip_suffix(".jsonc") else {
                findings.push(finding("not a .jsonc record file".into()));
                return;
            };
            let Some(right) = id::bucket(id) else {
                findings.push(finding(format!("{id:?} is not a canonical UUID")));
                return;
            };
            if right != bucket {
                findings.push(finding(format!(
                    "in bucket {bucket}, but its id belongs in {right}"
                )));
                return;
            }
            match std::fs::read(path)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    parse_jsonc(path, &b).map_err(|e| match e {
                        // The finding names the path already.
                        DocError::Json { message, .. } => message,
                        other => other.to_string(),
                    })
                }) {
                Ok(_) => ok += 1,
                Err(e) => findings.push(finding(format!("invalid JSONC: {e}"))),
            }
        })?;
        Ok((ok, findings))
    }
}
