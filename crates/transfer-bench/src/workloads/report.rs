//! `workloads report`: every record in a directory as one table per
//! workload, ours next to the bound and the peers (whatever *.jsonl files
//! the Open MPI and Python runs left there), with the ratios
//! ours / best peer and ours / bound per row; also written as `report.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Result, io};
use crate::workloads::records::{self, Record};

/// Peer engines (not ours, not the bound).
pub const PEERS: [&str; 3] = ["openmpi", "nixl", "mooncake"];
/// Our engine from Python (`cargo xtask bench --peers`): worker-thread and
/// caller-driven progress.
pub const PYTHON: [&str; 2] = ["ours-py", "ours-py-caller"];

/// Whether a smaller value is better for this unit.
pub fn lower_is_better(unit: &str) -> bool {
    matches!(unit, "us" | "s")
}

/// A table row: (transport, params key, metric).
type RowKey = (String, String, String);

/// How rows sort: transport, the params' numbers in the workload's order, metric.
type RowOrder = (String, Vec<u64>, String);

/// A short label of a params point.
pub fn label(workload: &str, p: &serde_json::Value) -> String {
    let g = |k: &str| {
        p.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    let size = |b: f64| crate::plan::human_size(b as u64);
    match workload {
        "kv" => format!(
            "R={} L={} P={} B={} C={}us",
            g("requests"),
            g("layers"),
            g("pages_per_layer"),
            size(g("page_bytes")),
            g("compute_us")
        ),
        "weights" => format!(
            "M={} N={} S={}",
            g("trainers"),
            g("inference"),
            size(g("total_bytes"))
        ),
        "moe" => format!("E={} T={} H={}", g("ranks"), g("tokens"), g("hidden")),
        _ => records::params_key(p),
    }
}

fn fmt(v: f64, unit: &str) -> String {
    let n = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    format!("{n} {unit}")
}

/// The report text of `records`.
pub fn render(records: &[Record]) -> String {
    let mut out = String::new();
    let mut workloads: Vec<&str> = records.iter().map(|r| r.workload.as_str()).collect();
    workloads.sort_by_key(|w| {
        (
            ["kv", "weights", "moe"]
                .iter()
                .position(|x| x == w)
                .unwrap_or(9),
            *w,
        )
    });
    workloads.dedup();
    for w in workloads {
        let rows: Vec<&Record> = records.iter().filter(|r| r.workload == w).collect();
        // (transport, params key, metric) -> engine -> record; sorted by
        // transport, then the params' numeric order, then metric.
        // An engine may run several ways on one transport (Open MPI's
        // weights: MPI_Put and MPI_Bcast), told apart only by `config`:
        // each way keeps its own value in the cell, tagged [1], [2], ...
        let mut configs: Vec<(String, String, String)> = Vec::new();
        for r in &rows {
            let c = (r.engine.clone(), r.transport.clone(), r.config.clone());
            if !configs.contains(&c) {
                configs.push(c);
            }
        }
        let tag = |r: &Record| -> String {
            let same: Vec<&(String, String, String)> = configs
                .iter()
                .filter(|c| c.0 == r.engine && c.1 == r.transport)
                .collect();
            if same.len() < 2 {
                return String::new();
            }
            same.iter()
                .position(|c| c.2 == r.config)
                .map_or(String::new(), |i| format!(" [{}]", i + 1))
        };
        let mut table: BTreeMap<RowKey, BTreeMap<&str, Vec<&Record>>> = BTreeMap::new();
        let mut order: BTreeMap<RowKey, RowOrder> = BTreeMap::new();
        for r in &rows {
            let k = (
                r.transport.clone(),
                records::params_key(&r.params),
                r.metric.clone(),
            );
            let nums: Vec<u64> = sort_keys(w)
                .iter()
                .map(|f| {
                    r.params
                        .get(*f)
                        .and_then(serde_json::Value::as_f64)
                        .unwrap_or(0.0) as u64
                })
                .collect();
            order.insert(k.clone(), (r.transport.clone(), nums, r.metric.clone()));
            table
                .entry(k)
                .or_default()
                .entry(r.engine.as_str())
                .or_default()
                .push(r);
        }
        let mut keys: Vec<_> = table.keys().cloned().collect();
        keys.sort_by(|a, b| order[a].cmp(&order[b]));
        let _ = writeln!(out, "\n### {w}\n");
        let _ = writeln!(
            out,
            "| transport | params | metric | ours | ours from Python | bound | openmpi | nixl | mooncake | ours/best peer | ours from Python/best peer | ours/bound |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for k in keys {
            let e = &table[&k];
            let Some(any) = e.values().flatten().next() else {
                continue;
            };
            let unit = any.unit.as_str();
            let cell = |name: &str| {
                e.get(name).map_or("-".to_string(), |rs| {
                    rs.iter()
                        .map(|r| {
                            let mut s = fmt(r.value, &r.unit);
                            s.push_str(&tag(r));
                            if !r.verified && name != "bound" {
                                s.push_str(" (unverified)");
                            }
                            s
                        })
                        .collect::<Vec<_>>()
                        .join(" / ")
                })
            };
            let first = |name: &str| e.get(name).and_then(|rs| rs.first()).map(|r| r.value);
            let ours = first("ours");
            let best_peer = PEERS
                .iter()
                .flat_map(|p| {
                    e.get(p)
                        .into_iter()
                        .flatten()
                        .map(move |r| (r.value, format!("{p}{}", tag(r))))
                })
                .reduce(|a, b| {
                    let better = if lower_is_better(unit) {
                        b.0 < a.0
                    } else {
                        b.0 > a.0
                    };
                    if better { b } else { a }
                });
            let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
                (Some(x), Some(y)) if y != 0.0 => format!("{:.2}", x / y),
                _ => "-".into(),
            };
            let peer_ratio_of = |mine: Option<f64>| match &best_peer {
                Some((v, name)) => match mine {
                    Some(_) => format!("{} ({name})", ratio(mine, Some(*v))),
                    None => "-".into(),
                },
                None => "-".into(),
            };
            let peer_ratio = peer_ratio_of(ours);
            // Our engine driven from Python (the peers' harness, same pattern
            // as NIXL and Mooncake there): its best mode against the best peer.
            let ours_py = PYTHON.iter().filter_map(|p| first(p)).reduce(|a, b| {
                if (lower_is_better(unit) && b < a) || (!lower_is_better(unit) && b > a) {
                    b
                } else {
                    a
                }
            });
            let py_cell = {
                let cells: Vec<String> = PYTHON
                    .iter()
                    .filter(|p| e.contains_key(**p))
                    .map(|p| {
                        let mode = if *p == "ours-py-caller" {
                            "caller"
                        } else {
                            "thread"
                        };
                        format!("{} ({mode})", cell(p))
                    })
                    .collect();
                if cells.is_empty() {
                    "-".to_string()
                } else {
                    cells.join(" / ")
                }
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                k.0,
                label(w, &any.params),
                k.2,
                cell("ours"),
                py_cell,
                cell("bound"),
                cell("openmpi"),
                cell("nixl"),
                cell("mooncake"),
                peer_ratio,
                peer_ratio_of(ours_py),
                ratio(ours, first("bound")),
            );
        }
        // Each engine's configuration (and its tag when it ran several ways), once.
        let _ = writeln!(out);
        for (engine, transport, config) in &configs {
            let same: Vec<&(String, String, String)> = configs
                .iter()
                .filter(|c| &c.0 == engine && &c.1 == transport)
                .collect();
            let t = if same.len() < 2 {
                String::new()
            } else {
                same.iter()
                    .position(|c| &c.2 == config)
                    .map_or(String::new(), |i| format!(" [{}]", i + 1))
            };
            let _ = writeln!(out, "- {engine} ({transport}){t}: {config}");
        }
        let mut notes: Vec<(String, String)> = rows
            .iter()
            .filter(|r| !r.note.is_empty())
            .map(|r| (r.engine.clone(), r.note.clone()))
            .collect();
        notes.sort();
        notes.dedup();
        for (engine, note) in notes {
            let _ = writeln!(out, "- note ({engine}): {note}");
        }
    }
    let _ = writeln!(
        out,
        "\nRatios: ours / best peer and ours / bound of the row's values (for us and s, below 1 is faster; \
         for GB/s and fraction, above 1 is more)."
    );
    out
}

