//! Running every sweep and writing the results.

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::{BackendOpts, idle_policy};
use crate::baseline::{memcpy, perftest};
use crate::driver::Driver;
use crate::error::{Result, io};
use crate::plan::Plan;
use crate::results::{IdleCost, Results, SCHEMA_VERSION};
use crate::{caller, cpu, cpu_cost, plot, report, sweeps};

type Sweep = fn(&mut Driver, &Plan, &ProgressBar) -> Result<Vec<crate::results::Row>>;

/// Runs the driver against `peers`, prints the table, writes JSON and plots to `out`.
pub fn drive(
    peers: &[String],
    opts: &BackendOpts,
    plan: &Plan,
    out: &Path,
    layout: &str,
) -> Result<Results> {
    let load_before = cpu::load_average();
    let mut d = Driver::connect(peers, opts, plan)?;
    let steps = plan.bw_sizes.len()
        + plan.lat_sizes.len()
        + 1
        + plan.paged.len()
        + plan.scatter_sizes.len()
        + 2
        + plan.msg_sizes.len()
        + 3
        + 2;
    let pb = ProgressBar::new(steps as u64);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    let sweeps: [(&str, Sweep); 10] = [
        ("write_bw", sweeps::write_bandwidth),
        ("write_lat", sweeps::write_latency),
        ("imm_rate", sweeps::imm_rate),
        ("paged", sweeps::paged),
        ("scatter", sweeps::scatter),
        ("barrier", sweeps::barrier),
        ("imm_pingpong", sweeps::imm_pingpong),
        ("send_recv", sweeps::send_recv),
        ("caller", caller::caller_latency),
        ("cpu", cpu_cost::cpu_per_op),
    ];
    // TRANSFER_BENCH_SWEEPS=write_lat,caller,...: only those sweeps (profiling
    // one path without the minutes of the others); unset: all of them.
    let only = std::env::var("TRANSFER_BENCH_SWEEPS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| w.trim() == name))
    };
    let mut rows = Vec::new();
    for (name, s) in sweeps {
        if wanted(name) {
            rows.extend(s(&mut d, plan, &pb)?);
        }
    }
    pb.finish_and_clear();
    // On verbs, perftest's figures from this same session next to the engine's.
    let (rows, mut notes) = perftest::with_baselines(opts, plan, rows);
    let skipped = plan
        .paged
        .iter()
        .filter(|(p, n)| p * n > plan.region_len)
        .count();
    if skipped > 0 {
        notes.push(format!(
            "{skipped} paged point(s) need more than the {} MiB region of this mode (use --full)",
            plan.region_len >> 20
        ));
    }
    // A reader tells a regression from a busy machine by the load.
    if let (Some(before), Some(after)) = (load_before, cpu::load_average()) {
        notes.push(format!(
            "load average (1 min) {before:.2} at the start, {after:.2} after the sweeps, on {} cores",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    d.bye();
    eprintln!("measuring the idle engine for {:.0} s ...", plan.idle_secs);
    let idle = cpu::idle_percent(plan.idle_secs).map(|p| IdleCost {
        seconds: plan.idle_secs,
        percent_of_core: p,
        policy: idle_policy().to_string(),
    });
    // Only a libfabric run has a libfabric version worth reporting.
    let libfabric = match opts.family() {
        Ok(transfer::BackendFamily::Verbs) => String::new(),
        _ => transfer_efa::Library::load()
            .map(|l| l.version_string())
            .unwrap_or_default(),
    };
    let res = Results {
        schema: SCHEMA_VERSION,
        provider: d.provider.clone(),
        libfabric,
        mode: format!("{:?}", plan.mode).to_lowercase(),
        layout: layout.into(),
        rows,
        idle,
        memcpy_bytes_per_sec: Some(memcpy::bandwidth(64 << 20, 5)),
        notes,
    };
    write(&res, out)?;
    Ok(res)
}

/// Prints the table and writes `results.json` and the plots under `out`.
pub fn write(res: &Results, out: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).map_err(io("create output directory"))?;
    print!("{}", report::table(res));
    let json = out.join("results.json");
    let text = serde_json::to_string_pretty(res)
        .map_err(|e| crate::error::protocol("results", e.to_string()))?;
    std::fs::write(&json, text).map_err(io("write results.json"))?;
    let mut files = vec![json];
    match plot::write_all(res, out) {
        Ok(p) => files.extend(p),
        Err(e) => eprintln!("plots: {e}"),
    }
    for f in &files {
        println!("wrote {}", f.display());
    }
    Ok(files)
}
