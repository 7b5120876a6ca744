//! Assisted thread mode: with worker threads ([`crate::ProgressMode::Thread`])
//! a thread that waits on a transfer runs passes of the group itself when
//! the worker is not in one, instead of waiting for the worker thread to be
//! scheduled twice.
//!
//! Why: in thread mode a small transfer crosses threads twice (submit
//! queue -> worker, worker -> waiter), and each crossing is a wake-up the
//! scheduler may delay; caller-driven progress has none and measured half
//! the 8 B write time (README, "Against NIXL and Mooncake"). Assisting
//! keeps the worker (streaming, async users, arrivals nobody waits for)
//! and removes the crossings for the thread that waits:
//! - a submit whose submitter will wait does not wake a worker that
//!   stepped back (the wait takes the job in its first pass);
//! - a wait drives the group for up to a window ([`ENV_WINDOW`], default
//!   [`DEFAULT_WINDOW`]) before it blocks, while the worker steps back
//!   (sleeps) instead of spinning against it, and is woken when the waiter
//!   leaves with anything left for it (`Driving`'s drop). A long
//!   transfer therefore costs the waiter one window of polling, then it
//!   blocks as before.
//!
//! Waiting means [`crate::Pending::wait`] / `wait_timeout`,
//! [`crate::TransferEngine::wait_imm`] and
//! [`crate::TransferEngine::drive_while_waiting`] (transfer-py's waits);
//! futures and [`crate::DoneFlag`] pollers leave the NICs to the worker.
//!
//! The state is the worker's own (`Slot`); a thread takes it with
//! `try_lock` and never waits for it (the holder's pass does the work).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::callbacks::CallbackQueue;
use crate::error::{Result, TransferError};
use crate::job::Job;
use crate::progress::{Slot, in_pass, pass_if_free, try_slot};
use crate::worker::{Asleep, WorkerQueue};

/// Environment variable: how long a waiter drives its group before it
/// blocks, in microseconds; `0` turns assisting off (submits and waits
/// hand off to the worker only).
pub const ENV_WINDOW: &str = "TRANSFER_ASSIST_US";

/// A waiter's driving window when [`ENV_WINDOW`] is unset. Measured
/// (Python peers bench, 4 interleaved rounds of 3-repeat runs, medians;
/// off / 50 µs / 200 µs, transfers up to [`MAX_ASSISTED_BYTES`]): 8 B
/// write to completion shm 35.7 / 6.3 / 6.2 us, tcp 41.4 / 24.4 / 23.4 us;
/// echoed RTT shm 58.7 / 13.0 / 12.1 us, tcp 95 / 53 / 54 us; 256 x 16 KiB
/// paged until the receiver knows shm 1198 / 1222 / 1276 us, tcp 3255 /
/// 2150 / 3597 us. 50 µs covers a same-host round trip and burns little.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(50);

/// The largest transfer whose waiter drives the NICs: a longer one is the
/// worker's to stream. Waiters of 8 MiB batches that polled for the window
/// and then handed back cost 25-35 % of shm bandwidth (Python peers bench,
/// 64 KiB-16 MiB writes: 10.4 / 11.5 / 10.9 GB/s without assisting, 7.6 /
/// 7.2 / 6.1 with it, same minutes). Immediate waits (`wait_imm`) always
/// assist: their size is the sender's.
pub const MAX_ASSISTED_BYTES: u64 = 64 * 1024;

/// The most assisted transfers in flight on an engine at which a waiter
/// still drives the NICs. A thread that keeps a window of transfers in
/// flight and waits for the oldest (a stream) is the worker's to serve:
/// with every such wait driving, the worker stepped back and was woken
/// again once per transfer (`transfer-bench local --quick`, tcp, window
/// 16, 4 interleaved runs each: 64 KiB writes 2.2-2.5 GB/s before
/// assisting, 1.4-1.8 with it; 4 KiB 420-477 -> 279-459 MB/s), while a
/// latency-bound caller has one or two in flight. Counted per engine, not
/// per thread: several threads that each wait on one transfer count
/// together, and with more than this in flight they block as without
/// assisting (their waits then overlap, which the worker serves anyway).
pub const MAX_ASSISTED_IN_FLIGHT: usize = 2;

/// Whether a waiter of a transfer of `bytes` drives the NICs (the one
/// rule, for the engine's `Pending`s and for bindings that wait their own
/// way).
pub fn assists(bytes: u64) -> bool {
    bytes <= MAX_ASSISTED_BYTES
}

/// The window [`ENV_WINDOW`] asks for (`None`: assisting off).
pub fn window_from_env() -> Option<Duration> {
    match std::env::var(ENV_WINDOW) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(us) => Some(Duration::from_micros(us)),
            Err(_) => Some(DEFAULT_WINDOW),
        },
        Err(_) => Some(DEFAULT_WINDOW),
    }
}

/// One group: its state and its worker's queue.
struct Group {
    slot: Arc<Slot>,
    queue: Arc<WorkerQueue>,
}

