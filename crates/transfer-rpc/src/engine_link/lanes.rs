//! Server-wide lane ids.
//!
//! A lane names the immediates of one inbound stream
//! (`protocol::engine::lane_imm`); immediate counters belong to the whole
//! engine, so lane ids are unique across every session of a server. Ids are
//! handed out round robin over 1..=0xFFFF, so a freed id is reused as late
//! as possible; a reused id is reported as such, so that the caller can
//! discard immediates of its previous owner that arrived after it closed.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::protocol::engine::{LaneId, MAX_LANE};

struct Lanes {
    owners: HashMap<u32, u64>,
    next: u32,
    used_before: Vec<bool>,
}

/// Which session owns each live lane.
pub struct LaneTable {
    inner: Mutex<Lanes>,
}

impl std::fmt::Debug for LaneTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneTable")
            .field("live", &self.live())
            .finish()
    }
}

/// A freshly allocated lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewLane {
    /// The lane.
    pub lane: LaneId,
    /// True when the id had an owner before (stale immediates may exist).
    pub reused: bool,
}

impl Default for LaneTable {
    fn default() -> Self {
        LaneTable::new()
    }
}

impl LaneTable {
    /// An empty table.
    pub fn new() -> Self {
        LaneTable {
            inner: Mutex::new(Lanes {
                owners: HashMap::new(),
                next: 1,
                used_before: vec![false; MAX_LANE as usize + 1],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lanes> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocates a lane for `session`; `None` when all 65535 are live.
    pub fn alloc(&self, session: u64) -> Option<NewLane> {
        let mut l = self.lock();
        for _ in 0..MAX_LANE {
            let id = l.next;
            l.next = if l.next >= MAX_LANE { 1 } else { l.next + 1 };
            if l.owners.contains_key(&id) {
                continue;
            }
            l.owners.insert(id, session);
            let slot = l.used_before.get_mut(id as usize)?;
            let reused = std::mem::replace(slot, true);
            return Some(NewLane {
                lane: LaneId(id),
                reused,
            });
        }
        None
    }

    /// The session that owns `lane`.
    pub fn owner(&self, lane: LaneId) -> Option<u64> {
        self.lock().owners.get(&lane.0).copied()
    }

    /// Frees `lane` if `session` owns it; returns whether it did.
    pub fn free(&self, lane: LaneId, session: u64) -> bool {
        let mut l = self.lock();
        if l.owners.get(&lane.0) == Some(&session) {
            l.owners.remove(&lane.0);
            true
        } else {
            false
        }
    }

    /// Frees every lane of `session`; returns how many.
    pub fn free_all(&self, session: u64) -> usize {
        let mut l = self.lock();
        let before = l.owners.len();
        l.owners.retain(|_, s| *s != session);
        before - l.owners.len()
    }

    /// Number of live lanes.
    pub fn live(&self) -> usize {
        self.lock().owners.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_round_robin_and_owned() {
        let t = LaneTable::new();
        let a = t.alloc(1);
        let b = t.alloc(2);
        assert_eq!(a.map(|n| n.lane), Some(LaneId(1)));
        assert_eq!(b.map(|n| n.lane), Some(LaneId(2)));
        assert!(!t.free(LaneId(1), 2), "not the owner");
        assert!(t.free(LaneId(1), 1));
        // Round robin: the freed id is not handed out again at once.
        assert_eq!(t.alloc(3).map(|n| n.lane), Some(LaneId(3)));
        assert_eq!(t.free_all(2), 1);
        assert_eq!(t.owner(LaneId(3)), Some(3));
        assert_eq!(t.live(), 1);
    }

    #[test]
    fn exhaustion_and_reuse_flag() {
        let t = LaneTable::new();
        for _ in 0..MAX_LANE {
            assert!(t.alloc(1).is_some_and(|n| !n.reused && n.lane.0 != 0));
        }
        assert!(t.alloc(1).is_none());
        assert!(t.free(LaneId(9), 1));
        assert_eq!(
            t.alloc(2),
            Some(NewLane {
                lane: LaneId(9),
                reused: true
            })
        );
    }
}
