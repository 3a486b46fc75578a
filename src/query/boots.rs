//! Boots, as `-b` and `--list-boots` see them: at each start eventd
//! stores a marker event (provider `eventd`, name `boot`, with the
//! kernel's `boot_id` and the boot's start, `boot_time_ns`, in its
//! fields). A boot is every marker with one boot id (eventd may start
//! several times in one boot), starting at the earliest `boot_time_ns`
//! among them, and it lasts until the next boot starts. Events are
//! selected by that time range: events from producers' rings carry no
//! boot id. A marker is a mark in time, not a claim eventd vouches for,
//! so markers from any ring count (a producer that may emit can add one).

use crate::store::rows::EventRow;

/// The provider and name of a boot marker.
pub const MARKER_PROVIDER: &str = "eventd";
pub const MARKER_NAME: &str = "boot";

/// One boot: its id and when it started (ns since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub id: String,
    pub start_ns: i64,
}

/// The boots of a store, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boots(pub Vec<Boot>);

/// Whether `id` is a boot id as the kernel gives it, without dashes: 32
/// lowercase hex digits.
fn is_boot_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A marker's boot id and start, from its fields; `None` for a marker
/// without a well-formed boot id. `boot_time_ns` may be a number or
/// digits in a string; without it, the marker's own time stands in.
fn marker(e: &EventRow) -> Option<(String, i64)> {
    let fields: serde_json::Value = serde_json::from_str(e.fields.as_deref()?).ok()?;
    let id = fields
        .get("boot_id")?
        .as_str()?
        .to_ascii_lowercase()
        .replace('-', "");
    if !is_boot_id(&id) {
        return None;
    }
    let start = match fields.get("boot_time_ns") {
        Some(serde_json::Value::Number(n)) => n.as_i64(),
        Some(serde_json::Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    Some((id, start.unwrap_or(e.ts)))
}

/// Which boot `-b` names, as journalctl reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootSpec {
    /// `0` (or nothing) the newest, `-1` the one before, ...
    FromNewest(u64),
    /// `1` the oldest, `2` the next, ...
    FromOldest(u64),
    /// A boot id, or the start of one, and an offset from it (`ID+1`,
    /// `ID-2`).
    Id { prefix: String, offset: i64 },
}

impl BootSpec {
    pub fn parse(text: &str) -> Result<BootSpec, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "-b {text:?}: expected 0 (the current boot), -1, -2 ... (those before), 1, 2 \
                 ... (from the first), or a boot id (32 hex digits, or its start) with an \
                 optional +N or -N"
            )
        };
        if t.is_empty() {
            return Ok(BootSpec::FromNewest(0));
        }
        if let Ok(n) = t.parse::<i64>() {
            return Ok(if n <= 0 {
                BootSpec::FromNewest(n.unsigned_abs())
            } else {
                BootSpec::FromOldest(n as u64)
            });
        }
        let (prefix, offset) = match t.find(['+', '-']) {
            Some(at) => {
                let offset: i64 = t[at..].trim_start_matches('+').parse().map_err(|_| bad())?;
                (&t[..at], offset)
            }
            None => (t, 0),
        };
        let prefix = prefix.to_ascii_lowercase();
        if prefix.is_empty() || prefix.len() > 32 || !prefix.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(bad());
        }
        Ok(BootSpec::Id { prefix, offset })
    }
}

impl Boots {
    /// The boots the markers `events` record.
    pub fn from_markers(events: &[EventRow]) -> Boots {
        let mut boots: Vec<Boot> = Vec::new();
        for (id, start_ns) in events.iter().filter_map(marker) {
            match boots.iter_mut().find(|b| b.id == id) {
                Some(b) => b.start_ns = b.start_ns.min(start_ns),
                None => boots.push(Boot { id, start_ns }),
            }
        }
        boots.sort_by(|a, b| (a.start_ns, &a.id).cmp(&(b.start_ns, &b.id)));
        Boots(boots)
    }