/// The groups of one thread-mode engine, for threads that submit and wait.
pub(crate) struct Assist {
    groups: Vec<Group>,
    window: Duration,
    /// Transfers whose waiters may assist, submitted and not yet finished
    /// ([`Assist::track`]).
    in_flight: AtomicUsize,
}

/// Marks the groups as driven by a waiter; the last one out hands them
/// back to their workers (its drop).
struct Driving<'a> {
    groups: &'a [Group],
    /// The wait ended with its condition met (the waiter will not block).
    satisfied: bool,
}

impl<'a> Driving<'a> {
    fn enter(groups: &'a [Group]) -> Self {
        for g in groups {
            g.queue.assisting.fetch_add(1, Ordering::AcqRel);
        }
        Driving {
            groups,
            satisfied: false,
        }
    }
}

impl Drop for Driving<'_> {
    /// The last waiter out wakes the worker unless nothing is left for
    /// it: waking it after every satisfied wait made it spin against the
    /// next submit and wait (Python peers bench, tcp echoed RTT 94 -> 121
    /// us with the wake). Left for it, so woken:
    /// - the waiter leaves unsatisfied (it blocks now and relies on the
    ///   worker; shm moves incoming writes only while their target polls);
    /// - work is in flight;
    /// - the worker sleeps a long sleep (not the short nap it takes for a
    ///   waiter): it may have told peers it sleeps and our polls told them
    ///   it is awake (libfabric shm's doorbell), so no peer would ring it.
    ///   Without this wake an shm receiver's worker slept its full 100 ms
    ///   block while 256 pages waited for it (94 ms against 1.3 ms).
    fn drop(&mut self) {
        for g in self.groups {
            if g.queue.assisting.fetch_sub(1, Ordering::AcqRel) != 1 {
                continue;
            }
            let napping = matches!(g.queue.asleep(), Asleep::Stepped | Asleep::Awake);
            let quiet =
                || try_slot(&g.slot).is_some_and(|s| s.as_ref().is_none_or(|w| w.is_quiet()));
            if !(self.satisfied && napping && quiet()) {
                g.queue.wake();
            }
        }
    }
}

