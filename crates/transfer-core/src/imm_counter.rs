//! Receiver-side immediate counters.
//!
//! Each 32-bit immediate value has a counter of arrivals. Expectations
//! (`expect(imm, count, action)`) are served in the order they were set:
//! once `count` arrivals are there they are consumed and the action fires.
//! Arrivals beyond the current expectation are kept for the next one, so
//! the result is the same whatever the order of arrival and whether the
//! expectation is set before or after the writes land (EFA SRD reorders;
//! ConnectX RC does not).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::completion::Delivery;
use crate::oneshot;

/// What happens when an expectation is met.
pub(crate) enum ImmAction {
    /// A user callback (run on the callback thread).
    Callback(Box<dyn FnOnce() + Send>),
    /// Wake a waiter.
    Wake(oneshot::Sender<()>),
}

impl ImmAction {
    fn fire(self) -> Delivery {
        match self {
            ImmAction::Callback(cb) => Delivery::Deferred(cb),
            ImmAction::Wake(tx) => {
                tx.send(());
                Delivery::Done
            }
        }
    }
}

struct Expectation {
    id: u64,
    count: u64,
    action: ImmAction,
}

#[derive(Default)]
struct Counter {
    arrived: u64,
    waiting: VecDeque<Expectation>,
}

/// Lock stripes: arrivals for different immediates rarely contend.
const STRIPES: usize = 16;

/// The counters of one engine (shared by its workers and API threads).
pub(crate) struct ImmCounters {
    stripes: [Mutex<Stripe>; STRIPES],
}

#[derive(Default)]
struct Stripe {
    counters: HashMap<u32, Counter>,
    next_id: u64,
}

impl ImmCounters {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            stripes: std::array::from_fn(|_| Mutex::new(Stripe::default())),
        })
    }

    fn stripe(&self, imm: u32) -> MutexGuard<'_, Stripe> {
        // Critical sections only update counters; poison cannot break them.
        self.stripes[(imm as usize) % STRIPES]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `n` arrivals of `imm`; returns the deliveries of expectations now met.
    pub(crate) fn arrive(&self, imm: u32, n: u64, fired: &mut Vec<Delivery>) {
        let mut s = self.stripe(imm);
        let c = s.counters.entry(imm).or_default();
        c.arrived += n;
        drain_met(c, fired);
    }

    /// Adds an expectation; it may fire at once. Returns its id (for cancel).
    pub(crate) fn expect(
        &self,
        imm: u32,
        count: u64,
        action: ImmAction,
        fired: &mut Vec<Delivery>,
    ) -> u64 {
        let mut s = self.stripe(imm);
        let id = s.next_id;
        s.next_id += 1;
        let c = s.counters.entry(imm).or_default();
        c.waiting.push_back(Expectation { id, count, action });
        drain_met(c, fired);
        id
    }

    /// Removes a pending expectation; false if it already fired.
    pub(crate) fn cancel(&self, imm: u32, id: u64, fired: &mut Vec<Delivery>) -> bool {
        let mut s = self.stripe(imm);
        let Some(c) = s.counters.get_mut(&imm) else {
            return false;
        };
        let before = c.waiting.len();
        c.waiting.retain(|e| e.id != id);
        let removed = c.waiting.len() != before;
        // Removing a head expectation may let the next one fire.
        drain_met(c, fired);
        removed
    }

    /// Arrivals of `imm` not yet consumed by an expectation.
    pub(crate) fn value(&self, imm: u32) -> u64 {
        self.stripe(imm).counters.get(&imm).map_or(0, |c| c.arrived)
    }

    /// Consumes up to `count` arrivals without an expectation; returns how many.
    pub(crate) fn take(&self, imm: u32, count: u64) -> u64 {
        let mut s = self.stripe(imm);
        match s.counters.get_mut(&imm) {
            Some(c) if c.waiting.is_empty() => {
                let n = c.arrived.min(count);
                c.arrived -= n;
                n
            }
            _ => 0,
        }
    }
}

fn drain_met(c: &mut Counter, fired: &mut Vec<Delivery>) {
    while let Some(front) = c.waiting.front() {
        if front.count > c.arrived {
            break;
        }
        c.arrived -= front.count;
        if let Some(e) = c.waiting.pop_front() {
            fired.push(e.action.fire());
        }
    }
}
