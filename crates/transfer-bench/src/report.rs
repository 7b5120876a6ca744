//! The terminal table.

use std::fmt::Write as _;

use crate::results::{Figure, Metric, Results, Row};

fn value(metric: Metric, f: &Figure) -> String {
    match metric {
        Metric::Bandwidth => {
            let v = f.value;
            if v >= 1e9 {
                format!("{:.2} GB/s", v / 1e9)
            } else {
                format!("{:.1} MB/s", v / 1e6)
            }
        }
        Metric::Rate => format!("{:.1} k/s", f.value / 1e3),
        Metric::Latency => format!("{:.1} us", f.value),
        Metric::CpuPerOp => format!("{:.2} us cpu", f.value),
    }
}

fn tail(f: &Figure) -> String {
    f.latency
        .map(|l| format!("{:.1}/{:.1}", l.p50_us, l.p99_us))
        .unwrap_or_default()
}

fn verdict(r: &Row) -> &'static str {
    match r.meets_target() {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "",
    }
}

/// Renders the results as a fixed-width table.
pub fn table(res: &Results) -> String {
    let mut out = String::new();
    // Native verbs runs have no libfabric version to show.
    let library = if res.libfabric.is_empty() {
        String::new()
    } else {
        format!(" (libfabric {})", res.libfabric)
    };
    let _ = writeln!(
        out,
        "transfer-bench: provider {}{library}, {} mode, {}",
        res.provider, res.mode, res.layout
    );
    let _ = writeln!(
        out,
        "{:<13} {:<22} {:>12} {:>12} {:>7} {:>11} {:>8} {:>7} {:>16} {:<3}",
        "sweep", "point", "engine", "baseline", "ratio", "range", "target", "", "p50/p99 us", "ok"
    );
    let _ = writeln!(out, "{}", "-".repeat(122));
    for r in &res.rows {
        let base = r
            .baseline
            .as_ref()
            .map(|b| value(r.metric, b))
            .unwrap_or_else(|| "-".into());
        let ratio = r
            .ratio
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into());
        let range = r
            .ratio_spread
            .map(|(lo, hi)| format!("{lo:.2}-{hi:.2}"))
            .unwrap_or_default();
        let ok = match (r.moves_data, r.verified) {
            (false, _) => "n/a",
            (true, true) => "yes",
            (true, false) => "no",
        };
        let _ = writeln!(
            out,
            "{:<13} {:<22} {:>12} {:>12} {:>7} {:>11} {:>8} {:>7} {:>16} {:<3}",
            r.sweep,
            r.label,
            value(r.metric, &r.engine),
            base,
            ratio,
            range,
            r.target.clone().unwrap_or_default(),
            verdict(r),
            tail(&r.engine),
            ok
        );
    }
    let mut baselines: Vec<&str> = res
        .rows
        .iter()
        .filter_map(|r| r.baseline_name.as_deref())
        .collect();
    baselines.sort_unstable();
    baselines.dedup();
    let _ = writeln!(out, "baselines: {}", baselines.join("; "));
    let _ = writeln!(
        out,
        "throughput rows: median of interleaved repeats (engine, baseline, ...); range: lowest-highest per-repeat ratio"
    );
    if let Some(m) = res.memcpy_bytes_per_sec {
        let _ = writeln!(
            out,
            "memcpy (one core, this machine's limit for shm): {:.2} GB/s",
            m / 1e9
        );
    }
    if let Some(idle) = &res.idle {
        let verdict = if idle.percent_of_core < 2.0 {
            "met"
        } else {
            "MISSED"
        };
        let _ = writeln!(
            out,
            "idle engine: {:.2} % of one core over {:.0} s (target < 2 %: {verdict}); idle policy: {}",
            idle.percent_of_core, idle.seconds, idle.policy
        );
    }
    for n in &res.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
