//! The coordinator's side of `workloads run`: the params points of each
//! workload, the ranks stepped through warm-up and timed iterations, the
//! records (ours and the bound) written per workload.

use std::path::{Path, PathBuf};

use crate::error::{BenchError, Result, protocol};
use crate::stats::percentile;
use crate::workloads::bound::{self, Medium};
use crate::workloads::coord::{FromRank, Job, Ranks, ToRank};
use crate::workloads::records::{self, Record};
use crate::workloads::spec::{KvParams, MoeParams, WeightsParams};
use crate::workloads::{kv, weights};

/// Sizes: smoke (tests), quick, default, full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Tiny (seconds in debug builds).
    Smoke,
    /// WORKLOADS.md's quick sizes.
    Quick,
    /// WORKLOADS.md's defaults.
    Default,
    /// The large sizes.
    Full,
}

/// The params points of `workload` at `size`.
pub fn points(workload: &str, size: Size) -> Result<Vec<serde_json::Value>> {
    let json = |v: serde_json::Result<serde_json::Value>| {
        v.map_err(|e| protocol("workloads: params", e.to_string()))
    };
    match workload {
        "kv" => {
            let base = match size {
                Size::Smoke => KvParams {
                    layers: 3,
                    pages_per_layer: 4,
                    page_bytes: 4096,
                    requests: 2,
                    compute_us: 100,
                    seed: 1,
                },
                Size::Quick => KvParams {
                    layers: 8,
                    pages_per_layer: 64,
                    page_bytes: 16384,
                    requests: 2,
                    compute_us: 500,
                    seed: 1,
                },
                Size::Default => KvParams {
                    layers: 32,
                    pages_per_layer: 64,
                    page_bytes: 16384,
                    requests: 4,
                    compute_us: 500,
                    seed: 1,
                },
                // 4096 tokens per request at 16 tokens per page.
                Size::Full => KvParams {
                    layers: 32,
                    pages_per_layer: 256,
                    page_bytes: 16384,
                    requests: 4,
                    compute_us: 500,
                    seed: 1,
                },
            };
            // hidden_frac needs the same point with no compute.
            [
                base,
                KvParams {
                    compute_us: 0,
                    ..base
                },
            ]
            .iter()
            .map(|p| json(serde_json::to_value(p)))
            .collect()
        }
        "weights" => {
            let (m, n, s) = match size {
                Size::Smoke => (2, 2, 1 << 20),
                Size::Quick => (2, 4, 32 << 20),
                Size::Default => (2, 4, 256 << 20),
                Size::Full => (2, 4, 2u64 << 30),
            };
            let p = WeightsParams {
                trainers: m,
                inference: n,
                total_bytes: s,
                seed: 1,
            };
            Ok(vec![json(serde_json::to_value(p))?])
        }
        "moe" => {
            let (tokens, hidden, experts, topk): (&[u64], u64, u64, u64) = match size {
                Size::Smoke => (&[1, 8], 512, 16, 4),
                Size::Quick => (&[1, 32], 7168, 256, 8),
                Size::Default => (&[1, 8, 32, 128], 7168, 256, 8),
                Size::Full => (&[1, 8, 32, 128, 4096], 7168, 256, 8),
            };
            tokens
                .iter()
                .map(|&t| {
                    json(serde_json::to_value(MoeParams {
                        ranks: 4,
                        tokens: t,
                        hidden,
                        experts,
                        topk,
                        seed: 1,
                    }))
                })
                .collect()
        }
        other => Err(BenchError::Usage(format!(
            "unknown workload {other:?} (kv, weights, moe or all)"
        ))),
    }
}

/// Ranks of a workload's points (all points of one workload have the same).
pub fn ranks(workload: &str, point: &serde_json::Value) -> Result<usize> {
    let get = |k: &str| {
        point
            .get(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0) as usize
    };
    match workload {
        "kv" => Ok(kv::RANKS),
        "weights" => Ok(get("trainers") + get("inference")),
        "moe" => Ok(get("ranks")),
        other => Err(BenchError::Usage(format!("unknown workload {other:?}"))),
    }
}

