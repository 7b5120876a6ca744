//! How completions reach Python without running Python on engine threads.
//!
//! A [`Signal`] is the [`std::task::Waker`] every engine future of a
//! `Transfer` is polled with: an engine thread completing the future only
//! bumps a generation counter, notifies a condition variable (blocking
//! waiters, GIL released) and pushes tokens to [`LoopWaker`]s, each an
//! eventfd that an asyncio loop watches with `loop.add_reader`. The loop
//! thread then resolves its asyncio futures (see `transfer/_aio.py`). No
//! Python callback ever runs on an engine thread, and no engine thread ever
//! takes the GIL.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Wake;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use transfer_core::spin_wait;

/// Locks, ignoring poisoning: the guarded state stays consistent (plain
/// pushes and counters), and a panic elsewhere must not turn into a second one.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct SignalState {
    notifiers: Vec<(Arc<LoopWakerInner>, u64)>,
    /// Threads blocked on `cv`: without any, `notify` skips it (std's
    /// `notify_all` is a futex call even with nobody waiting, on the
    /// engine's worker, once per completion).
    sleepers: u32,
}

/// A wake-up source: a generation counter, a condition variable and the
/// asyncio loops waiting on it.
#[derive(Default)]
pub(crate) struct Signal {
    state: Mutex<SignalState>,
    cv: Condvar,
    /// Bumped under `state`'s lock by every notify; read without it, so
    /// that a spinning waiter never contends with the notifier's lock.
    generation: AtomicU64,
}

impl Signal {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The current generation; read it before checking the condition.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Blocks until the generation differs from `seen` or `until` passes;
    /// returns whether it changed. Polls first for up to `spin` (the first
    /// slice of a wait passes [`transfer_core::spin_wait::window`], off by
    /// default: a completion within it needs no wake-up; later slices
    /// block at once, so a long wait spins once).
    pub(crate) fn wait_past(&self, seen: u64, until: Instant, spin: Duration) -> bool {
        let left = until.saturating_duration_since(Instant::now());
        if spin_wait::spin_until(spin.min(left), || self.generation() != seen) {
            return true;
        }
        let mut s = lock(&self.state);
        loop {
            // The notifier bumps the generation under this lock, so it
            // cannot change between this check and the wait below.
            if self.generation() != seen {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            s.sleepers += 1;
            s = self
                .cv
                .wait_timeout(s, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            s.sleepers -= 1;
        }
    }

    /// Pushes `token` to `waker` at the next [`Signal::notify`]. The caller
    /// checks its condition after this (a notify in between pushes it).
    pub(crate) fn add_notifier(&self, waker: Arc<LoopWakerInner>, token: u64) {
        lock(&self.state).notifiers.push((waker, token));
    }

    /// Withdraws what [`Signal::add_notifier`] registered (an asyncio waiter
    /// that was cancelled): without it every cancelled `recv_async` left
    /// its entry until the next message, and a loop of timed-out receives
    /// on a quiet engine grew the list without bound.
    pub(crate) fn remove_notifier(&self, waker: &Arc<LoopWakerInner>, token: u64) {
        lock(&self.state)
            .notifiers
            .retain(|(w, t)| !(Arc::ptr_eq(w, waker) && *t == token));
    }

    /// asyncio waiters registered now.
    pub(crate) fn notifiers(&self) -> usize {
        lock(&self.state).notifiers.len()
    }

    /// Wakes every waiter: blocking ones and asyncio loops.
    pub(crate) fn notify(&self) {
        let (notifiers, sleepers) = {
            let mut s = lock(&self.state);
            self.generation.fetch_add(1, Ordering::AcqRel);
            (std::mem::take(&mut s.notifiers), s.sleepers)
        };
        if sleepers > 0 {
            self.cv.notify_all();
        }
        for (waker, token) in notifiers {
            waker.push(token);
        }
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.notify();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notify();
    }
}

/// The shared half of a [`LoopWaker`].
pub(crate) struct LoopWakerInner {
    fd: OwnedFd,
    ready: Mutex<Vec<u64>>,
}

impl LoopWakerInner {
    /// Queues `token` and makes the eventfd readable.
    pub(crate) fn push(&self, token: u64) {
        lock(&self.ready).push(token);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd this struct
        // owns. A failure (counter overflow: EAGAIN) leaves it readable anyway.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                std::ptr::from_ref(&one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// An eventfd that an asyncio loop watches (`loop.add_reader`) and the
/// tokens of the completions it announced. Internal: used by `transfer._aio`.
#[pyclass(frozen, module = "transfer._native", name = "_LoopWaker")]
pub struct LoopWaker {
    pub(crate) inner: Arc<LoopWakerInner>,
}

#[pymethods]
impl LoopWaker {
    #[new]
    fn new() -> PyResult<Self> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            inner: Arc::new(LoopWakerInner {
                fd,
                ready: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The eventfd to watch for readability.
    fn fileno(&self) -> i32 {
        self.inner.fd.as_raw_fd()
    }

    /// Clears the eventfd and returns the tokens announced since the last call.
    fn drain(&self) -> Vec<u64> {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from an eventfd this
        // struct owns; non-blocking, so EAGAIN (nothing pending) is harmless.
        let _ = unsafe {
            libc::read(
                self.inner.fd.as_raw_fd(),
                std::ptr::from_mut(&mut count).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        std::mem::take(&mut *lock(&self.inner.ready))
    }
}
