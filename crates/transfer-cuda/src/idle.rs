//! The watcher thread's idle loop: transfer-core's [`IdleState`] (spin,
//! then park with doubling timeouts), plus parking without a timeout while
//! nothing at all is watched: an idle watcher costs nothing, unlike
//! fabric-lib's thread that spins forever.

use std::time::Instant;

use transfer_core::{IdlePolicy, IdleState};

pub(crate) struct IdleLoop {
    state: IdleState,
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
            state: IdleState::new(policy),
        }
    }

    /// Something happened: spin again from now on.
    pub(crate) fn active(&mut self) {
        self.state.active();
    }

    /// One round with nothing to report. With `nothing_watched`, parks until
    /// unparked (a new watch or shutdown always unparks the thread).
    pub(crate) fn idle(&mut self, nothing_watched: bool) -> Rest {
        if nothing_watched {
            self.active();
            std::thread::park();
            return Rest::Parked;
        }
        match self.state.idle_at(Instant::now(), true) {
            // A pure spin: the watcher reads host-mapped slots that GPU
            // kernels bump, with no thread on this machine to yield to.
            None => {
                std::hint::spin_loop();
                Rest::Spun
            }
            Some(sleep) => {
                std::thread::park_timeout(sleep.park);
                Rest::Parked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
    fn parks_once_the_window_is_over_and_activity_resets_the_timeout() {
        let mut l = IdleLoop::new(policy());
        for _ in 0..4 {
            assert_eq!(l.idle(false), Rest::Parked);
        }
        assert_eq!(l.state.next_park(), Duration::from_micros(8));
        l.active();
        assert_eq!(l.state.next_park(), Duration::from_micros(1));
    }

    #[test]
    fn nothing_watched_parks_until_unparked() {
        let mut l = IdleLoop::new(policy());
        // A pending unpark token makes park() return at once.
        std::thread::current().unpark();
        assert_eq!(l.idle(true), Rest::Parked);
    }
}
