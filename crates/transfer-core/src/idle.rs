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

pub(crate) struct IdleState {
    policy: IdlePolicy,
    idle_since: Option<Instant>,
    park: Duration,
}

impl IdleState {
    pub(crate) fn new(policy: IdlePolicy) -> Self {
        Self {
            policy,
            idle_since: None,
            park: policy.min_park,
        }
    }

    pub(crate) fn active(&mut self) {
        self.idle_since = None;
        self.park = self.policy.min_park;
    }

    /// One idle round. `may_park` is false while operations are in flight:
    /// many providers only progress when polled. Returns how long the worker
    /// may sleep, or `None` to keep spinning.
    pub(crate) fn idle(&mut self, may_park: bool) -> Option<Sleep> {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if !may_park || now.duration_since(since) < self.policy.spin {
            // Yield rather than a pure spin: where threads outnumber cores
            // (2-core machines, API threads polling flags) a spinning worker
            // otherwise holds the core the thread it waits for needs; the
            // bench's ping-pong went from ~500 us to tens of us with it.
            // With a free core, sched_yield returns at once.
            std::thread::yield_now();
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

/// How long an idle worker may sleep.
pub(crate) struct Sleep {
    /// Timed park (no wait descriptors).
    pub(crate) park: Duration,
    /// Block on wait descriptors.
    pub(crate) block: Duration,
}
