//! The watcher thread's idle loop: transfer-core's [`IdlePolicy`] (spin,
//! then park with doubling timeouts), plus parking without a timeout while
//! nothing at all is watched: an idle watcher costs nothing, unlike
//! fabric-lib's thread that spins forever.
//!
//! transfer-core keeps its own `IdleState` crate-private, so the few lines
//! of state machine are repeated here against the public policy type.

use std::time::{Duration, Instant};

use transfer_core::IdlePolicy;

pub(crate) struct IdleLoop {
    policy: IdlePolicy,
    idle_since: Option<Instant>,
    park: Duration,
}

/// What one idle round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rest {
    Spun,
    Parked,
}

impl IdleLoop {
    pub(crate) fn new(policy: IdlePolicy) -> Self {
        Self {
            policy,
            idle_since: None,
            park: policy.min_park,
        }
    }

    /// Something happened: spin again from now on.
    pub(crate) fn active(&mut self) {
        self.idle_since = None;
        self.park = self.policy.min_park;
    }

    /// One round with nothing to report. With `nothing_watched`, parks until
    /// unparked (a new watch or shutdown always unparks the thread).
    pub(crate) fn idle(&mut self, nothing_watched: bool) -> Rest {
        if nothing_watched {
            self.active();
            std::thread::park();
            return Rest::Parked;
        }
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < self.policy.spin {
            std::hint::spin_loop();
            return Rest::Spun;
        }
        std::thread::park_timeout(self.park);
        self.park = (self.park * 2)
            .min(self.policy.max_park)
            .max(self.policy.min_park);
        Rest::Parked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> IdlePolicy {
        IdlePolicy {
            spin: Duration::ZERO,
            min_park: Duration::from_micros(1),
            max_park: Duration::from_micros(8),
            ..IdlePolicy::default()
        }
    }

    #[test]
    fn spins_within_the_spin_window() {
        let mut l = IdleLoop::new(IdlePolicy::busy_poll());
        for _ in 0..1000 {
            assert_eq!(l.idle(false), Rest::Spun);
        }
    }

    #[test]
    fn park_timeouts_double_up_to_the_cap_and_reset_on_activity() {
        let mut l = IdleLoop::new(policy());
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(l.park);
            assert_eq!(l.idle(false), Rest::Parked);
        }
        let us: Vec<u64> = seen.iter().map(|d| d.as_micros() as u64).collect();
        assert_eq!(us, [1, 2, 4, 8, 8, 8]);
        l.active();
        assert_eq!(l.park, Duration::from_micros(1));
    }

    #[test]
    fn nothing_watched_parks_until_unparked() {
        let mut l = IdleLoop::new(policy());
        // A pending unpark token makes park() return at once.
        std::thread::current().unpark();
        assert_eq!(l.idle(true), Rest::Parked);
    }
}
