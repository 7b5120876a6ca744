//! A one-shot slot: one thread fills it, another blocks on it or awaits it.
//!
//! Used for submit completions ([`crate::Pending`]), control replies and
//! immediate-counter waits. Works with any executor: the `Future` impl only
//! stores the task's `Waker`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::spin_wait;

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The value was taken, or the sender was dropped without sending.
    taken: bool,
    /// Threads blocked on `ready`: without any, `finish` skips the
    /// condition variable (std's `notify_all` is a futex call even then,
    /// one per completion on the worker that only a future polls).
    sleepers: u32,
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    ready: Condvar,
    /// Set once the sender finished (sent or dropped): what a spinning
    /// waiter polls without taking the lock.
    settled: AtomicBool,
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
            sleepers: 0,
        }),
        ready: Condvar::new(),
        settled: AtomicBool::new(false),
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
    let (waker, sleepers) = {
        let mut slot = shared.lock();
        match value {
            Some(v) => slot.value = Some(v),
            None => slot.taken = true,
        }
        shared.settled.store(true, Ordering::Release);
        (slot.waker.take(), slot.sleepers)
    };
    // A sleeper counts itself under the lock before it blocks, so one that
    // is about to block saw the value under that lock already.
    if sleepers > 0 {
        shared.ready.notify_all();
    }
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

    /// Whether the sender finished, without taking the lock.
    fn settled_now(&self) -> bool {
        self.0.settled.load(Ordering::Acquire)
    }

    /// Blocks until the value arrives (after a short spin, see
    /// [`crate::spin_wait`]). Returns `None` only if it was already taken
    /// (by `try_take` or a poll).
    pub fn wait(self) -> Option<T> {
        spin_wait::spin_until(spin_wait::window(), || self.settled_now());
        let mut slot = self.0.lock();
        loop {
            if let Some(v) = slot.value.take() {
                return Some(v);
            }
            if slot.taken {
                return None;
            }
            slot.sleepers += 1;
            slot = self
                .0
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
            slot.sleepers -= 1;
        }
    }

    /// Blocks up to `timeout` (spinning first as [`Receiver::wait`] does,
    /// within `timeout`); `Err(self)` gives the receiver back on timeout.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T, Self> {
        let deadline = Instant::now() + timeout;
        spin_wait::spin_until(spin_wait::window().min(timeout), || self.settled_now());
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
                slot.sleepers += 1;
                slot = self
                    .0
                    .ready
                    .wait_timeout(slot, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
                slot.sleepers -= 1;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_past_the_spin_window_is_woken() {
        // The sender finishes well after the waiter's spin: the waiter has
        // blocked, counted as a sleeper, and must be notified.
        let (tx, rx) = channel::<u32>();
        let t = std::thread::spawn(move || {
            std::thread::sleep(spin_wait::window() + Duration::from_millis(20));
            tx.send(7);
        });
        assert_eq!(rx.wait(), Some(7));
        t.join().unwrap();
        let (tx, rx) = channel::<u32>();
        let t = std::thread::spawn(move || {
            std::thread::sleep(spin_wait::window() + Duration::from_millis(20));
            drop(tx);
        });
        assert!(rx.wait_timeout(Duration::from_secs(30)).is_err());
        t.join().unwrap();
    }

    #[test]
    fn a_value_sent_first_is_taken_without_blocking() {
        let (tx, rx) = channel::<u32>();
        tx.send(3);
        assert_eq!(rx.wait_timeout(Duration::ZERO).ok(), Some(3));
        let (_tx, rx) = channel::<u32>();
        assert!(rx.wait_timeout(Duration::from_millis(1)).is_err());
    }
}
