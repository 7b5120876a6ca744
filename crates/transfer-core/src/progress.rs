//! Who drives the NICs: a worker thread per domain group (the default), or
//! the threads that call the engine (caller-driven progress, like UCX's
//! `ucp_worker_progress` or libfabric's `FI_PROGRESS_MANUAL`).
//!
//! Why a second mode: with worker threads every small operation crosses
//! threads twice (API thread -> worker to post, worker -> waiter to
//! complete). On the 2-core bench machine four spinning threads (two per
//! process) shared two cores and the zero-byte immediate ping-pong took
//! ~2x `fi_pingpong`'s round trip. With caller progress the thread that
//! submits also posts and the thread that waits also polls: one thread per
//! process, as in `fi_pingpong` (figures in the README's bench section).
//!
//! Ownership, not locking, is the model: a group's state is owned by
//! whichever caller currently holds its slot (`try_lock`: a caller that
//! finds the slot taken does not wait, the holder's pass will do the work).
//! Uncontended, taking the slot is one atomic swap per pass.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use crate::callbacks::CallbackQueue;
use crate::error::{Result, TransferError};
use crate::oneshot;

/// How an engine's domain groups make progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// One worker thread per domain group polls its NICs, fed by lock-free
    /// queues; completions and immediates move without any help from the
    /// caller. Callbacks run on the engine's callback thread.
    #[default]
    Thread,
    /// No worker threads: the NICs move only while a caller is inside the
    /// engine — [`crate::TransferEngine::progress`], a submit (which posts at
    /// once), or a wait ([`crate::Pending::wait`], `wait_imm`, registration).
    /// Callbacks and receive-pool callbacks run inside `progress` on the
    /// calling thread; a receive callback may submit but must not block on
    /// the engine (such a wait fails at once instead of hanging). A
    /// [`crate::DoneFlag`] poller must call `progress` in its loop. Lowest
    /// latency, no idle cost; the user owns the polling.
    Caller,
}

impl std::fmt::Display for ProgressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProgressMode::Thread => "worker threads",
            ProgressMode::Caller => "caller-driven",
        })
    }
}

/// A domain group's worker state, driven one pass at a time by callers.
pub(crate) trait InlineWorker: Send {
    /// Takes queued jobs, polls the NICs, handles their events. Returns
    /// whether anything happened.
    fn pass(&mut self) -> bool;
    /// Whether nothing is queued or in flight in the group.
    fn is_quiet(&self) -> bool;
    /// Whether the group may sleep now (nothing in flight that only polling moves).
    fn may_sleep(&self) -> bool;
    /// What an idle worker thread may block on (assisted thread mode).
    fn prepare_sleep(&mut self) -> crate::worker::SleepPlan;
    /// Closes the NICs and fails what is still queued or in flight.
    fn shutdown(self: Box<Self>);
}

thread_local! {
    /// Set while this thread runs a pass: a receive callback inside it
    /// that blocked on the engine would wait for the very pass it runs in.
    static IN_PASS: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside a pass; restores the previous mark on drop
/// (a receive callback's submit may run a nested pass of another group).
struct PassGuard(bool);

impl PassGuard {
    fn enter() -> Self {
        PassGuard(IN_PASS.with(|c| c.replace(true)))
    }
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        IN_PASS.with(|c| c.set(self.0));
    }
}

/// A group's worker state, owned by whichever thread is in a pass on it.
pub(crate) type Slot = Mutex<Option<Box<dyn InlineWorker>>>;

