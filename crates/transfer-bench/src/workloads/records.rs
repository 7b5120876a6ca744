//! The JSON Lines record every engine writes (WORKLOADS.md, "Results"):
//! one record per (workload, engine, transport, params point, metric), one
//! file per engine + workload run, `<engine>-<workload>-<transport>.jsonl`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result, io};

/// Engines a record may name.
pub const ENGINES: [&str; 7] = [
    "ours",
    "ours-py",
    "ours-py-caller",
    "openmpi",
    "nixl",
    "mooncake",
    "bound",
];

/// One result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// kv, weights or moe.
    pub workload: String,
    /// One of [`ENGINES`].
    pub engine: String,
    /// tcp, shm, netns-tcp, ...
    pub transport: String,
    /// The engine's configuration in words.
    pub config: String,
    /// The workload parameters of this point.
    pub params: serde_json::Value,
    /// Metric name (ttll_us, kv_gbps, hidden_frac, update_s, frac_of_bound, dispatch_us, combine_us).
    pub metric: String,
    /// Median.
    pub value: f64,
    /// us, s, GB/s or fraction.
    pub unit: String,
    /// 10th percentile, where cheap.
    #[serde(default)]
    pub p10: Option<f64>,
    /// 90th percentile, where cheap.
    #[serde(default)]
    pub p90: Option<f64>,
    /// Timed iterations.
    pub repeats: u64,
    /// Every byte checked after every timed iteration.
    pub verified: bool,
    /// Why a row is not like for like (empty when it is).
    #[serde(default)]
    pub note: String,
}

/// The file name of one engine + workload run.
pub fn file_name(engine: &str, workload: &str, transport: &str) -> String {
    format!("{engine}-{workload}-{transport}.jsonl")
}

/// Writes `records` to `dir/<engine>-<workload>-<transport>.jsonl` (replacing it).
pub fn write(
    dir: &Path,
    engine: &str,
    workload: &str,
    transport: &str,
    records: &[Record],
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io("workloads: create the output directory"))?;
    let path = dir.join(file_name(engine, workload, transport));
    let mut text = Vec::new();
    for r in records {
        serde_json::to_writer(&mut text, r)
            .map_err(|e| crate::error::protocol("workloads: encode a record", e.to_string()))?;
        text.push(b'\n');
    }
    let mut f = std::fs::File::create(&path).map_err(io("workloads: create a results file"))?;
    f.write_all(&text)
        .map_err(io("workloads: write a results file"))?;
    Ok(path)
}

/// Every record of every `*.jsonl` in `dir`, with the lines that did not
/// parse reported as (file:line, reason) instead of stopping the report.
pub fn read_dir(dir: &Path) -> Result<(Vec<Record>, Vec<String>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io("workloads report: read the directory"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut records = Vec::new();
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(io("workloads report: read a file"))?;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Record>(line) {
                Ok(r) if ENGINES.contains(&r.engine.as_str()) && r.value.is_finite() => {
                    records.push(r)
                }
                Ok(r) => bad.push(format!(
                    "{}:{}: engine {:?} / value {} not reportable",
                    f.display(),
                    n + 1,
                    r.engine,
                    r.value
                )),
                Err(e) => bad.push(format!("{}:{}: {e}", f.display(), n + 1)),
            }
        }
    }
    if files.is_empty() {
        return Err(BenchError::Usage(format!(
            "workloads report: no *.jsonl in {}",
            dir.display()
        )));
    }
    Ok((records, bad))
}

/// Every engine's weights `frac_of_bound`, computed here from its
/// `update_s` and the bound's `update_s` of the same transport and point
/// (replacing any the engine wrote): one rule for every engine, and the
/// bound is the run's own (memcpy on one host, the shaped link's measured
/// rate on namespace hosts), which an outside program cannot know. Open
/// MPI's program once divided by its own memcpy rate and read 0.026 on a
/// 1 Gbit/s namespace link where the time was 1.39x the link's bound.
pub fn derive_weights_fractions(records: &mut Vec<Record>) {
    let bound_s = |r: &Record, all: &[Record]| {
        all.iter()
            .find(|b| {
                b.engine == "bound"
                    && b.workload == "weights"
                    && b.metric == "update_s"
                    && b.transport == r.transport
                    && params_key(&b.params) == params_key(&r.params)
            })
            .map(|b| b.value)
    };
    records.retain(|r| {
        !(r.workload == "weights" && r.metric == "frac_of_bound" && r.engine != "bound")
    });
    let derived: Vec<Record> = records
        .iter()
        .filter(|r| r.workload == "weights" && r.metric == "update_s" && r.engine != "bound")
        .filter_map(|u| {
            let b = bound_s(u, records)?;
            (u.value > 0.0).then(|| Record {
                metric: "frac_of_bound".into(),
                value: b / u.value,
                unit: "fraction".into(),
                // The quantiles of a ratio swap ends: a slow update is a low fraction.
                p10: u.p90.filter(|v| *v > 0.0).map(|v| b / v),
                p90: u.p10.filter(|v| *v > 0.0).map(|v| b / v),
                ..u.clone()
            })
        })
        .collect();
    records.extend(derived);
}

/// A canonical text of a params object: keys sorted, numbers as f64, so
/// that `4` from one writer and `4.0` from another are the same point.
pub fn params_key(p: &serde_json::Value) -> String {
    match p {
        serde_json::Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            keys.iter()
                .map(|k| format!("{k}={}", params_key(&m[k.as_str()])))
                .collect::<Vec<_>>()
                .join(" ")
        }
        serde_json::Value::Number(n) => {
            n.as_f64().map_or_else(|| n.to_string(), |f| format!("{f}"))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_peers_merge() {
        let dir = std::env::temp_dir().join(format!("wl-records-{}", std::process::id()));
        let r = Record {
            workload: "kv".into(),
            engine: "ours".into(),
            transport: "tcp".into(),
            config: "tcp".into(),
            params: serde_json::json!({"layers": 8, "requests": 2}),
            metric: "ttll_us".into(),
            value: 12.5,
            unit: "us".into(),
            p10: Some(11.0),
            p90: None,
            repeats: 5,
            verified: true,
            note: String::new(),
        };
        let path = write(&dir, "ours", "kv", "tcp", std::slice::from_ref(&r)).unwrap();
        assert!(path.ends_with("ours-kv-tcp.jsonl"));
        // A peer's file written by another language: floats for ints, no p10.
        std::fs::write(
            dir.join("openmpi-kv-tcp.jsonl"),
            "{\"workload\":\"kv\",\"engine\":\"openmpi\",\"transport\":\"tcp\",\"config\":\"btl tcp\",\
             \"params\":{\"requests\":2.0,\"layers\":8},\"metric\":\"ttll_us\",\"value\":20,\"unit\":\"us\",\
             \"p90\":null,\"repeats\":5,\"verified\":true,\"note\":\"\"}\nnot json\n",
        )
        .unwrap();
        let (all, bad) = read_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(all.contains(&r));
        assert_eq!(params_key(&all[0].params), params_key(&all[1].params));
    }
}
