//! `cargo xtask test`: what CI runs.

use crate::{deps, step};

/// Features every workspace build of the tests enables. Not `--all-features`:
/// optional native builds (transfer-rpc's ggml) run as their own step.
const WORKSPACE_FEATURES: &str = "transfer-core/test-domain,transfer-core/conformance";

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
            "--features",
            WORKSPACE_FEATURES,
            "--",
            "-D",
            "warnings",
        ],
    )?;
    step::cargo(
        "tests",
        &[
            "test",
            "--workspace",
            "--features",
            WORKSPACE_FEATURES,
            "--no-fail-fast",
        ],
    )?;
    eprintln!("==> all checks passed");
    Ok(())
}