    /// The index (oldest first) of the boot `spec` names; the error says
    /// why there is none.
    pub fn find(&self, spec: &BootSpec) -> Result<usize, String> {
        let n = self.0.len();
        if n == 0 {
            return Err(
                "no boot is recorded in the store (eventd stores a marker, provider \
                 eventd, name boot, at each start)"
                    .to_string(),
            );
        }
        let out_of_range =
            |what: String| format!("{what}: the store records {n} boot(s) (see --list-boots)");
        match spec {
            BootSpec::FromNewest(back) => (*back < n as u64)
                .then(|| n - 1 - *back as usize)
                .ok_or_else(|| out_of_range(format!("boot -{back}"))),
            BootSpec::FromOldest(k) => (*k <= n as u64)
                .then(|| *k as usize - 1)
                .ok_or_else(|| out_of_range(format!("boot {k}"))),
            BootSpec::Id { prefix, offset } => {
                let matching: Vec<usize> = (0..n)
                    .filter(|&i| self.0[i].id.starts_with(prefix.as_str()))
                    .collect();
                let at = match matching[..] {
                    [one] => one,
                    [] => {
                        return Err(format!(
                            "no boot id starts with {prefix:?} (see --list-boots)"
                        ))
                    }
                    _ => {
                        return Err(format!(
                            "{} boot ids start with {prefix:?}: give more of it",
                            matching.len()
                        ))
                    }
                };
                let target = (at as i64).saturating_add(*offset);
                (0..n as i64)
                    .contains(&target)
                    .then_some(target as usize)
                    .ok_or_else(|| out_of_range(format!("boot {prefix}{offset:+}")))
            }
        }
    }

    /// The time range of boot `i`: from its start to the next one's (none
    /// for the newest).
    pub fn range(&self, i: usize) -> (i64, Option<i64>) {
        (self.0[i].start_ns, self.0.get(i + 1).map(|b| b.start_ns))
    }

    /// journalctl's index of boot `i`: 0 the newest, -1 the one before.
    pub fn offset(&self, i: usize) -> i64 {
        i as i64 - (self.0.len() as i64 - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker_event(ts: i64, fields: &str) -> EventRow {
        EventRow {
            ts,
            cpu: 0,
            seq: ts as u64,
            ring_epoch: 1,
            pid: 1,
            tid: 1,
            uid: 0,
            level: 6,
            provider: MARKER_PROVIDER.into(),
            name: MARKER_NAME.into(),
            message: "boot".into(),
            fields: Some(fields.into()),
        }
    }

    fn id(c: char) -> String {
        c.to_string().repeat(32)
    }

    fn store() -> Boots {
        Boots::from_markers(&[
            marker_event(
                150,
                &format!(r#"{{"boot_id":"{}","boot_time_ns":100}}"#, id('a')),
            ),
            // eventd started again in boot a.
            marker_event(
                180,
                &format!(r#"{{"boot_id":"{}","boot_time_ns":"100"}}"#, id('a')),
            ),
            marker_event(
                350,
                &format!(r#"{{"boot_id":"{}","boot_time_ns":300}}"#, id('b')),
            ),
            marker_event(
                520,
                &format!(r#"{{"boot_id":"{}","boot_time_ns":500}}"#, id('c')),
            ),
            marker_event(600, r#"{"boot_id":"not-an-id","boot_time_ns":1}"#),
            marker_event(700, "not json"),
        ])
    }

    #[test]
    fn markers_of_one_boot_id_are_one_boot() {
        let boots = store();
        let ids: Vec<(&str, i64)> = boots.0.iter().map(|b| (&b.id[..1], b.start_ns)).collect();
        assert_eq!(ids, [("a", 100), ("b", 300), ("c", 500)]);
        assert_eq!(boots.range(0), (100, Some(300)));
        assert_eq!(boots.range(2), (500, None));
        assert_eq!(boots.offset(0), -2);
    }

    #[test]
    fn specs_name_boots_as_journalctl_does() {
        let boots = store();
        let find = |t: &str| BootSpec::parse(t).and_then(|s| boots.find(&s));
        assert_eq!(find(""), Ok(2));
        assert_eq!(find("0"), Ok(2));
        assert_eq!(find("-1"), Ok(1));
        assert_eq!(find("-2"), Ok(0));
        assert_eq!(find("1"), Ok(0));
        assert_eq!(find("3"), Ok(2));
        assert_eq!(find(&id('b')), Ok(1));
        assert_eq!(find("bbb"), Ok(1));
        assert_eq!(find(&format!("{}+1", id('a'))), Ok(1));
        assert_eq!(find("c-2"), Ok(0));
        for bad in ["-3", "4", "d", "a+5", "xyz", "a+x"] {
            assert!(find(bad).is_err(), "{bad}");
        }
        assert!(Boots::default()
            .find(&BootSpec::FromNewest(0))
            .unwrap_err()
            .contains("no boot"));
        let two = Boots(vec![
            Boot {
                id: format!("ab{}", "0".repeat(30)),
                start_ns: 1,
            },
            Boot {
                id: format!("ac{}", "0".repeat(30)),
                start_ns: 2,
            },
        ]);
        let e = two.find(&BootSpec::parse("a").unwrap()).unwrap_err();
        assert!(e.contains("2 boot ids start with \"a\""), "{e}");
    }
}
