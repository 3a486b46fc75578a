//! `verify` for the segmented log and the queue: every kind of damage the
//! recovery rule knows ([`crate::record`]), named by file and offsets.
//!
//! - a file storh did not write, or of a format it does not read;
//! - a damaged range with intact records after it;
//! - a tail holding no intact record (the last file's: an append cut
//!   short; an older segment's: its last records damaged);
//! - offsets no segment holds: a segment missing from the start or the
//!   middle, or one cut short (the next segment's name says where it
//!   should have ended), and segments that overlap;
//! - files in `segments/` that are not segments;
//! - (queue) a consumer position that is not where a record starts.

use crate::log::{LogError, SegmentedLog};
use crate::recfile::{self, Range};
use crate::record::Scan;
use std::path::{Path, PathBuf};

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: PathBuf,
    /// The offsets it covers, end exclusive (none for a whole file).
    pub range: Option<Range>,
    pub problem: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.range {
            Some((a, b)) => write!(
                f,
                "{}: offsets {a}..{b}: {}",
                self.path.display(),
                self.problem
            ),
            None => write!(f, "{}: {}", self.path.display(), self.problem),
        }
    }
}

/// What `verify` found: the intact records, and every problem.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verified {
    pub records: u64,
    pub findings: Vec<Finding>,
    /// Bytes in the files read.
    pub bytes: u64,
}

/// The findings of one scanned file whose first byte is `base`; `last`
/// says whether it is the file appended to.
pub(crate) fn findings_of_scan(path: &Path, base: u64, scan: &Scan, last: bool) -> Vec<Finding> {
    let mut out: Vec<Finding> = scan
        .damaged
        .iter()
        .map(|&(a, b)| Finding {
            path: path.to_path_buf(),
            range: Some((base + a, base + b)),
            problem: format!(
                "{} damaged bytes (intact records follow, at their offsets)",
                b - a
            ),
        })
        .collect();
    if scan.end < scan.len {
        let problem = if last {
            "a torn tail: no intact record (an append cut short; the next writer cuts it)"
        } else {
            "the segment's last bytes hold no intact record (damaged)"
        };
        out.push(Finding {
            path: path.to_path_buf(),
            range: Some((base + scan.end, base + scan.len)),
            problem: problem.to_string(),
        });
    }
    out
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SegmentedLog {
    /// Reads every segment on disk and reports every problem, with its file
    /// and offsets; nothing is changed. `records` counts intact records.
    pub fn verify(&self) -> Result<Verified, LogError> {
        let (bases, strays) = self.segments_for_verify()?;
        let mut out = Verified::default();
        for path in strays {
            out.findings.push(Finding {
                path,
                range: None,
                problem: "not a segment file (segments are named <20-digit offset>.seg)".into(),
            });
        }
        let seg_dir = self.dir().join("segments");
        let mut expected = 0u64;
        for (i, &base) in bases.iter().enumerate() {
            let path = seg_dir.join(format!("{base:020}.seg"));
            if base > expected {
                out.findings.push(Finding {
                    path: path.clone(),
                    range: Some((expected, base)),
                    problem: "no segment holds these offsets (a segment is missing, or the one before was cut short)".into(),
                });
            } else if base < expected {
                out.findings.push(Finding {
                    path: path.clone(),
                    range: Some((base, expected)),
                    problem: "overlaps the segment before it".into(),
                });
            }
            let last = i + 1 == bases.len();
            let scan = match recfile::scan_file(&path, base).map_err(io(&path))? {
                Ok((_, scan)) => scan,
                Err(foreign) => {
                    out.findings.push(Finding {
                        path,
                        range: None,
                        problem: foreign.0,
                    });
                    continue;
                }
            };
            // The writer's own tail is whole up to where it appends.
            let mut scan = scan;
            if let Some((tail_base, tail_len)) = self.writer_tail() {
                if last && tail_base == base {
                    scan.len = scan.len.min(tail_len);
                }
            }
            out.records += scan.records;
            out.bytes += scan.len;
            out.findings
                .extend(findings_of_scan(&path, base, &scan, last));
            expected = base + scan.len;
        }
        Ok(out)
    }
}