/// (metric, unit, larger is better) of what ranks report, in the order they report it.
fn rank_metrics(workload: &str) -> &'static [(&'static str, &'static str)] {
    match workload {
        "kv" => &[("ttll_us", "us"), ("kv_gbps", "GB/s")],
        "weights" => &[("update_s", "s")],
        _ => &[("dispatch_us", "us"), ("combine_us", "us")],
    }
}

/// What describes this run in every record.
pub struct RunInfo {
    /// tcp, shm, netns-tcp.
    pub transport: String,
    /// Our engine's configuration in words.
    pub config: String,
    /// The bound's medium.
    pub medium: Medium,
    /// Timed iterations per point.
    pub repeats: u64,
    /// Why our rows of this run are not like for like (empty when they are).
    pub note: String,
}

/// Tells every rank which workload it runs (first message after Hello).
pub fn start(ranks: &mut Ranks, workload: &str) -> Result<()> {
    ranks.broadcast(&ToRank::Job(Job {
        workload: workload.into(),
        world: ranks.world(),
    }))
}

/// Runs every point of `workload` on `ranks` (after [`start`]) and writes
/// `ours-<workload>-<transport>.jsonl` and `bound-<workload>-<transport>.jsonl` in `out`.
pub fn run_workload(
    ranks: &mut Ranks,
    workload: &str,
    points: &[serde_json::Value],
    info: &RunInfo,
    out: &Path,
) -> Result<Vec<PathBuf>> {
    let mut ours = Vec::new();
    let mut bounds = Vec::new();
    let metrics = rank_metrics(workload);
    for point in points {
        eprintln!("workloads: {workload} {}", records::params_key(point));
        ranks.broadcast(&ToRank::Setup(point.clone()))?;
        let mut list = Vec::new();
        for m in ranks.gather()? {
            match m {
                FromRank::Ready { addr, region } => list.push((addr, region)),
                other => {
                    return Err(protocol(
                        "workloads",
                        format!("expected Ready, got {other:?}"),
                    ));
                }
            }
        }
        ranks.broadcast(&ToRank::Peers(list))?;
        for m in ranks.gather()? {
            if !matches!(m, FromRank::Connected) {
                return Err(protocol(
                    "workloads",
                    format!("expected Connected, got {m:?}"),
                ));
            }
        }
        // samples[metric][iteration]: the max over ranks that report it.
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); metrics.len()];
        for it in 0..=info.repeats {
            ranks.broadcast(&ToRank::Go(it))?;
            let mut agg = vec![f64::NAN; metrics.len()];
            for m in ranks.gather()? {
                let FromRank::Done(values) = m else {
                    return Err(protocol("workloads", format!("expected Done, got {m:?}")));
                };
                for (a, v) in agg.iter_mut().zip(values) {
                    *a = if a.is_nan() { v } else { a.max(v) };
                }
            }
            // Iteration 0 is the untimed warm-up.
            if it > 0 {
                for (s, a) in samples.iter_mut().zip(agg) {
                    s.push(a);
                }
            }
        }
        for ((metric, unit), s) in metrics.iter().zip(&samples) {
            ours.push(record(workload, "ours", info, point, metric, unit, s, ""));
        }
        bounds.extend(bound_records(workload, point, info)?);
    }
    derived(workload, &mut ours, &bounds, info);
    for r in &mut ours {
        let notes: Vec<&str> = [
            if workload == "weights" {
                weights::NOTE
            } else {
                ""
            },
            info.note.as_str(),
        ]
        .into_iter()
        .filter(|n| !n.is_empty())
        .collect();
        r.note = notes.join("; ");
    }
    let a = records::write(out, "ours", workload, &info.transport, &ours)?;
    let b = records::write(out, "bound", workload, &info.transport, &bounds)?;
    Ok(vec![a, b])
}

