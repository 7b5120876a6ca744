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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
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
///
/// A counter exists only while it holds arrivals or expectations: memory
/// follows what is pending, not every immediate a peer ever sent. Counters
/// that only hold unexpected arrivals (no expectation) are created by
/// peers at will, so at most `cap` of them are held: an arrival that would
/// create one more is dropped and counted (see [`ImmCounters::dropped`]).
pub(crate) struct ImmCounters {
    stripes: [Mutex<Stripe>; STRIPES],
    cap: usize,
    /// Per-account bounds, once [`ImmCounters::enable_accounts`] was called
    /// (checked without the lock on the fast path).
    accounting: std::sync::atomic::AtomicBool,
    accounts: Mutex<Accounts>,
    /// Counters with arrivals and no expectation (over every stripe).
    unexpected: AtomicUsize,
    /// Arrivals dropped because `cap` was reached.
    dropped: AtomicU64,
}

/// Unexpected immediates charged to accounts instead of one engine-wide
/// cap: an immediate's *partition* is `imm >> shift`; a partition belongs
/// to at most one account, and an account holds at most its cap of
/// distinct unexpected values over all its partitions. Arrivals in a
/// partition nobody owns are not kept (unless an expectation waits for
/// them). One peer filling its own partitions then cannot make another
/// account's arrivals be dropped.
#[derive(Default)]
struct Accounts {
    shift: u32,
    owner: HashMap<u32, u64>,
    accounts: HashMap<u64, Account>,
}

#[derive(Default, Clone, Copy)]
struct Account {
    cap: usize,
    held: usize,
}

impl Accounts {
    fn account_of(&mut self, imm: u32) -> Option<&mut Account> {
        let part = imm.checked_shr(self.shift).unwrap_or(0);
        let owner = *self.owner.get(&part)?;
        self.accounts.get_mut(&owner)
    }
}

#[derive(Default)]
struct Stripe {
    counters: HashMap<u32, Counter>,
    next_id: u64,
}

/// Whether a counter holds only arrivals nobody waits for (a peer's doing).
fn is_unexpected(c: &Counter) -> bool {
    c.waiting.is_empty() && c.arrived > 0
}

impl ImmCounters {
    #[cfg(test)]
    pub(crate) fn new() -> Arc<Self> {
        Self::with_cap(crate::engine::DEFAULT_MAX_UNEXPECTED_IMMS)
    }