impl Assist {
    pub(crate) fn new(groups: Vec<(Arc<Slot>, Arc<WorkerQueue>)>, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            groups: groups
                .into_iter()
                .map(|(slot, queue)| Group { slot, queue })
                .collect(),
            window,
            in_flight: AtomicUsize::new(0),
        })
    }

    /// One more transfer whose waiter may assist is in flight.
    pub(crate) fn track(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A tracked transfer finished (or was dropped unfinished).
    pub(crate) fn untrack(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Whether waiters drive now: few enough transfers in flight
    /// ([`MAX_ASSISTED_IN_FLIGHT`]).
    pub(crate) fn driving_pays(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) <= MAX_ASSISTED_IN_FLIGHT
    }

    /// Hands `job` to group `group`'s worker, without waking it when it
    /// stepped back for a waiter and the submitter holds a `Pending` of
    /// the job (`waited`): the wait that follows drives the group and takes
    /// the job in its first pass; a `Pending` that is awaited instead waits
    /// at most the worker's nap ([`crate::worker`]'s 1 ms). Any other job
    /// wakes it as before.
    ///
    /// Waking it made it compete with the submitter's own wait for the 2
    /// cores (Python peers bench, 4 interleaved rounds, medians of
    /// 3-repeat runs): 8 B write to completion shm 16.8 -> 6.9 us, tcp 88
    /// -> 37 us; echoed RTT shm 29.6 -> 25.4, tcp 83 -> 57 us without the
    /// wake. Posting the job from the submitter as well bought nothing on
    /// libfabric (a write job only queues there until the next poll), and
    /// broke shm's doorbell bookkeeping (conformance
    /// `two_process_peer_killed_mid_stream` timed out): not done.
    pub(crate) fn push(
        &self,
        group: usize,
        job: Job,
        waited: bool,
        callbacks: &CallbackQueue,
    ) -> Result<()> {
        let Some(g) = self.groups.get(group) else {
            return Err(TransferError::invalid(
                "submit",
                format!("no domain group {group}"),
            ));
        };
        if waited && self.driving_pays() && !in_pass() && g.queue.asleep() == Asleep::Stepped {
            return match g.queue.try_push(job, callbacks)? {
                None => {
                    // The worker may have left its nap for a long sleep
                    // meanwhile: it stores its state before its last look
                    // at the queue (both SeqCst), so either it saw the job
                    // or this sees the new state.
                    if !matches!(g.queue.asleep(), Asleep::Stepped | Asleep::Awake) {
                        g.queue.wake();
                    }
                    Ok(())
                }
                Some(back) => g.queue.push(back, callbacks),
            };
        }
        g.queue.push(job, callbacks)
    }

    /// [`Assist::drive`] within `timeout`; returns the time left of it,
    /// for the blocking wait that follows.
    pub(crate) fn drive_within(&self, timeout: Duration, ready: impl Fn() -> bool) -> Duration {
        let started = Instant::now();
        self.drive(Some(timeout), ready);
        timeout.saturating_sub(started.elapsed())
    }

    /// Drives every group until `ready()` holds or the window (capped by
    /// `limit`) passes; returns whether `ready()` held. The caller blocks
    /// afterwards as it would without assisting.
    pub(crate) fn drive(&self, limit: Option<Duration>, ready: impl Fn() -> bool) -> bool {
        if ready() {
            return true;
        }
        // A pass inside a pass (a callback thread's submit is fine, but a
        // nested pass on this thread is not) waits instead; so does the
        // waiter of one of many transfers in flight (the worker streams
        // them).
        if in_pass() || !self.driving_pays() {
            return false;
        }
        let window = limit.map_or(self.window, |l| l.min(self.window));
        let end = Instant::now() + window;
        let mut driving = Driving::enter(&self.groups);
        let mut idle = 0u32;
        loop {
            let mut did = false;
            for g in &self.groups {
                did |= pass_if_free(&g.slot);
            }
            if ready() {
                driving.satisfied = true;
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            if did {
                idle = 0;
            } else {
                idle = idle.wrapping_add(1);
                // Nothing arrived yet: give the core away now and then, so
                // a peer process on the same core can answer (2 cores).
                if idle % 16 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::progress::InlineWorker;
    use crate::worker::{SleepPlan, run_shared};
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    /// Counts passes; none finds work.
    struct Counting(Arc<AtomicUsize>);

    impl InlineWorker for Counting {
        fn pass(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            false
        }
        fn is_quiet(&self) -> bool {
            true
        }
        fn may_sleep(&self) -> bool {
            true
        }
        fn prepare_sleep(&mut self) -> SleepPlan {
            SleepPlan::Park
        }
        fn shutdown(self: Box<Self>) {}
    }

    fn group(n: &Arc<AtomicUsize>) -> (Arc<Slot>, Arc<WorkerQueue>) {
        let slot: Arc<Slot> = Arc::new(Mutex::new(Some(Box::new(Counting(n.clone())))));
        (slot, WorkerQueue::new(4))
    }

    #[test]
    fn a_waiter_drives_the_group_itself_and_gives_it_back() {
        let n = Arc::new(AtomicUsize::new(0));
        let (slot, queue) = group(&n);
        let a = Assist::new(vec![(slot, queue.clone())], Duration::from_secs(5));
        // No worker thread at all: only the waiter's own passes move it.
        let m = n.clone();
        assert!(a.drive(None, || m.load(Ordering::SeqCst) >= 100));
        assert_eq!(queue.assisting.load(Ordering::SeqCst), 0);
        // The window (capped by the caller's limit) ends a wait that never settles.
        let t = Instant::now();
        assert!(!a.drive(Some(Duration::from_millis(5)), || false));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(queue.assisting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_waiter_of_one_of_many_transfers_in_flight_leaves_them_to_the_worker() {
        let n = Arc::new(AtomicUsize::new(0));
        let (slot, queue) = group(&n);
        let a = Assist::new(vec![(slot, queue.clone())], Duration::from_secs(5));
        for _ in 0..=MAX_ASSISTED_IN_FLIGHT {
            a.track();
        }
        // A stream's waiter: no pass, no step-back asked of the worker, and
        // it does not sit out the 5 s window.
        let t = Instant::now();
        assert!(!a.drive(None, || false));
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert_eq!(queue.assisting.load(Ordering::SeqCst), 0);
        // Down to a latency-bound caller's few: it drives again.
        a.untrack();
        let m = n.clone();
        assert!(a.drive(None, || m.load(Ordering::SeqCst) >= 10));
    }

    #[test]
    fn a_busy_slot_is_not_waited_for() {
        let n = Arc::new(AtomicUsize::new(0));
        let (slot, queue) = group(&n);
        let a = Assist::new(vec![(slot.clone(), queue)], Duration::from_millis(2));
        let held = slot.lock().unwrap();
        assert!(!a.drive(None, || false));
        drop(held);
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_worker_steps_back_while_a_waiter_drives() {
        let policy = crate::idle::IdlePolicy::busy_poll();
        let run = |assisted: bool| -> usize {
            let n = Arc::new(AtomicUsize::new(0));
            let (slot, queue) = group(&n);
            if assisted {
                queue.assisting.store(1, Ordering::SeqCst);
            }
            let q = queue.clone();
            let t = std::thread::spawn(move || run_shared(slot, q, policy));
            std::thread::sleep(Duration::from_millis(50));
            let passes = n.load(Ordering::SeqCst);
            queue.request_stop();
            t.join().unwrap();
            passes
        };
        // A busy-polling worker passes thousands of times in 50 ms; one
        // that steps back naps 1 ms between passes.
        let alone = run(false);
        let assisted = run(true);
        assert!(assisted <= 60, "assisted worker passed {assisted} times");
        assert!(
            alone > 10 * assisted.max(1),
            "alone {alone}, assisted {assisted}"
        );
    }
}
