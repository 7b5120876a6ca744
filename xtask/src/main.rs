//! Project automation: `cargo xtask test`, `cargo xtask bench`.
//!
//! Std-only on purpose: it compiles in seconds on a fresh machine, before
//! any system package is installed.

mod deps;
mod step;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  test [--no-vm]      install what is needed, then fmt check, clippy -D warnings,
                      and every test of the workspace (the CI command)
  bench [options]     the main job: the engine between two processes on this
                      machine over the default provider, next to raw baselines
  deps                install (or print how to install) the system packages
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test::run(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("deps") => deps::ensure(&deps::RUNTIME),
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(args: &[String]) -> Result<(), String> {
    deps::ensure(&deps::RUNTIME)?;
    let mut cmd = vec![
        "run",
        "--release",
        "--quiet",
        "-p",
        "transfer-bench",
        "--",
        "local",
    ];
    cmd.extend(args.iter().map(String::as_str));
    step::cargo("bench", &cmd)
}