#[allow(clippy::too_many_arguments)]
fn record(
    workload: &str,
    engine: &str,
    info: &RunInfo,
    point: &serde_json::Value,
    metric: &str,
    unit: &str,
    samples: &[f64],
    note: &str,
) -> Record {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let (value, p10, p90) = if sorted.len() > 1 {
        (
            percentile(&sorted, 0.5),
            Some(percentile(&sorted, 0.1)),
            Some(percentile(&sorted, 0.9)),
        )
    } else {
        (sorted.first().copied().unwrap_or(f64::NAN), None, None)
    };
    Record {
        workload: workload.into(),
        engine: engine.into(),
        transport: info.transport.clone(),
        config: if engine == "bound" {
            info.medium.describe()
        } else {
            info.config.clone()
        },
        params: point.clone(),
        metric: metric.into(),
        value,
        unit: unit.into(),
        p10,
        p90,
        repeats: if engine == "bound" {
            1
        } else {
            sorted.len() as u64
        },
        verified: engine != "bound",
        note: note.into(),
    }
}

fn bound_records(workload: &str, point: &serde_json::Value, info: &RunInfo) -> Result<Vec<Record>> {
    let bad = |e: serde_json::Error| protocol("workloads: params", e.to_string());
    let m = &info.medium;
    let one = |metric: &str, unit: &str, v: f64| {
        record(workload, "bound", info, point, metric, unit, &[v], "")
    };
    Ok(match workload {
        "kv" => {
            let p: KvParams = serde_json::from_value(point.clone()).map_err(bad)?;
            vec![
                one("ttll_us", "us", bound::kv_ttll_us(&p, m)),
                one("kv_gbps", "GB/s", m.rate() / 1e9),
            ]
        }
        "weights" => {
            let p: WeightsParams = serde_json::from_value(point.clone()).map_err(bad)?;
            vec![
                one(
                    "update_s",
                    "s",
                    bound::weights_s(p.total_bytes, p.trainers, p.inference, m),
                ),
                one("frac_of_bound", "fraction", 1.0),
            ]
        }
        _ => {
            let p: MoeParams = serde_json::from_value(point.clone()).map_err(bad)?;
            let rt = p.routing();
            vec![
                one("dispatch_us", "us", bound::moe_us(&rt.count, p.hidden, m)),
                one(
                    "combine_us",
                    "us",
                    bound::moe_us(&rt.count, 2 * p.hidden, m),
                ),
            ]
        }
    })
}

/// Metrics computed from others: kv's hidden_frac, weights' frac_of_bound.
fn derived(workload: &str, ours: &mut Vec<Record>, bounds: &[Record], info: &RunInfo) {
    let key = |r: &Record| records::params_key(&r.params);
    match workload {
        "kv" => {
            let ttll: Vec<Record> = ours
                .iter()
                .filter(|r| r.metric == "ttll_us")
                .cloned()
                .collect();
            for with in ttll
                .iter()
                .filter(|r| r.params.get("compute_us").and_then(|v| v.as_u64()) != Some(0))
            {
                let mut zero = with.params.clone();
                if let Some(o) = zero.as_object_mut() {
                    o.insert("compute_us".into(), 0.into());
                }
                if let Some(z) = ttll.iter().find(|r| key(r) == records::params_key(&zero)) {
                    let frac = 1.0 - with.value / z.value;
                    ours.push(record(
                        workload,
                        "ours",
                        info,
                        &with.params,
                        "hidden_frac",
                        "fraction",
                        &[frac],
                        "",
                    ));
                    if let Some(last) = ours.last_mut() {
                        last.repeats = with.repeats;
                    }
                }
            }
        }
        "weights" => {
            let upd: Vec<Record> = ours
                .iter()
                .filter(|r| r.metric == "update_s")
                .cloned()
                .collect();
            for u in upd {
                if let Some(b) = bounds
                    .iter()
                    .find(|b| b.metric == "update_s" && key(b) == key(&u))
                {
                    let mut r = record(
                        workload,
                        "ours",
                        info,
                        &u.params,
                        "frac_of_bound",
                        "fraction",
                        &[b.value / u.value],
                        "",
                    );
                    r.repeats = u.repeats;
                    ours.push(r);
                }
            }
        }
        _ => {}
    }
}
