//! Query slots and each uid's share of them.
//!
//! MaxConcurrentQueries (Q) queries run at once, follows included. So that
//! one user cannot hold every slot (with `--follow` queries, for good):
//!
//! - **A share per uid.** A uid other than root and eventd's own user holds
//!   at most `max(1, Q / 4)` slots at once; its next query is answered
//!   `busy`, saying that it holds its share.
//! - **Slots kept.** Other uids never take the last free slots: one is kept
//!   for root and one for eventd's own user (one in all when eventd runs as
//!   root), never more than `Q - 1`, so that root can always look, however
//!   many users hold their shares.
//! - **Root and eventd's own user** are held to Q only: their queries are
//!   the host's own tools (a dashboard running as eventd's user may well
//!   follow more than a share), and root can stop eventd anyway.
//!
//! A slot is taken by the accept thread once the request is read and
//! understood, before the query's thread starts, and given back when the
//! query's thread drops it ([`QuerySlot`]).

use super::stats::QueryStats;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Who may take a slot, given what is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ShareRule {
    /// MaxConcurrentQueries.
    pub max: u64,
    /// Slots one uid (not root, not eventd's own) may hold at once.
    pub share: u64,
    /// Free slots other uids never take.
    pub kept: u64,
    /// eventd's own uid.
    pub own_uid: u32,
}

/// Why a query was not given a slot (said in its `busy` answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    #[error("{max} queries are running (MaxConcurrentQueries); try again")]
    Full { max: u64 },
    #[error(
        "uid {uid} holds its share of the query slots: {share} of MaxConcurrentQueries = \
         {max}, follows included (a quarter each, at least one; root and eventd's own \
         user are held to the total only); end one of its queries, or try again later"
    )]
    Share { uid: u32, share: u64, max: u64 },
    #[error(
        "{running} of MaxConcurrentQueries = {max} queries are running and the last \
         {kept} free slot(s) are kept for root and eventd's own user; try again later"
    )]
    Kept { running: u64, max: u64, kept: u64 },
}

impl ShareRule {
    pub fn new(max: u64, own_uid: u32) -> ShareRule {
        let keepers = if own_uid == 0 { 1 } else { 2 };
        ShareRule {
            max,
            share: (max / 4).max(1),
            kept: keepers.min(max.saturating_sub(1)),
            own_uid,
        }
    }

    /// Root and eventd's own user.
    pub fn unlimited(&self, uid: u32) -> bool {
        uid == 0 || uid == self.own_uid
    }

    /// Whether `uid`, holding `mine` of the `running` slots, may take one
    /// more.
    pub fn check(&self, uid: u32, mine: u64, running: u64) -> Result<(), Refusal> {
        let max = self.max;
        if running >= max {
            return Err(Refusal::Full { max });
        }
        if self.unlimited(uid) {
            return Ok(());
        }
        if mine >= self.share {
            return Err(Refusal::Share {
                uid,
                share: self.share,
                max,
            });
        }
        if running >= max - self.kept {
            return Err(Refusal::Kept {
                running,
                max,
                kept: self.kept,
            });
        }
        Ok(())
    }
}

/// The slots held now, per uid.
pub(super) struct Slots {
    rule: ShareRule,
    /// Slots held per uid (an entry goes when it reaches 0, so there are at
    /// most MaxConcurrentQueries entries). The total is `stats.running`,
    /// changed only under this lock.
    held: Mutex<HashMap<u32, u64>>,
    stats: Arc<QueryStats>,
}

/// A query slot, given back when dropped (also when the client vanished or
/// the thread could not start).
pub(super) struct QuerySlot {
    slots: Arc<Slots>,
    uid: u32,
}

impl Drop for QuerySlot {
    fn drop(&mut self) {
        self.slots.give_back(self.uid);
    }
}

impl Slots {
    pub fn new(rule: ShareRule, stats: Arc<QueryStats>) -> Slots {
        Slots {
            rule,
            held: Mutex::new(HashMap::new()),
            stats,
        }
    }

