//! A waiter's short spin before it blocks.
//!
//! A thread that blocks on a condition variable comes back only after the
//! completing thread's futex call and a trip through the scheduler; with
//! worker threads every small operation ends with that hand-off (issue 20:
//! an 8 B write from Python took ~2x as long with the engine's worker as
//! with the caller driving it). A blocking wait may first poll its
//! condition for a bounded window, yielding the core every round (on a
//! 2-core machine the thread it waits for may need that core), and only
//! then block as before: a completion inside the window is seen without
//! any wake-up (and the completing thread skips its futex call: nobody
//! sleeps), a long wait costs at most the window of CPU, and an idle
//! engine costs nothing (nobody waits). The engine's callback thread polls
//! for the same window after running callbacks.
//!
//! Off by default, by measurement: on the loaded 2-core machine (load
//! average 9-12) a 100 us window took the Python waiter's sleeps from 1.0
//! to 0.004-0.02 per 8 B write at the same CPU time per write, but the
//! write's median stayed where it was on tcp (50.7 vs 48.8 us) and rose on
//! shm (22.6 vs 19.9 us): there, a woken sleeper is scheduled ahead of a
//! thread that yields. Whether it pays on a quiet machine (where waking a
//! thread may mean waking an idle vCPU) is for a quiet run to say:
//! `TRANSFER_WAIT_SPIN_US=100` against `0`, same run.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The window unless [`SPIN_ENV`] says otherwise: none (see above).
pub const DEFAULT_WINDOW: Duration = Duration::ZERO;

/// Environment variable setting the window, in microseconds (`0`: block
/// at once). Read once per process.
pub const SPIN_ENV: &str = "TRANSFER_WAIT_SPIN_US";

/// Longest window the variable may set: a typo must not turn every wait
/// into a busy loop.
const MAX_WINDOW: Duration = Duration::from_millis(10);

/// How long a blocking wait polls before it blocks.
pub fn window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| parse(std::env::var(SPIN_ENV).ok().as_deref()))
}

fn parse(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_WINDOW, Duration::from_micros)
        .min(MAX_WINDOW)
}

/// Polls `ready` until it holds or `limit` passed, yielding the core
/// between polls; returns whether it held. A zero `limit` polls once.
pub fn spin_until(limit: Duration, ready: impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    if limit.is_zero() {
        return false;
    }
    let end = Instant::now() + limit;
    loop {
        std::thread::yield_now();
        if ready() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_window_comes_from_the_variable_bounded() {
        assert_eq!(parse(None), DEFAULT_WINDOW);
        assert_eq!(parse(Some("0")), Duration::ZERO);
        assert_eq!(parse(Some("100")), Duration::from_micros(100));
        assert_eq!(parse(Some(" 30 ")), Duration::from_micros(30));
        assert_eq!(parse(Some("lots")), DEFAULT_WINDOW);
        assert_eq!(parse(Some("999999999")), MAX_WINDOW);
    }

    #[test]
    fn spins_until_ready_or_the_limit() {
        let n = AtomicU32::new(0);
        assert!(spin_until(Duration::from_secs(5), || {
            n.fetch_add(1, Ordering::Relaxed) >= 3
        }));
        assert!(n.load(Ordering::Relaxed) >= 4);
        assert!(!spin_until(Duration::ZERO, || false));
        assert!(!spin_until(Duration::from_micros(50), || false));
    }
}
