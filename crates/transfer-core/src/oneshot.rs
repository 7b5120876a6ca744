//! A one-shot slot: one thread fills it, another blocks on it or awaits it.
//!
//! Used for submit completions ([`crate::Pending`]), control replies and
//! immediate-counter waits. Works with any executor: the `Future` impl only
//! stores the task's `Waker`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The value was taken, or the sender was dropped without sending.
    taken: bool,
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    ready: Condvar,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        // A panic while holding this lock cannot leave the slot inconsistent
        // (every critical section is a plain field update), so poison is ignored.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sending half. Dropping it unsent closes the channel: the receiver
/// then gets `None` instead of waiting forever.
pub(crate) struct Sender<T>(Option<Arc<Shared<T>>>);

/// The receiving half: block with [`Receiver::wait`], or `.await` it.
pub struct Receiver<T>(Arc<Shared<T>>);

/// Creates a connected sender / receiver pair.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            value: None,
            waker: None,
            taken: false,
        }),
        ready: Condvar::new(),
    });
    (Sender(Some(shared.clone())), Receiver(shared))
}

impl<T> Sender<T> {
    /// Fills the slot and wakes the receiver.
    pub(crate) fn send(mut self, value: T) {
        if let Some(shared) = self.0.take() {
            finish(&shared, Some(value));
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            finish(&shared, None);
        }
    }
}

fn finish<T>(shared: &Shared<T>, value: Option<T>) {
    let waker = {
        let mut slot = shared.lock();
        match value {
            Some(v) => slot.value = Some(v),
            None => slot.taken = true,
        }
        slot.waker.take()
    };
    shared.ready.notify_all();
    if let Some(w) = waker {
        w.wake();
    }
}

impl<T> Receiver<T> {
    /// Whether the value has arrived (and was not taken yet).
    pub fn is_ready(&self) -> bool {
        self.0.lock().value.is_some()
    }

    /// Whether waiting is over: the value arrived, or it never will (the
    /// sender was dropped, e.g. by an engine shutting down).
    pub(crate) fn is_settled(&self) -> bool {
        let slot = self.0.lock();
        slot.value.is_some() || slot.taken
    }

    /// Blocks until the value arrives. Returns `None` only if it was already
    /// taken (by `try_take` or a poll).
    pub fn wait(self) -> Option<T> {
        let mut slot = self.0.lock();
        loop {
            if let Some(v) = slot.value.take() {
                return Some(v);
            }
            if slot.taken {
                return None;
            }
            slot = self
                .0
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Blocks up to `timeout`; `Err(self)` gives the receiver back on timeout.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T, Self> {
        let deadline = Instant::now() + timeout;
        {
            let mut slot = self.0.lock();
            loop {
                if let Some(v) = slot.value.take() {
                    return Ok(v);
                }
                let now = Instant::now();
                if now >= deadline || slot.taken {
                    break;
                }
                slot = self
                    .0
                    .ready
                    .wait_timeout(slot, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        }
        Err(self)
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.0.lock();
        if let Some(v) = slot.value.take() {
            slot.taken = true;
            return Poll::Ready(Some(v));
        }
        if slot.taken {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
