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
    pub(crate) fn add_expectation(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Arrive,
        Expect(u64),
    }

    fn permutations(items: &[Ev]) -> Vec<Vec<Ev>> {
        if items.len() <= 1 {
            return vec![items.to_vec()];
        }
        let mut out = Vec::new();
        for i in 0..items.len() {
            let mut rest = items.to_vec();
            let x = rest.remove(i);
            for mut p in permutations(&rest) {
                p.insert(0, x);
                out.push(p);
            }
        }
        out
    }

    /// Every interleaving of arrivals and expectations ends in the same
    /// state: expectations fire in the order set, exactly when the
    /// arrivals cover them, and the surplus stays counted.
    #[test]
    fn every_arrival_order_gives_the_same_result() {
        let scenarios: [&[Ev]; 3] = [
            &[Ev::Arrive, Ev::Arrive, Ev::Arrive, Ev::Expect(3)],
            &[
                Ev::Arrive,
                Ev::Arrive,
                Ev::Arrive,
                Ev::Arrive,
                Ev::Expect(2),
                Ev::Expect(1),
            ],
            &[
                Ev::Arrive,
                Ev::Arrive,
                Ev::Arrive,
                Ev::Expect(2),
                Ev::Expect(2),
            ],
        ];
        for events in scenarios {
            let arrivals = events.iter().filter(|e| matches!(e, Ev::Arrive)).count() as u64;
            for order in permutations(events) {
                let counters = ImmCounters::new();
                let fired_order = Arc::new(Mutex::new(Vec::new()));
                let mut fired = Vec::new();
                let mut set = Vec::new();
                for ev in &order {
                    match ev {
                        Ev::Arrive => counters.arrive(9, 1, &mut fired),
                        Ev::Expect(n) => {
                            let idx = set.len();
                            set.push(*n);
                            let log = fired_order.clone();
                            counters.add_expectation(
                                9,
                                *n,
                                ImmAction::Callback(Box::new(move || {
                                    if let Ok(mut l) = log.lock() {
                                        l.push(idx)
                                    }
                                })),
                                &mut fired,
                            );
                        }
                    }
                }
                for d in fired.drain(..) {
                    if let Delivery::Deferred(f) = d {
                        f();
                    }
                }
                // Model: expectation i fires iff the arrivals cover it and all before it.
                let mut budget = arrivals;
                let mut want = Vec::new();
                for (i, n) in set.iter().enumerate() {
                    if *n > budget {
                        break;
                    }
                    budget -= n;
                    want.push(i);
                }
                assert_eq!(
                    *fired_order
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                    want,
                    "order {order:?}"
                );
                assert_eq!(counters.value(9), budget, "order {order:?}");
            }
        }
    }

    #[test]
    fn cancel_lets_the_next_expectation_fire() {
        let counters = ImmCounters::new();
        let hits = Arc::new(AtomicUsize::new(0));
        let mut fired = Vec::new();
        let id = counters.add_expectation(1, 5, ImmAction::Callback(Box::new(|| {})), &mut fired);
        let h = hits.clone();
        counters.add_expectation(
            1,
            2,
            ImmAction::Callback(Box::new(move || {
                h.fetch_add(1, AtomicOrdering::SeqCst);
            })),
            &mut fired,
        );
        counters.arrive(1, 2, &mut fired);
        assert!(fired.is_empty(), "the first expectation blocks the second");
        assert!(counters.cancel(1, id, &mut fired));
        for d in fired.drain(..) {
            if let Delivery::Deferred(f) = d {
                f();
            }
        }
        assert_eq!(hits.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(counters.value(1), 0);
        assert_eq!(counters.take(1, 1), 0);
    }
}