    pub fn rule(&self) -> ShareRule {
        self.rule
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u64>> {
        // The counts are updated in single steps: a panic elsewhere while
        // the lock was held leaves them whole.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `uid`, or why not.
    pub fn take(self: &Arc<Self>, uid: u32) -> Result<QuerySlot, Refusal> {
        let mut held = self.held();
        // Relaxed: `running` only changes under the lock held here.
        let running = self.stats.running.load(Ordering::Relaxed);
        let mine = held.get(&uid).copied().unwrap_or(0);
        self.rule.check(uid, mine, running)?;
        held.insert(uid, mine + 1);
        // Relaxed: readers outside the lock only report the figure.
        self.stats.running.store(running + 1, Ordering::Relaxed);
        Ok(QuerySlot {
            slots: self.clone(),
            uid,
        })
    }

    fn give_back(&self, uid: u32) {
        let mut held = self.held();
        if let Some(mine) = held.get_mut(&uid) {
            *mine -= 1;
            if *mine == 0 {
                held.remove(&uid);
            }
            // Relaxed: as in `take`, the lock orders every change.
            let running = self.stats.running.load(Ordering::Relaxed);
            self.stats
                .running
                .store(running.saturating_sub(1), Ordering::Relaxed);
        }
    }

    /// Slots `uid` holds now.
    #[cfg(test)]
    fn held_by(&self, uid: u32) -> u64 {
        self.held().get(&uid).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: u64, own_uid: u32) -> Arc<Slots> {
        Arc::new(Slots::new(
            ShareRule::new(max, own_uid),
            Arc::new(QueryStats::default()),
        ))
    }

    #[test]
    fn a_uid_holds_its_share_and_the_last_slot_is_kept_for_root() {
        let s = slots(8, 0);
        assert_eq!((s.rule().share, s.rule().kept), (2, 1));
        let mut held: Vec<QuerySlot> = (0..2).map(|_| s.take(1000).unwrap()).collect();
        let e = s.take(1000).err().unwrap();
        assert!(matches!(
            e,
            Refusal::Share {
                uid: 1000,
                share: 2,
                max: 8
            }
        ));
        assert!(e.to_string().contains("uid 1000 holds its share"), "{e}");
        for uid in [1001, 1002] {
            held.extend((0..2).map(|_| s.take(uid).unwrap()));
        }
        held.push(s.take(1003).unwrap());
        // Seven held by others: the eighth is root's.
        let e = s.take(1003).err().unwrap();
        assert!(matches!(
            e,
            Refusal::Kept {
                running: 7,
                max: 8,
                kept: 1
            }
        ));
        assert!(e.to_string().contains("kept for root"), "{e}");
        held.push(s.take(0).unwrap());
        assert!(matches!(s.take(0), Err(Refusal::Full { max: 8 })));
        assert_eq!(s.stats.running.load(Ordering::Relaxed), 8);
        // Given back when dropped; an emptied uid leaves no entry.
        held.truncate(2);
        assert_eq!(s.stats.running.load(Ordering::Relaxed), 2);
        assert_eq!((s.held_by(1000), s.held_by(1001)), (2, 0));
        assert_eq!(s.held().len(), 1);
        drop(held);
        assert_eq!(s.stats.running.load(Ordering::Relaxed), 0);
        assert!(s.held().is_empty());
    }

    #[test]
    fn root_and_eventds_own_user_are_held_to_the_total_only() {
        let s = slots(4, 120);
        assert_eq!((s.rule().share, s.rule().kept), (1, 2));
        let own: Vec<QuerySlot> = (0..3).map(|_| s.take(120).unwrap()).collect();
        // One free slot, and it is kept: another uid is refused, root not.
        assert!(matches!(s.take(1000), Err(Refusal::Kept { .. })));
        let root = s.take(0).unwrap();
        assert!(matches!(s.take(120), Err(Refusal::Full { max: 4 })));
        drop((own, root));
        // Each of the two keepers finds a slot after others took theirs.
        let others: Vec<QuerySlot> = [1000, 1001].iter().map(|&u| s.take(u).unwrap()).collect();
        assert!(matches!(s.take(1002), Err(Refusal::Kept { kept: 2, .. })));
        let (_a, _b) = (s.take(0).unwrap(), s.take(120).unwrap());
        drop(others);
    }

    #[test]
    fn with_one_or_two_slots_others_still_get_one() {
        // Q = 1: nothing is kept (there would be nothing left for others).
        let s = slots(1, 0);
        assert_eq!((s.rule().share, s.rule().kept), (1, 0));
        let only = s.take(1000).unwrap();
        assert!(matches!(s.take(0), Err(Refusal::Full { max: 1 })));
        drop(only);
        // Q = 2: one for others, one kept.
        let s = slots(2, 0);
        let one = s.take(1000).unwrap();
        assert!(matches!(s.take(1001), Err(Refusal::Kept { .. })));
        let _root = s.take(0).unwrap();
        drop(one);
    }
}