fn sort_keys(workload: &str) -> &'static [&'static str] {
    match workload {
        "kv" => &[
            "requests",
            "layers",
            "pages_per_layer",
            "page_bytes",
            "compute_us",
        ],
        "weights" => &["trainers", "inference", "total_bytes"],
        "moe" => &["ranks", "tokens", "hidden"],
        _ => &[],
    }
}

/// Reads `dir`, prints the tables, writes `report.md` and the plots; returns the files written.
pub fn print(dir: &Path) -> Result<Vec<PathBuf>> {
    let (mut records, bad) = records::read_dir(dir)?;
    records::derive_weights_fractions(&mut records);
    for b in &bad {
        eprintln!("workloads report: skipped {b}");
    }
    let text = render(&records);
    print!("{text}");
    let md = dir.join("report.md");
    std::fs::write(&md, &text).map_err(io("workloads report: write report.md"))?;
    let mut files = vec![md];
    match crate::workloads::plot::write_all(&records, dir) {
        Ok(p) => files.extend(p),
        Err(e) => eprintln!("workloads plots: {e}"),
    }
    for f in &files {
        println!("wrote {}", f.display());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(engine: &str, metric: &str, unit: &str, value: f64) -> Record {
        Record {
            workload: "moe".into(),
            engine: engine.into(),
            transport: "tcp".into(),
            config: format!("{engine} config"),
            params: serde_json::json!({"ranks": 4, "tokens": 8, "hidden": 7168}),
            metric: metric.into(),
            value,
            unit: unit.into(),
            p10: None,
            p90: None,
            repeats: 5,
            verified: true,
            note: String::new(),
        }
    }

    #[test]
    fn every_engines_fraction_of_the_bound_comes_from_the_runs_bound() {
        let w = |engine: &str, metric: &str, value: f64| Record {
            workload: "weights".into(),
            transport: "netns-tcp".into(),
            params: serde_json::json!({"trainers": 2, "inference": 4, "total_bytes": 1024, "seed": 1}),
            ..rec(
                engine,
                metric,
                if metric == "update_s" {
                    "s"
                } else {
                    "fraction"
                },
                value,
            )
        };
        let mut rows = vec![
            w("bound", "update_s", 4.48),
            w("bound", "frac_of_bound", 1.0),
            w("ours", "update_s", 4.69),
            w("openmpi", "update_s", 6.23),
            // What the MPI program once wrote: its memcpy rate as the bound.
            w("openmpi", "frac_of_bound", 0.026),
        ];
        records::derive_weights_fractions(&mut rows);
        let frac = |rows: &[Record], engine: &str| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.engine == engine && r.metric == "frac_of_bound")
                .map(|r| r.value)
                .collect()
        };
        assert_eq!(frac(&rows, "bound"), vec![1.0]);
        assert_eq!(frac(&rows, "ours"), vec![4.48 / 4.69]);
        assert_eq!(frac(&rows, "openmpi"), vec![4.48 / 6.23]);
        // Another point or transport has no bound: no fraction is made up.
        rows.push(Record {
            transport: "tcp".into(),
            ..w("openmpi", "update_s", 1.0)
        });
        records::derive_weights_fractions(&mut rows);
        assert_eq!(frac(&rows, "openmpi").len(), 1);
    }

    #[test]
    fn ratios_pick_the_best_peer_by_direction() {
        let rows = vec![
            rec("ours", "dispatch_us", "us", 50.0),
            rec("openmpi", "dispatch_us", "us", 100.0),
            rec("nixl", "dispatch_us", "us", 80.0),
            rec("bound", "dispatch_us", "us", 25.0),
        ];
        let t = render(&rows);
        assert!(t.contains("| 0.62 (nixl) | - | 2.00 |"), "{t}");
        let gb = vec![
            rec("ours", "kv_gbps", "GB/s", 2.0),
            rec("mooncake", "kv_gbps", "GB/s", 1.0),
            rec("openmpi", "kv_gbps", "GB/s", 4.0),
        ];
        let t = render(&gb);
        assert!(t.contains("| 0.50 (openmpi) | - | - |"), "{t}");
        assert!(t.contains("- openmpi (tcp): openmpi config"), "{t}");
    }

    #[test]
    fn ways_of_one_engine_stay_apart() {
        let mut put = rec("openmpi", "update_s", "s", 0.04);
        put.config = "MPI_Put".into();
        let mut bcast = rec("openmpi", "update_s", "s", 0.03);
        bcast.config = "MPI_Bcast variant".into();
        let rows = vec![rec("ours", "update_s", "s", 0.06), put, bcast];
        let t = render(&rows);
        assert!(t.contains("| 0.040 s [1] / 0.030 s [2] |"), "{t}");
        assert!(t.contains("| 2.00 (openmpi [2]) | - |"), "{t}");
        assert!(t.contains("- openmpi (tcp) [1]: MPI_Put"), "{t}");
        assert!(t.contains("- openmpi (tcp) [2]: MPI_Bcast variant"), "{t}");
    }

    #[test]
    fn our_python_rows_have_their_own_column_and_ratio() {
        let rows = vec![
            rec("ours", "dispatch_us", "us", 50.0),
            rec("ours-py", "dispatch_us", "us", 90.0),
            rec("ours-py-caller", "dispatch_us", "us", 60.0),
            rec("nixl", "dispatch_us", "us", 80.0),
        ];
        let t = render(&rows);
        assert!(
            t.contains("| 50.00 us | 90.00 us (thread) / 60.00 us (caller) | - |"),
            "{t}"
        );
        assert!(t.contains("| 0.62 (nixl) | 0.75 (nixl) |"), "{t}");
    }
}
