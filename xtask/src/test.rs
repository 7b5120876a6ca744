//! `cargo xtask test`: what CI runs.

use crate::{deps, step};

pub fn run(args: &[String]) -> Result<(), String> {
    for a in args {
        match a.as_str() {
            "--no-vm" => {}
            other => return Err(format!("test: unknown option `{other}`")),
        }
    }
    deps::ensure(&deps::RUNTIME)?;
    step::cargo("rustfmt check", &["fmt", "--all", "--", "--check"])?;
    step::cargo(
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    step::cargo(
        "tests",
        &["test", "--workspace", "--all-features", "--no-fail-fast"],
    )?;
    eprintln!("==> all checks passed");
    Ok(())
}
