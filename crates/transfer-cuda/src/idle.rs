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