/// The slot, unless another thread is in a pass on it.
pub(crate) fn try_slot(slot: &Slot) -> Option<MutexGuard<'_, Option<Box<dyn InlineWorker>>>> {
    match slot.try_lock() {
        Ok(g) => Some(g),
        // A panic in a user receive callback is caught inside the pass; a
        // poisoned slot still holds consistent state.
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// One pass of the group in `slot` unless another caller is in one (then
/// that caller does the work). Returns whether anything happened.
pub(crate) fn pass_if_free(slot: &Slot) -> bool {
    let Some(mut guard) = try_slot(slot) else {
        return false;
    };
    let Some(w) = guard.as_mut() else {
        return false;
    };
    let _pass = PassGuard::enter();
    w.pass()
}

/// Every group of one caller-driven engine, shared by the engine and its
/// pending operations (so that waiting on them drives the NICs).
pub(crate) struct CallerProgress {
    slots: Vec<Slot>,
    callbacks: Arc<CallbackQueue>,
}

impl CallerProgress {
    pub(crate) fn new(
        workers: Vec<Box<dyn InlineWorker>>,
        callbacks: Arc<CallbackQueue>,
    ) -> Arc<Self> {
        Arc::new(Self {
            slots: workers.into_iter().map(|w| Mutex::new(Some(w))).collect(),
            callbacks,
        })
    }

    /// One pass over every group nobody else is driving, then the
    /// callbacks that pass produced (outside the slots, so they may submit
    /// and wait). Returns whether anything happened.
    pub(crate) fn progress(&self) -> bool {
        let mut did = false;
        for slot in &self.slots {
            did |= pass_if_free(slot);
        }
        if !IN_PASS.with(Cell::get) {
            did |= self.callbacks.run_pending();
        }
        did
    }

    /// One pass of group `group` only, no callbacks: a submit posts its
    /// job at once this way (user callbacks never run inside a submit).
    pub(crate) fn post(&self, group: usize) {
        if let Some(slot) = self.slots.get(group) {
            pass_if_free(slot);
        }
    }

    /// Drives progress until `ready()` holds or `timeout` passes.
    pub(crate) fn wait_until(
        &self,
        call: &'static str,
        timeout: Option<Duration>,
        ready: impl Fn() -> bool,
    ) -> Result<()> {
        if ready() {
            return Ok(());
        }
        if IN_PASS.with(Cell::get) {
            return Err(TransferError::invalid(
                call,
                "a blocking wait inside a receive callback of a caller-driven engine \
                 would wait for the pass it runs in; submit with a callback or flag instead",
            ));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle_rounds = 0u32;
        loop {
            if self.progress() {
                idle_rounds = 0;
            } else {
                idle_rounds = idle_rounds.saturating_add(1);
                // Another thread holds the slot or nothing arrived yet:
                // give the core away now and then (2-core machines).
                if idle_rounds % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            if ready() {
                return Ok(());
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(TransferError::Timeout {
                        call,
                        millis: timeout.map_or(0, |t| t.as_millis().try_into().unwrap_or(u64::MAX)),
                    });
                }
            }
        }
    }

    /// Closes every group (waiting for a pass in flight on another thread
    /// to end), then runs the callbacks their failures produced.
    pub(crate) fn shutdown(&self) {
        for slot in &self.slots {
            let taken = match slot.lock() {
                Ok(mut g) => g.take(),
                Err(p) => p.into_inner().take(),
            };
            if let Some(w) = taken {
                w.shutdown();
            }
        }
        self.callbacks.run_pending();
    }
}

/// A handle that drives a caller-driven engine from any thread (an event
/// loop, a dedicated polling thread) without holding the engine itself.
/// Get one from [`crate::TransferEngine::progress_handle`].
#[derive(Clone)]
pub struct ProgressHandle(pub(crate) Arc<CallerProgress>);

impl ProgressHandle {
    /// As [`crate::TransferEngine::progress`].
    pub fn progress(&self) -> bool {
        self.0.progress()
    }

    /// Whether the engine was dropped (nothing left to drive).
    pub fn is_closed(&self) -> bool {
        // A slot someone is in a pass on is open.
        self.0
            .slots
            .iter()
            .all(|s| try_slot(s).is_some_and(|g| g.is_none()))
    }
}

impl std::fmt::Debug for ProgressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressHandle")
            .field("groups", &self.0.slots.len())
            .finish()
    }
}

/// How long a waiter may still block on `rx` after driving `caller` (when
/// set) up to `timeout`: all of `timeout` without a caller; zero with one
/// (settled, or the time is up: the waiter's own zero wait tells which).
/// A refusal other than the timeout (a wait inside a receive callback) is
/// returned.
pub(crate) fn drive_for<T>(
    caller: Option<&CallerProgress>,
    call: &'static str,
    timeout: Duration,
    rx: &oneshot::Receiver<T>,
) -> Result<Duration> {
    let Some(c) = caller else {
        return Ok(timeout);
    };
    match c.wait_until(call, Some(timeout), || rx.is_settled()) {
        Ok(()) | Err(TransferError::Timeout { .. }) => Ok(Duration::ZERO),
        Err(e) => Err(e),
    }
}

/// Polls `rx` as a future, driving `caller` first when set. Nothing wakes
/// a caller-driven engine but its callers, so such a future that is not
/// ready asks to be polled again (a busy-polling future, as in UCX's model).
pub(crate) fn poll_driving<T>(
    caller: Option<&CallerProgress>,
    rx: std::pin::Pin<&mut oneshot::Receiver<T>>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Option<T>> {
    if let Some(c) = caller {
        c.progress();
    }
    let polled = std::future::Future::poll(rx, cx);
    if polled.is_pending() && caller.is_some() {
        cx.waker().wake_by_ref();
    }
    polled
}

/// Whether this thread is inside a pass (a receive callback).
pub(crate) fn in_pass() -> bool {
    IN_PASS.with(Cell::get)
}

/// Runs a user receive callback inside a pass; a panic is reported by the
/// default hook and must not unwind through the NIC state.
pub(crate) fn run_user_callback(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting(Arc<AtomicUsize>);

    impl InlineWorker for Counting {
        fn pass(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) % 2 == 0
        }
        fn is_quiet(&self) -> bool {
            true
        }
        fn may_sleep(&self) -> bool {
            true
        }
        fn prepare_sleep(&mut self) -> crate::worker::SleepPlan {
            crate::worker::SleepPlan::Park
        }
        fn shutdown(self: Box<Self>) {
            self.0.store(usize::MAX, Ordering::SeqCst);
        }
    }

    #[test]
    fn waits_drive_passes_and_time_out() {
        let n = Arc::new(AtomicUsize::new(0));
        let p = CallerProgress::new(vec![Box::new(Counting(n.clone()))], CallbackQueue::inline());
        let m = n.clone();
        p.wait_until("t", Some(Duration::from_secs(5)), || {
            m.load(Ordering::SeqCst) >= 10
        })
        .unwrap();
        assert!(n.load(Ordering::SeqCst) >= 10);
        let err = p
            .wait_until("t", Some(Duration::from_millis(5)), || false)
            .unwrap_err();
        assert!(matches!(err, TransferError::Timeout { call: "t", .. }));
        p.shutdown();
        assert_eq!(n.load(Ordering::SeqCst), usize::MAX);
        // After shutdown a pass finds nothing to drive.
        assert!(!p.progress());
    }

    #[test]
    fn a_wait_inside_a_pass_fails_instead_of_hanging() {
        let _g = PassGuard::enter();
        let p = CallerProgress::new(Vec::new(), CallbackQueue::inline());
        let err = p.wait_until("inner", None, || false).unwrap_err();
        assert!(err.to_string().contains("receive callback"), "{err}");
    }
}
