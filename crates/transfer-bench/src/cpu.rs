//! CPU time of this process, from /proc, for the idle-cost measurement.

use std::time::{Duration, Instant};

/// User + system CPU time of this process so far (every thread), with
/// nanosecond resolution: the CPU-per-operation rows divide short runs by
/// thousands of operations, where /proc's 10 ms ticks would be noise.
pub fn process_cpu() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into a live local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        return Some(Duration::new(
            u64::try_from(ts.tv_sec).ok()?,
            u32::try_from(ts.tv_nsec).ok()?,
        ));
    }
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat_cpu(&stat, clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Parses utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
pub fn parse_stat_cpu(stat: &str, ticks_per_sec: u64) -> Option<Duration> {
    // The command name (field 2) may contain spaces; fields restart after ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks_per_sec.max(1) as f64,
    ))
}

/// CPU used by this process while sleeping `secs`, as % of one core.
pub fn idle_percent(secs: f64) -> Option<f64> {
    let c0 = process_cpu()?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let c1 = process_cpu()?;
    Some(100.0 * (c1.saturating_sub(c0)).as_secs_f64() / t0.elapsed().as_secs_f64())
}

/// The 1-minute load average (`/proc/loadavg`), where the system has one.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn parses_proc_stat_even_with_spaces_in_the_name() {
        let stat = "1234 (transfer bench) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0";
        assert_eq!(
            super::parse_stat_cpu(stat, 100),
            Some(Duration::from_secs(3))
        );
        assert_eq!(super::parse_stat_cpu("nonsense", 100), None);
    }
}
