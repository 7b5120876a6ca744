//! One server-wide budget for the bytes requests hold in memory outside the
//! buffer quota: payloads being read, data staged for a response or a peer.
//!
//! Without it every connection could hold a maximum-size message at once
//! (64 connections x 4 GiB). A request reserves what it needs before it
//! allocates; when the budget is taken it waits (bounded), and a request
//! larger than the whole budget is refused at once.

use std::collections::HashMap;
use std::net::IpAddr;
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
    /// The most the reservations of one client address may hold together.
    per_address: u64,
    used: Mutex<Used>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Used {
    total: u64,
    by_address: HashMap<IpAddr, u64>,
}

/// Bytes reserved from an [`InflightBudget`]; returned on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Option<Arc<InflightBudget>>,
    bytes: u64,
    who: Option<IpAddr>,
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
            used.total = used.total.saturating_sub(self.bytes);
            if let Some(ip) = self.who {
                if let Some(n) = used.by_address.get_mut(&ip) {
                    *n = n.saturating_sub(self.bytes);
                    if *n == 0 {
                        used.by_address.remove(&ip);
                    }
                }
            }
            b.freed.notify_all();
        }
    }
}

impl InflightBudget {
    /// A budget of `total` bytes, all of which one address may hold.
    pub fn new(total: u64) -> Arc<InflightBudget> {
        InflightBudget::with_share(total, total)
    }

    /// A budget of `total` bytes of which the reservations of one client
    /// address hold at most `per_address` together.
    pub fn with_share(total: u64, per_address: u64) -> Arc<InflightBudget> {
        Arc::new(InflightBudget {
            total,
            per_address: per_address.clamp(UNCOUNTED_BYTES + 1, total.max(UNCOUNTED_BYTES + 1)),
            used: Mutex::new(Used::default()),
            freed: Condvar::new(),
        })
    }

    /// The most one address may hold.
    pub fn per_address(&self) -> u64 {
        self.per_address
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// Bytes the reservations of `ip` hold now.
    pub fn used_by(&self, ip: IpAddr) -> u64 {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_address
            .get(&ip)
            .copied()
            .unwrap_or(0)
    }

    /// Reserves `bytes` for `call`, waiting up to `wait` for them to be free.
    pub fn reserve(
        self: &Arc<Self>,
        call: &'static str,
        bytes: u64,
        wait: Duration,
    ) -> Result<Reservation> {
        self.reserve_as(call, bytes, wait, None)
    }

    /// Reserves `bytes` for `call` on behalf of client address `who` (within
    /// its share), waiting up to `wait` for them to be free.
    pub fn reserve_as(
        self: &Arc<Self>,
        call: &'static str,
        bytes: u64,
        wait: Duration,
        who: Option<IpAddr>,
    ) -> Result<Reservation> {
        if bytes <= UNCOUNTED_BYTES {
            return Ok(Reservation {
                budget: None,
                bytes: 0,
                who: None,
            });
        }
        let most = if who.is_some() {
            self.per_address
        } else {
            self.total
        };
        if bytes > most {
            return Err(RpcError::refused(
                call,
                format!(
                    "{bytes} bytes exceed the in-flight budget of {most} bytes (--inflight-mib, \
                     --inflight-per-address-mib)"
                ),
            ));
        }
        let deadline = Instant::now() + wait;
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let mine = who
                .and_then(|ip| used.by_address.get(&ip).copied())
                .unwrap_or(0);
            if used.total.saturating_add(bytes) <= self.total
                && mine.saturating_add(bytes) <= self.per_address
            {
                used.total += bytes;
                if let Some(ip) = who {
                    *used.by_address.entry(ip).or_insert(0) += bytes;
                }
                return Ok(Reservation {
                    budget: Some(Arc::clone(self)),
                    bytes,
                    who,
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RpcError::refused(
                    call,
                    format!(
                        "{bytes} bytes: the in-flight budget stayed taken for {wait:?} ({} of {} \
                         bytes, {mine} of this address's {})",
                        used.total, self.total, self.per_address
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

    #[test]
    fn one_address_holds_at_most_its_share() -> Result<()> {
        let b = InflightBudget::with_share(4 << 20, 1 << 20);
        let (a, v) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let held = b.reserve_as("t", 1 << 20, Duration::ZERO, Some(a))?;
        assert!(
            b.reserve_as("t", 100 << 10, Duration::from_millis(20), Some(a))
                .is_err()
        );
        assert!(
            b.reserve_as("t", 2 << 20, Duration::ZERO, Some(v)).is_err(),
            "over any share"
        );
        let other = b.reserve_as("t", 1 << 20, Duration::ZERO, Some(v))?;
        assert_eq!(
            (b.used_by(a), b.used_by(v), b.used()),
            (1 << 20, 1 << 20, 2 << 20)
        );
        drop((held, other));
        assert_eq!((b.used_by(a), b.used()), (0, 0));
        Ok(())
    }
}