    /// Counters holding at most `cap` distinct unexpected immediates.
    pub(crate) fn with_cap(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            stripes: std::array::from_fn(|_| Mutex::new(Stripe::default())),
            cap,
            accounting: std::sync::atomic::AtomicBool::new(false),
            accounts: Mutex::new(Accounts::default()),
            unexpected: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    fn stripe(&self, imm: u32) -> MutexGuard<'_, Stripe> {
        // Critical sections only update counters; poison cannot break them.
        self.stripes[(imm as usize) % STRIPES]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn accounts(&self) -> MutexGuard<'_, Accounts> {
        self.accounts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn accounting(&self) -> bool {
        self.accounting.load(AtomicOrdering::Acquire)
    }

    /// Charges unexpected immediates to accounts from now on (partition =
    /// `imm >> shift`) instead of the engine-wide cap.
    pub(crate) fn enable_accounts(&self, shift: u32) {
        self.accounts().shift = shift;
        self.accounting.store(true, AtomicOrdering::Release);
    }

    /// Creates account `id` or changes its cap.
    pub(crate) fn set_account(&self, id: u64, cap: usize) {
        self.accounts().accounts.entry(id).or_default().cap = cap;
    }

    /// Gives `partition` to account `id` (taking it from any other).
    pub(crate) fn assign_partition(&self, partition: u32, id: u64) {
        self.accounts().owner.insert(partition, id);
    }

    /// Distinct unexpected values account `id` holds.
    pub(crate) fn account_held(&self, id: u64) -> usize {
        self.accounts().accounts.get(&id).map_or(0, |a| a.held)
    }

    /// Takes `partition` from its account and discards the unexpected
    /// arrivals held in it (waited-for values stay); returns how many
    /// distinct values were discarded.
    pub(crate) fn release_partition(&self, partition: u32) -> usize {
        let (shift, owner) = {
            let mut a = self.accounts();
            (a.shift, a.owner.remove(&partition))
        };
        let mut discarded = 0usize;
        for stripe in &self.stripes {
            let mut s = stripe.lock().unwrap_or_else(PoisonError::into_inner);
            let before = s.counters.len();
            s.counters.retain(|imm, c| {
                !(imm.checked_shr(shift).unwrap_or(0) == partition && is_unexpected(c))
            });
            discarded += before - s.counters.len();
        }
        if discarded > 0 {
            self.unexpected.fetch_sub(discarded, AtomicOrdering::SeqCst);
            if let Some(id) = owner {
                if let Some(a) = self.accounts().accounts.get_mut(&id) {
                    a.held = a.held.saturating_sub(discarded);
                }
            }
        }
        discarded
    }

    /// Forgets account `id` (its partitions should be released first).
    pub(crate) fn remove_account(&self, id: u64) {
        let mut a = self.accounts();
        a.accounts.remove(&id);
        a.owner.retain(|_, o| *o != id);
    }

    /// After the counter of `imm` changed from a state whose
    /// unexpectedness was `was`: keeps the unexpected count right and
    /// removes the counter once it holds nothing.
    fn settle(&self, s: &mut Stripe, imm: u32, was: bool) {
        let Some(c) = s.counters.get(&imm) else {
            return;
        };
        match (was, is_unexpected(c)) {
            (true, false) => {
                self.unexpected.fetch_sub(1, AtomicOrdering::SeqCst);
                if self.accounting() {
                    if let Some(a) = self.accounts().account_of(imm) {
                        a.held = a.held.saturating_sub(1);
                    }
                }
            }
            // Only arrivals beyond a met expectation get here, so this may
            // pass the cap by what the expectations' owner let in.
            (false, true) => {
                self.unexpected.fetch_add(1, AtomicOrdering::SeqCst);
                if self.accounting() {
                    if let Some(a) = self.accounts().account_of(imm) {
                        a.held += 1;
                    }
                }
            }
            _ => {}
        }
        if c.arrived == 0 && c.waiting.is_empty() {
            s.counters.remove(&imm);
            // A burst of distinct immediates must not pin its table size.
            let len = s.counters.len();
            if s.counters.capacity() > 64 && len * 4 < s.counters.capacity() {
                s.counters.shrink_to(len * 2);
            }
        }
    }

    /// Records `n` arrivals of `imm`; returns the deliveries of expectations now met.
    pub(crate) fn arrive(&self, imm: u32, n: u64, fired: &mut Vec<Delivery>) {
        if n == 0 {
            return;
        }
        let mut s = self.stripe(imm);
        if let Some(c) = s.counters.get_mut(&imm) {
            let was = is_unexpected(c);
            c.arrived = c.arrived.saturating_add(n);
            drain_met(c, fired);
            self.settle(&mut s, imm, was);
            return;
        }
        // A new counter with no expectation: reserve a slot under its
        // account's cap, or the engine-wide one.
        let reserved = if self.accounting() {
            let mut accounts = self.accounts();
            match accounts.account_of(imm) {
                Some(a) if a.held < a.cap => {
                    a.held += 1;
                    self.unexpected.fetch_add(1, AtomicOrdering::SeqCst);
                    true
                }
                _ => false,
            }
        } else {
            self.unexpected
                .fetch_update(AtomicOrdering::SeqCst, AtomicOrdering::SeqCst, |u| {
                    (u < self.cap).then_some(u + 1)
                })
                .is_ok()
        };
        if !reserved {
            self.dropped.fetch_add(n, AtomicOrdering::Relaxed);
            return;
        }
        s.counters.insert(
            imm,
            Counter {
                arrived: n,
                waiting: VecDeque::new(),
            },
        );
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
        let was = is_unexpected(c);
        c.waiting.push_back(Expectation { id, count, action });
        drain_met(c, fired);
        self.settle(&mut s, imm, was);
        id
    }

    /// Removes a pending expectation; false if it already fired.
    pub(crate) fn cancel(&self, imm: u32, id: u64, fired: &mut Vec<Delivery>) -> bool {
        let mut s = self.stripe(imm);
        let Some(c) = s.counters.get_mut(&imm) else {
            return false;
        };
        let was = is_unexpected(c);
        let before = c.waiting.len();
        c.waiting.retain(|e| e.id != id);
        let removed = c.waiting.len() != before;
        // Removing a head expectation may let the next one fire.
        drain_met(c, fired);
        self.settle(&mut s, imm, was);
        removed
    }

    /// Counters held (every stripe).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .counters
                    .len()
            })
            .sum()
    }

    /// Arrivals dropped because the cap on unexpected immediates was reached.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(AtomicOrdering::Relaxed)
    }

    /// Arrivals of `imm` not yet consumed by an expectation.
    pub(crate) fn value(&self, imm: u32) -> u64 {
        self.stripe(imm).counters.get(&imm).map_or(0, |c| c.arrived)
    }

    /// Consumes up to `count` arrivals without an expectation; returns how many.
    pub(crate) fn take(&self, imm: u32, count: u64) -> u64 {
        let mut s = self.stripe(imm);
        let (was, taken) = match s.counters.get_mut(&imm) {
            Some(c) if c.waiting.is_empty() => {
                let was = is_unexpected(c);
                let n = c.arrived.min(count);
                c.arrived -= n;
                (was, n)
            }
            _ => return 0,
        };
        self.settle(&mut s, imm, was);
        taken
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

    fn run(fired: &mut Vec<Delivery>) {
        for d in fired.drain(..) {
            if let Delivery::Deferred(f) = d {
                f();
            }
        }
    }

    /// Issue 12: a counter left with no arrivals and no expectation is
    /// removed, whichever call emptied it.
    #[test]
    fn empty_counters_are_removed() {
        let counters = ImmCounters::new();
        let mut fired = Vec::new();
        // Arrival then take.
        counters.arrive(1, 2, &mut fired);
        assert_eq!(counters.take(1, 2), 2);
        // Expectation met by arrivals, before and after it was set.
        counters.add_expectation(2, 1, ImmAction::Callback(Box::new(|| {})), &mut fired);
        counters.arrive(2, 1, &mut fired);
        counters.arrive(3, 1, &mut fired);
        counters.add_expectation(3, 1, ImmAction::Callback(Box::new(|| {})), &mut fired);
        // Expectation withdrawn before anything arrived.
        let id = counters.add_expectation(4, 1, ImmAction::Callback(Box::new(|| {})), &mut fired);
        assert!(counters.cancel(4, id, &mut fired));
        run(&mut fired);
        for imm in 1..=4 {
            assert_eq!(counters.value(imm), 0);
        }
        assert_eq!(counters.held(), 0, "empty counters left behind");
    }

    /// Issue 12: a peer cannot make us hold more than `cap` distinct
    /// immediates nobody expects; beyond it arrivals are dropped and
    /// counted, expected immediates still count, and a freed slot is reused.
    #[test]
    fn unexpected_immediates_are_capped() {
        let counters = ImmCounters::with_cap(4);
        let mut fired = Vec::new();
        for imm in 0..10 {
            counters.arrive(imm, 1, &mut fired);
        }
        assert_eq!(counters.held(), 4);
        assert_eq!(counters.dropped(), 6);
        assert!((0..4).all(|i| counters.value(i) == 1));
        assert!((4..10).all(|i| counters.value(i) == 0));
        // More arrivals of a held immediate are not new memory: counted.
        counters.arrive(0, 5, &mut fired);
        assert_eq!(counters.value(0), 6);
        // An expected immediate is counted even at the cap.
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        counters.add_expectation(
            100,
            1,
            ImmAction::Callback(Box::new(move || {
                h.fetch_add(1, AtomicOrdering::SeqCst);
            })),
            &mut fired,
        );
        counters.arrive(100, 1, &mut fired);
        run(&mut fired);
        assert_eq!(hits.load(AtomicOrdering::SeqCst), 1);
        assert_eq!(counters.dropped(), 6);
        // Consuming a held immediate frees its slot for a new one.
        assert_eq!(counters.take(1, 1), 1);
        counters.arrive(7, 1, &mut fired);
        assert_eq!(counters.value(7), 1);
        assert_eq!(counters.dropped(), 6);
        assert_eq!(counters.held(), 4);
    }

    /// Issue 22: with accounts, one account filling its partitions does
    /// not drop another's arrivals; arrivals in partitions nobody owns are
    /// not kept; releasing a partition discards what it held.
    #[test]
    fn accounts_bound_each_owner_apart() {
        let counters = ImmCounters::with_cap(4);
        counters.enable_accounts(16);
        counters.set_account(1, 3);
        counters.set_account(2, 3);
        counters.assign_partition(7, 1);
        counters.assign_partition(8, 2);
        let mut fired = Vec::new();
        for seq in 0..100 {
            counters.arrive((7 << 16) | seq, 1, &mut fired);
        }
        assert_eq!(counters.account_held(1), 3);
        assert_eq!(counters.dropped(), 97);
        // The engine-wide cap (4) no longer applies: account 2 keeps its 3.
        for seq in 0..3 {
            counters.arrive((8 << 16) | seq, 1, &mut fired);
        }
        assert_eq!(counters.account_held(2), 3);
        assert!((0..3).all(|s| counters.value((8 << 16) | s) == 1));
        // Nobody owns partition 9.
        counters.arrive(9 << 16, 1, &mut fired);
        assert_eq!(counters.value(9 << 16), 0);
        // Taking a value frees its place in the account.
        assert_eq!(counters.take(7 << 16, 1), 1);
        assert_eq!(counters.account_held(1), 2);
        // An expected value counts whatever the account holds.
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        counters.add_expectation(
            (7 << 16) | 500,
            1,
            ImmAction::Callback(Box::new(move || {
                h.fetch_add(1, AtomicOrdering::SeqCst);
            })),
            &mut fired,
        );
        counters.arrive((7 << 16) | 500, 1, &mut fired);
        run(&mut fired);
        assert_eq!(hits.load(AtomicOrdering::SeqCst), 1);
        // Release: partition 7's held values go, account 2's stay.
        assert_eq!(counters.release_partition(7), 2);
        assert_eq!(counters.account_held(1), 0);
        assert_eq!(counters.value((7 << 16) | 1), 0);
        assert_eq!(counters.account_held(2), 3);
        counters.arrive((7 << 16) | 1, 1, &mut fired);
        assert_eq!(counters.value((7 << 16) | 1), 0, "released: not kept");
        counters.remove_account(2);
        assert_eq!(counters.release_partition(8), 3);
        assert_eq!(counters.held(), 0);
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
