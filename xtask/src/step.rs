//! Running commands as named steps with clear failures.

use std::process::Command;
use std::time::Instant;

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

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
