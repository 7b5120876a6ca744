//! A counting semaphore bounding the number of connection threads.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Bounds concurrent sessions; [`Slot`]s release on drop.
#[derive(Debug)]
pub struct Limiter {
    state: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

/// One acquired session slot.
#[derive(Debug)]
pub struct Slot(Arc<Limiter>);

impl Limiter {
    /// At most `max` (at least 1) concurrent slots.
    pub fn new(max: usize) -> Arc<Limiter> {
        Arc::new(Limiter {
            state: Mutex::new(0),
            freed: Condvar::new(),
            max: max.max(1),
        })
    }

    /// Blocks until a slot is free, or returns `None` once `stop()` is true
    /// (checked whenever a slot is freed or every 100 ms).
    pub fn acquire(self: &Arc<Self>, stop: &dyn Fn() -> bool) -> Option<Slot> {
        let mut n = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if stop() {
                return None;
            }
            if *n < self.max {
                *n += 1;
                return Some(Slot(Arc::clone(self)));
            }
            n = self
                .freed
                .wait_timeout(n, std::time::Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Slots in use.
    pub fn in_use(&self) -> usize {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut n = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(1);
        self.0.freed.notify_one();
    }
}
