//! `TRANSFER_RPC_TRACE=FILE`: a timeline of this process's client traffic,
//! one line per command sent and per answer read (and whatever the caller
//! adds with [`event`]), each `<pid> <microseconds> <what>`. What it is for: the per-step critical path of a run (which
//! command waited for which answer, what crossed a shaped link and when),
//! e.g. llama-bench through the ggml plugin. Off unless the variable is
//! set. Times are the wall clock (microseconds since the Unix epoch), so
//! the lines of several processes on one machine (the servers' too, see
//! `server::Shared::log`) merge into one timeline by sorting. Each line is
//! one append write (nothing buffered is lost when a
//! host exits without unloading us), at most [`MAX_LINES`] per process.

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Environment variable: the file the timeline is appended to.
pub const ENV_TRACE: &str = "TRANSFER_RPC_TRACE";
/// Lines one process writes at most (a long run does not fill the disk).
pub const MAX_LINES: u64 = 1 << 20;

struct Trace {
    start: Instant,
    pid: u32,
    /// The file and the lines written to it.
    file: Mutex<(File, u64)>,
}

static TRACE: OnceLock<Option<Trace>> = OnceLock::new();

fn trace() -> Option<&'static Trace> {
    TRACE
        .get_or_init(|| {
            let path = std::env::var_os(ENV_TRACE)?;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok()?;
            Some(Trace {
                start: Instant::now(),
                pid: std::process::id(),
                file: Mutex::new((file, 0)),
            })
        })
        .as_ref()
}

/// True when a timeline is being written (callers skip formatting otherwise).
pub fn enabled() -> bool {
    trace().is_some()
}

/// Microseconds since the timeline started (0 when off): durations.
pub fn now_us() -> u128 {
    trace().map_or(0, |t| t.start.elapsed().as_micros())
}

/// Appends one line (no-op when off).
pub fn event(what: std::fmt::Arguments<'_>) {
    let Some(t) = trace() else { return };
    let us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let line = format!("{} {us} {what}\n", t.pid);
    let mut g = t.file.lock().unwrap_or_else(|p| p.into_inner());
    if g.1 >= MAX_LINES {
        return;
    }
    g.1 += 1;
    // A trace that cannot be written is only a missing trace.
    let _ = g.0.write_all(line.as_bytes());
}
