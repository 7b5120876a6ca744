//! Running commands as named steps with clear failures.

use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

/// Every step run so far in this process: (name, seconds, ok).
static TIMES: Mutex<Vec<(String, f64, bool)>> = Mutex::new(Vec::new());

/// Records a step's time for [`print_summary`] (steps not run through
/// [`run`], e.g. pytest's or test-backend-ops', call it themselves).
pub fn record(name: &str, secs: f64, ok: bool) {
    if let Ok(mut t) = TIMES.lock() {
        t.push((name.to_string(), secs, ok));
    }
}

/// One line per step with its own elapsed time, in the order they ran,
/// and the wall time since `start`.
pub fn print_summary(start: Instant) {
    let Ok(t) = TIMES.lock() else { return };
    eprintln!("==> step times:");
    for (name, secs, ok) in t.iter() {
        let name: String = name.chars().take(90).collect();
        eprintln!("  {secs:7.1} s  {}{name}", if *ok { "" } else { "FAILED " });
    }
    eprintln!("  {:7.1} s  in all", start.elapsed().as_secs_f64());
}

/// Runs `cargo <args>` as a named step.
pub fn cargo(name: &str, args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(name, Command::new(cargo).args(args))
}

/// Runs a command as a named step, printing its duration.
pub fn run(name: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("==> {name}: {}", describe(cmd));
    let start = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("{name}: could not start `{}`: {e}", describe(cmd)))?;
    let secs = start.elapsed().as_secs_f64();
    record(name, secs, status.success());
    if status.success() {
        eprintln!("==> {name}: ok ({secs:.1} s)");
        Ok(())
    } else {
        Err(format!(
            "{name} failed ({status}) after {secs:.1} s: `{}`",
            describe(cmd)
        ))
    }
}

/// The command line of `cmd`, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
