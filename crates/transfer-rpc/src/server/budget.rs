//! One server-wide budget for the bytes requests hold in memory outside the
//! buffer quota: payloads being read, data staged for a response or a peer.
//!
//! Without it every connection could hold a maximum-size message at once
//! (64 connections x 4 GiB). A request reserves what it needs before it
//! allocates; when the budget is taken it waits (bounded), and a request
//! larger than the whole budget is refused at once.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Result, RpcError};

/// Requests of at most this many bytes take nothing from the budget: they
/// are bounded per connection by the command's fixed layout, and skipping
/// the lock keeps small commands off a shared cache line.
pub const UNCOUNTED_BYTES: u64 = 64 << 10;

/// The budget.
#[derive(Debug)]
pub struct InflightBudget {
    total: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

/// Bytes reserved from an [`InflightBudget`]; returned on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Option<Arc<InflightBudget>>,
    bytes: u64,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(b) = self.budget.take() {
            let mut used = b.used.lock().unwrap_or_else(PoisonError::into_inner);
            *used = used.saturating_sub(self.bytes);
            b.freed.notify_all();
        }
    }
}

impl InflightBudget {
    /// A budget of `total` bytes.
    pub fn new(total: u64) -> Arc<InflightBudget> {
        Arc::new(InflightBudget {
            total,
            used: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `bytes` for `call`, waiting up to `wait` for them to be free.
    pub fn reserve(
        self: &Arc<Self>,
        call: &'static str,
        bytes: u64,
        wait: Duration,
    ) -> Result<Reservation> {
        if bytes <= UNCOUNTED_BYTES {
            return Ok(Reservation {
                budget: None,
                bytes: 0,
            });
        }
        if bytes > self.total {
            return Err(RpcError::refused(
                call,
                format!(
                    "{bytes} bytes exceed the server's in-flight budget of {} bytes",
                    self.total
                ),
            ));
        }
        let deadline = Instant::now() + wait;
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if used.saturating_add(bytes) <= self.total {
                *used += bytes;
                return Ok(Reservation {
                    budget: Some(Arc::clone(self)),
                    bytes,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RpcError::refused(
                    call,
                    format!(
                        "{bytes} bytes: the in-flight budget stayed taken for {wait:?} ({} of {} bytes)",
                        *used, self.total
                    ),
                ));
            }
            used = self
                .freed
                .wait_timeout(used, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_waits_and_refuses() -> Result<()> {
        let b = InflightBudget::new(1 << 20);
        let small = b.reserve("t", 100, Duration::ZERO)?;
        assert_eq!((small.bytes(), b.used()), (0, 0));
        assert!(
            b.reserve("t", (1 << 20) + 1, Duration::from_secs(5))
                .is_err()
        );
        let big = b.reserve("t", 700 << 10, Duration::ZERO)?;
        assert!(
            b.reserve("t", 400 << 10, Duration::from_millis(20))
                .is_err()
        );
        let b2 = Arc::clone(&b);
        let waiter =
            std::thread::spawn(move || b2.reserve("t", 400 << 10, Duration::from_secs(10)).is_ok());
        std::thread::sleep(Duration::from_millis(50));
        drop(big);
        assert!(waiter.join().unwrap_or(false));
        assert_eq!(b.used(), 0);
        Ok(())
    }
}
