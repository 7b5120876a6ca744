//! The workers' idle policy: spin briefly, then park with growing timeouts.
//!
//! Spinning keeps latency low while traffic flows; parking makes an idle
//! engine cost next to nothing (fabric-lib spins forever: about two cores
//! per GPU). A parked worker still polls its NICs every `max_park` for
//! arrivals nobody announced (immediates, messages); a submit wakes it at once.

use std::time::{Duration, Instant};

/// How a worker waits when it has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePolicy {
    /// Keep polling this long after the last activity before parking.
    pub spin: Duration,
    /// First park timeout; doubles on each idle round.
    pub min_park: Duration,
    /// Longest park: bounds the latency of unannounced arrivals after idle
    /// on backends without a wait descriptor.
    pub max_park: Duration,
    /// Longest block on the NICs' wait descriptors (backends that have
    /// them): arrivals and submits wake the worker at once, so this is only
    /// a safety net.
    pub max_block: Duration,
}

impl Default for IdlePolicy {
    /// 200 µs of spinning covers a loopback tcp round trip (~30-60 µs
    /// measured with `fi_pingpong -p tcp`), so ping-pong traffic never parks;
    /// a 1 ms cap costs ~1000 polls/s when idle.
    fn default() -> Self {
        Self {
            spin: Duration::from_micros(200),
            min_park: Duration::from_micros(20),
            max_park: Duration::from_millis(1),
            max_block: Duration::from_millis(100),
        }
    }
}

impl IdlePolicy {
    /// Never park (lowest latency, one core per worker).
    pub fn busy_poll() -> Self {
        Self {
            spin: Duration::MAX,
            min_park: Duration::ZERO,
            max_park: Duration::ZERO,
            max_block: Duration::ZERO,
        }
    }
}

impl std::fmt::Display for IdlePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.spin == Duration::MAX {
            return f.write_str("busy-poll");
        }
        write!(
            f,
            "spin {:?}, then block on NIC wait fds (<= {:?}), or park {:?}..{:?} without them",
            self.spin, self.max_block, self.min_park, self.max_park
        )
    }
}

/// The idle state machine behind [`IdlePolicy`]: spin for `spin` after the
/// last activity, then sleep with timeouts doubling from `min_park` to
/// `max_park`. Public so that every polling thread (the engine's workers,
/// transfer-cuda's watcher) shares one implementation.
///
/// It decides, the caller acts: [`IdleState::idle_at`] says whether to
/// keep spinning or how long to sleep, and the caller spins (yield, spin
/// hint) or sleeps (park, block on descriptors) its own way. Time comes in
/// as an argument, so the machine is tested without sleeping.
#[derive(Debug, Clone)]
pub struct IdleState {
    policy: IdlePolicy,
    idle_since: Option<Instant>,
    park: Duration,
}

impl IdleState {
    /// A machine for `policy`, as if just active.
    pub fn new(policy: IdlePolicy) -> Self {
        Self {
            policy,
            idle_since: None,
            park: policy.min_park,
        }
    }

    /// Something happened: spin again from now on, and start the next
    /// sleeps from `min_park`.
    pub fn active(&mut self) {
        self.idle_since = None;
        self.park = self.policy.min_park;
    }

    /// The park timeout the next sleep gets.
    pub fn next_park(&self) -> Duration {
        self.park
    }

    /// One round with nothing to do, at time `now`. `may_park` is false
    /// while operations are in flight (many providers only progress when
    /// polled): then it always says spin. Returns `None` to keep spinning,
    /// or how long the caller may sleep.
    pub fn idle_at(&mut self, now: Instant, may_park: bool) -> Option<Sleep> {
        let since = *self.idle_since.get_or_insert(now);
        if !may_park || now.saturating_duration_since(since) < self.policy.spin {
            return None;
        }
        let park = self.park;
        self.park = (self.park * 2)
            .min(self.policy.max_park)
            .max(self.policy.min_park);
        Some(Sleep {
            park,
            block: self.policy.max_block,
        })
    }
}

/// How long an idle thread may sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sleep {
    /// Timed park (no wait descriptors).
    pub park: Duration,
    /// Block on wait descriptors (they wake the thread earlier).
    pub block: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> IdlePolicy {
        IdlePolicy {
            spin: Duration::from_micros(10),
            min_park: Duration::from_micros(1),
            max_park: Duration::from_micros(8),
            max_block: Duration::from_millis(3),
        }
    }

    #[test]
    fn spins_within_the_window_and_while_work_is_in_flight() {
        let mut s = IdleState::new(policy());
        let t0 = Instant::now();
        assert_eq!(s.idle_at(t0, true), None);
        assert_eq!(s.idle_at(t0 + Duration::from_micros(9), true), None);
        assert_eq!(s.idle_at(t0 + Duration::from_secs(1), false), None);
        let mut busy = IdleState::new(IdlePolicy::busy_poll());
        assert_eq!(busy.idle_at(t0, true), None);
        assert_eq!(busy.idle_at(t0 + Duration::from_secs(3600), true), None);
    }

    #[test]
    fn sleeps_double_up_to_the_cap_and_reset_on_activity() {
        let mut s = IdleState::new(policy());
        let t0 = Instant::now();
        assert_eq!(s.idle_at(t0, true), None);
        let later = t0 + Duration::from_micros(10);
        let parks: Vec<u128> = (0..6)
            .map(|_| s.idle_at(later, true).map_or(0, |z| z.park.as_micros()))
            .collect();
        assert_eq!(parks, [1, 2, 4, 8, 8, 8]);
        assert_eq!(
            s.idle_at(later, true).map(|z| z.block),
            Some(Duration::from_millis(3))
        );
        s.active();
        assert_eq!(s.next_park(), Duration::from_micros(1));
        // The spin window starts again at the next idle round.
        assert_eq!(s.idle_at(later, true), None);
    }
}
