//! A waiter's short spin before it blocks.
//!
//! A thread that blocks on a condition variable comes back only after the
//! completing thread's futex call and a trip through the scheduler; with
//! worker threads every small operation ends with that hand-off (issue 20:
//! an 8 B write from Python took ~2x as long with the engine's worker as
//! with the caller driving it). So a blocking wait first polls its
//! condition for a bounded window, yielding the core every round (on a
//! 2-core machine the thread it waits for may need that core), and only
//! then blocks as before: a completion inside the window is seen without
//! any wake-up (and the completing thread skips its futex call: nobody
//! sleeps), a long wait costs at most the window of CPU, and an idle
//! engine costs nothing (nobody waits).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The window unless [`SPIN_ENV`] says otherwise. Chosen by measurement
/// (see the README's latency notes): it covers a loopback tcp or shm
/// round trip of a small write, so most small waits never block.
pub const DEFAULT_WINDOW: Duration = Duration::from_micros(100);

/// Environment variable overriding the window, in microseconds (`0`: block
/// at once, as before the spin existed). Read once per process.
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
