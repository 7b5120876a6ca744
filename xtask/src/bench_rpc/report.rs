//! From the coordinator's per-run reports to the summary: medians over
//! repeats, ratios against the hub arm, the two targets, the token check,
//! the printed table and results.json.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::args::{Arm, RpcArgs};
use super::json::{self, Json};
use super::schedule::Run;

/// One finished run: where it sat in the schedule and what it measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The scheduled run.
    pub run: Run,
    /// The arm the coordinator actually used (differs after a fallback).
    pub arm_used: String,
    /// Output tokens per second, all streams and groups together.
    pub tokens_per_s: f64,
    /// Median milliseconds per output token.
    pub ms_p50: f64,
    /// 99th percentile milliseconds per output token.
    pub ms_p99: f64,
    /// Bytes through the coordinator's link per decode step.
    pub coordinator_bytes_per_step: f64,
    /// md5 of every generated token: equal across arms for one config.
    pub tokens_md5: String,
    /// Number of fallbacks the coordinator reported.
    pub fallbacks: usize,
    /// The coordinator's whole report, kept for results.json.
    pub raw: Json,
}

impl Sample {
    /// Reads the coordinator's report of `run`.
    pub fn from_report(run: Run, report: &Json) -> Result<Sample, String> {
        let need = |k: &str| {
            report
                .num(k)
                .ok_or_else(|| format!("coordinator report lacks the number `{k}`"))
        };
        let fallbacks = match report.get("fallbacks") {
            Some(Json::Arr(v)) => v.len(),
            Some(Json::Num(n)) => *n as usize,
            Some(Json::Null) | None => 0,
            Some(other) => {
                return Err(format!("coordinator report: odd `fallbacks`: {other:?}"));
            }
        };
        Ok(Sample {
            run,
            arm_used: report
                .str("arm_used")
                .ok_or("coordinator report lacks `arm_used`")?
                .to_string(),
            tokens_per_s: need("tokens_per_s")?,
            ms_p50: need("ms_per_token_p50")?,
            ms_p99: need("ms_per_token_p99")?,
            coordinator_bytes_per_step: need("coordinator_bytes_per_step")?,
            tokens_md5: report
                .str("tokens_md5")
                .ok_or("coordinator report lacks `tokens_md5`")?
                .to_string(),
            fallbacks,
            raw: report.clone(),
        })
    }
}

/// Median of `v` (mean of the middle two for an even count); NaN if empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// One arm × group-count cell over its repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// The arm.
    pub arm: Arm,
    /// Concurrent groups.
    pub groups: usize,
    /// Runs that finished.
    pub runs: usize,
    /// Median tokens/s over the repeats.
    pub tps_median: f64,
    /// Slowest repeat.
    pub tps_min: f64,
    /// Fastest repeat.
    pub tps_max: f64,
    /// Median over repeats of the per-run p50 ms per token.
    pub ms_p50: f64,
    /// Median over repeats of the per-run p99 ms per token.
    pub ms_p99: f64,
    /// Median coordinator bytes per step.
    pub coordinator_bytes_per_step: f64,
    /// tokens/s median over the hub's median at the same group count.
    pub ratio_vs_hub: Option<f64>,
    /// Runs in which the coordinator used another arm than asked for.
    pub fell_back: usize,
}

/// The cells, in the order of `cells`, from the samples.
pub fn summarize(cells: &[(Arm, usize)], samples: &[Sample]) -> Vec<Cell> {
    let mut out: Vec<Cell> = cells
        .iter()
        .map(|&(arm, groups)| {
            let mine: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.run.arm == arm && s.run.groups == groups)
                .collect();
            let col = |f: fn(&Sample) -> f64| mine.iter().map(|s| f(s)).collect::<Vec<f64>>();
            let tps = col(|s| s.tokens_per_s);
            Cell {
                arm,
                groups,
                runs: mine.len(),
                tps_median: median(&tps),
                tps_min: tps.iter().copied().fold(f64::NAN, f64::min),
                tps_max: tps.iter().copied().fold(f64::NAN, f64::max),
                ms_p50: median(&col(|s| s.ms_p50)),
                ms_p99: median(&col(|s| s.ms_p99)),
                coordinator_bytes_per_step: median(&col(|s| s.coordinator_bytes_per_step)),
                ratio_vs_hub: None,
                fell_back: mine
                    .iter()
                    .filter(|s| s.arm_used != arm.name() || s.fallbacks > 0)
                    .count(),
            }
        })
        .collect();
    let hub: BTreeMap<usize, f64> = out
        .iter()
        .filter(|c| c.arm == Arm::Hub)
        .map(|c| (c.groups, c.tps_median))
        .collect();
    for c in &mut out {
        c.ratio_vs_hub = hub
            .get(&c.groups)
            .filter(|h| **h > 0.0)
            .map(|h| c.tps_median / h)
            .filter(|r| r.is_finite());
    }
    out
}

/// A target of the issue and whether this run met it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// Measured ratio (None when a needed cell was not run).
    pub ratio: Option<f64>,
    /// The ratio to reach.
    pub threshold: f64,
    /// Why the verdict may not count (e.g. not 4 stages).
    pub note: Option<String>,
    /// Why there is no verdict although a ratio exists: an arm of the ratio
    /// fell back to another path, so it did not measure itself.
    pub invalid: Option<String>,
}

impl Target {
    /// Met (Some(true)), missed (Some(false)) or not measured (None).
    pub fn met(&self) -> Option<bool> {
        if self.invalid.is_some() {
            return None;
        }
        self.ratio.map(|r| r >= self.threshold)
    }
}

/// Why a ratio involving `arms` at `groups` measures something else: one
/// of them fell back to another path in some run.
fn fallback_of(cells: &[Cell], arms: &[Arm], groups: usize) -> Option<String> {
    cells
        .iter()
        .filter(|c| arms.contains(&c.arm) && c.groups == groups && c.fell_back > 0)
        .map(|c| {
            format!(
                "{} fell back to another path in {}/{} runs",
                c.arm.name(),
                c.fell_back,
                c.runs
            )
        })
        .reduce(|a, b| format!("{a}; {b}"))
}

fn cell_tps(cells: &[Cell], arm: Arm, groups: usize) -> Option<f64> {
    cells
        .iter()
        .find(|c| c.arm == arm && c.groups == groups && c.runs > 0)
        .map(|c| c.tps_median)
}

fn ratio(cells: &[Cell], num: Arm, den: Arm, groups: usize) -> Option<f64> {
    let (n, d) = (cell_tps(cells, num, groups)?, cell_tps(cells, den, groups)?);
    Some(n / d).filter(|r| r.is_finite() && d > 0.0)
}

/// The issue's targets: direct and engine ≥ 1.5× hub at 4 stages (at one
/// group, else the fewest groups run); engine ≥ 1.3× direct at 3 groups.
pub fn targets(cells: &[Cell], stages: usize) -> Vec<Target> {
    let fewest = cells.iter().map(|c| c.groups).min().unwrap_or(1);
    let stage_note = (stages != 4).then(|| format!("the target is set for 4 stages, ran {stages}"));
    let group_note = |g: usize| (g != 1).then(|| format!("measured at {g} groups"));
    let mut out = Vec::new();
    for arm in [Arm::Direct, Arm::Engine] {
        out.push(Target {
            name: format!("{} >= 1.5x hub tokens/s", arm.name()),
            ratio: ratio(cells, arm, Arm::Hub, fewest),
            threshold: 1.5,
            note: stage_note.clone().or_else(|| group_note(fewest)),
            invalid: fallback_of(cells, &[arm, Arm::Hub], fewest),
        });
    }
    out.push(Target {
        name: "engine >= 1.3x direct at 3 groups".into(),
        ratio: ratio(cells, Arm::Engine, Arm::Direct, 3),
        threshold: 1.3,
        note: None,
        invalid: fallback_of(cells, &[Arm::Engine, Arm::Direct], 3),
    });
    out
}

/// Configurations whose runs disagree on the generated tokens: for each
/// group count, every run's md5 must be the same (arms and repeats
/// compute the same model on the same prompts).
pub fn token_mismatches(samples: &[Sample]) -> Vec<String> {
    let mut by_groups: BTreeMap<usize, BTreeMap<&str, Vec<String>>> = BTreeMap::new();
    for s in samples {
        by_groups
            .entry(s.run.groups)
            .or_default()
            .entry(&s.tokens_md5)
            .or_default()
            .push(format!("{}#{}", s.run.arm.name(), s.run.repeat + 1));
    }
    by_groups
        .iter()
        .filter(|(_, m)| m.len() > 1)
        .map(|(g, m)| {
            let parts: Vec<String> = m
                .iter()
                .map(|(md5, runs)| format!("{md5} ({})", runs.join(" ")))
                .collect();
            format!("groups {g}: {}", parts.join(" vs "))
        })
        .collect()
}

/// The distinct fallback reasons in a coordinator's summary output: its
/// `fallback: boundary N FROM -> TO: REASON` lines without the boundary
/// number (the same reason usually repeats for every boundary), and its
/// count of direct copies that went through the hub.
pub fn fallback_reasons(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in text.lines().map(str::trim) {
        let reason = if let Some(rest) = l.strip_prefix("fallback: boundary ") {
            rest.split_once(' ').map_or(rest, |(_, r)| r).to_string()
        } else if l.starts_with("direct copies that went through the hub") {
            l.to_string()
        } else {
            continue;
        };
        if !out.contains(&reason) {
            out.push(reason);
        }
    }
    out
}

fn bytes(n: f64) -> String {
    if !n.is_finite() {
        "-".into()
    } else if n >= 1_048_576.0 {
        format!("{:.2} MiB", n / 1_048_576.0)
    } else if n >= 1024.0 {
        format!("{:.1} KiB", n / 1024.0)
    } else {
        format!("{n:.0} B")
    }
}

/// The printed table, then the targets.
pub fn table(cells: &[Cell], targets: &[Target]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<7} {:>6} {:>10} {:>19} {:>8} {:>8} {:>12} {:>9}",
        "arm", "groups", "tokens/s", "(min-max)", "ms p50", "ms p99", "coord B/step", "vs hub"
    );
    for c in cells {
        let ratio = c
            .ratio_vs_hub
            .map(|r| format!("{r:.2}x"))
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            t,
            "{:<7} {:>6} {:>10.1} {:>19} {:>8.2} {:>8.2} {:>12} {:>9}",
            c.arm.name(),
            c.groups,
            c.tps_median,
            format!("({:.1}-{:.1})", c.tps_min, c.tps_max),
            c.ms_p50,
            c.ms_p99,
            bytes(c.coordinator_bytes_per_step),
            ratio
        );
        if c.fell_back > 0 {
            let _ = write!(t, "  FELL BACK in {}/{} runs", c.fell_back, c.runs);
        }
        t.push('\n');
    }
    t.push_str("\ntargets:\n");
    for g in targets {
        let verdict = match (g.met(), &g.invalid) {
            (Some(true), _) => "met".to_string(),
            (Some(false), _) => "MISSED".to_string(),
            (None, Some(why)) => format!("NOT MEASURED: {why}"),
            (None, None) => "not measured".to_string(),
        };
        let ratio = g
            .ratio
            .map(|r| format!("{r:.2}x"))
            .unwrap_or_else(|| "-".into());
        let _ = write!(t, "  {:<36} {:>7}  {verdict}", g.name, ratio);
        if let Some(n) = &g.note {
            let _ = write!(t, " ({n})");
        }
        t.push('\n');
    }
    t
}

/// Everything the bench measured, as results.json.
pub fn results_json(
    a: &RpcArgs,
    setup: &[(&str, Json)],
    samples: &[Sample],
    cells: &[Cell],
    targets: &[Target],
    mismatches: &[String],
) -> String {
    let mut o = String::from("{\n\"config\":{");
    let arms: Vec<String> = a.arms.iter().map(|x| json::string(x.name())).collect();
    let groups: Vec<String> = a.groups.iter().map(|g| g.to_string()).collect();
    let m = a.model;
    let _ = write!(
        o,
        "\"stages\":{},\"arms\":[{}],\"repeats\":{},\"rate\":{},\"burst\":{},\"delay\":{},\"groups\":[{}],\
         \"streams\":{},\"tokens\":{},\"prompt_len\":{},\"threads\":{},\"quick\":{},\
         \"model\":{{\"size\":{},\"n_embd\":{},\"n_layer\":{},\"n_head\":{},\"n_head_kv\":{},\
         \"n_ff\":{},\"n_vocab\":{}}},\"hidden_bytes_per_boundary\":{}",
        a.stages,
        arms.join(","),
        a.repeats,
        json::string(&a.rate),
        json::string(&a.burst),
        a.delay
            .as_deref()
            .map(json::string)
            .unwrap_or_else(|| "null".into()),
        groups.join(","),
        a.streams,
        a.tokens,
        a.prompt_len,
        a.threads,
        a.quick,
        json::string(&a.model_name),
        m.n_embd,
        m.layers_per_stage as usize * a.stages,
        m.n_head,
        m.n_head_kv,
        m.n_ff,
        m.n_vocab,
        a.streams * m.n_embd as usize * 4,
    );
    for (k, v) in setup {
        let _ = write!(o, ",{}:", json::string(k));
        v.write(&mut o);
    }
    o.push_str("},\n\"runs\":[");
    for (i, s) in samples.iter().enumerate() {
        let _ = write!(
            o,
            "{}\n{{\"index\":{},\"repeat\":{},\"arm\":{},\"groups\":{},\"report\":",
            if i > 0 { "," } else { "" },
            s.run.index,
            s.run.repeat,
            json::string(s.run.arm.name()),
            s.run.groups
        );
        s.raw.write(&mut o);
        o.push('}');
    }
    o.push_str("],\n\"summary\":[");
    for (i, c) in cells.iter().enumerate() {
        let _ = write!(
            o,
            "{}\n{{\"arm\":{},\"groups\":{},\"runs\":{},\"tokens_per_s_median\":{},\
             \"tokens_per_s_min\":{},\"tokens_per_s_max\":{},\"ms_per_token_p50\":{},\
             \"ms_per_token_p99\":{},\"coordinator_bytes_per_step\":{},\"ratio_vs_hub\":{},\
             \"fell_back\":{}}}",
            if i > 0 { "," } else { "" },
            json::string(c.arm.name()),
            c.groups,
            c.runs,
            json::num(c.tps_median),
            json::num(c.tps_min),
            json::num(c.tps_max),
            json::num(c.ms_p50),
            json::num(c.ms_p99),
            json::num(c.coordinator_bytes_per_step),
            c.ratio_vs_hub
                .map(json::num)
                .unwrap_or_else(|| "null".into()),
            c.fell_back
        );
    }
    o.push_str("],\n\"targets\":[");
    for (i, g) in targets.iter().enumerate() {
        let _ = write!(
            o,
            "{}\n{{\"name\":{},\"ratio\":{},\"threshold\":{},\"met\":{},\"note\":{},\"invalid\":{}}}",
            if i > 0 { "," } else { "" },
            json::string(&g.name),
            g.ratio.map(json::num).unwrap_or_else(|| "null".into()),
            g.threshold,
            g.met()
                .map(|m| m.to_string())
                .unwrap_or_else(|| "null".into()),
            g.note
                .as_deref()
                .map(json::string)
                .unwrap_or_else(|| "null".into()),
            g.invalid
                .as_deref()
                .map(json::string)
                .unwrap_or_else(|| "null".into()),
        );
    }
    let mm: Vec<String> = mismatches.iter().map(|m| json::string(m)).collect();
    let _ = write!(
        o,
        "],\n\"tokens_match\":{},\"token_mismatches\":[{}]\n}}\n",
        mismatches.is_empty(),
        mm.join(",")
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_rpc::schedule::{cells as cell_order, schedule};

    fn report(arm: &str, tps: f64, md5: &str) -> String {
        format!(
            r#"{{"arm":"{arm}","arm_used":"{arm}","stages":4,"streams":4,"groups":1,"tokens":32,
            "tokens_per_s":{tps},"ms_per_token_p50":{p50},"ms_per_token_p99":{p99},
            "request_bytes_per_step":100,"response_bytes_per_step":50,
            "coordinator_bytes_per_step":{cb},"commands_per_step":{{"GRAPH_COMPUTE":4}},
            "tokens_md5":"{md5}","fallbacks":[]}}"#,
            p50 = 1000.0 / tps,
            p99 = 2000.0 / tps,
            cb = if arm == "hub" { 98304 } else { 2048 },
        )
    }

    /// Reports of three repeats of every cell of `tps`, in schedule order.
    fn samples(tps: &[(Arm, usize, [f64; 3])]) -> Result<Vec<Sample>, String> {
        let mut arms: Vec<Arm> = Vec::new();
        let mut groups: Vec<usize> = Vec::new();
        for (a, g, _) in tps {
            if !arms.contains(a) {
                arms.push(*a);
            }
            if !groups.contains(g) {
                groups.push(*g);
            }
        }
        let mut out = Vec::new();
        for run in schedule(&arms, &groups, 3) {
            let (_, _, v) = tps
                .iter()
                .find(|t| t.0 == run.arm && t.1 == run.groups)
                .ok_or("no such cell")?;
            let text = report(
                run.arm.name(),
                v[run.repeat],
                &format!("md5-{}", run.groups),
            );
            out.push(Sample::from_report(run, &json::parse(&text)?)?);
        }
        Ok(out)
    }

    #[test]
    fn fallback_reasons_are_read_once_each() {
        let log = "arm engine (used: direct)\n\
            fallback: boundary 0 engine -> direct: no engine path yet\n\
            fallback: boundary 1 engine -> direct: no engine path yet\n\
            fallback: boundary 2 direct -> hub: 10.0.0.3:1 refused\n\
            direct copies that went through the hub: 3\n";
        assert_eq!(
            fallback_reasons(log),
            [
                "engine -> direct: no engine path yet",
                "direct -> hub: 10.0.0.3:1 refused",
                "direct copies that went through the hub: 3"
            ]
        );
        assert!(fallback_reasons("tokens md5 x\n").is_empty());
    }

    #[test]
    fn medians_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn summary_ratios_and_targets_from_sample_reports() -> Result<(), String> {
        use Arm::*;
        let cells_in = [
            (Hub, 1, [10.0, 12.0, 11.0]),
            (Direct, 1, [20.0, 16.0, 18.0]),
            (Engine, 1, [22.0, 25.0, 24.0]),
            (Hub, 3, [15.0, 15.0, 15.0]),
            (Direct, 3, [30.0, 29.0, 31.0]),
            (Engine, 3, [36.0, 37.0, 35.0]),
        ];
        let s = samples(&cells_in)?;
        assert_eq!(s.len(), 18);
        let cells = summarize(&cell_order(&[Hub, Direct, Engine], &[1, 3]), &s);
        let hub1 = &cells[0];
        assert_eq!(
            (hub1.tps_median, hub1.tps_min, hub1.tps_max),
            (11.0, 10.0, 12.0)
        );
        assert_eq!(hub1.ratio_vs_hub, Some(1.0));
        assert_eq!(hub1.coordinator_bytes_per_step, 98304.0);
        assert!((hub1.ms_p50 - 1000.0 / 11.0).abs() < 1e-9);
        let direct1 = &cells[1];
        assert_eq!(direct1.tps_median, 18.0);
        assert!(
            direct1
                .ratio_vs_hub
                .is_some_and(|r| (r - 18.0 / 11.0).abs() < 1e-12)
        );
        assert_eq!(cells[5].ratio_vs_hub, Some(36.0 / 15.0));
        let t = targets(&cells, 4);
        assert_eq!(t.len(), 3);
        // direct 18/11 = 1.64 >= 1.5 met; engine 24/11 = 2.18 met;
        // engine/direct at 3 groups = 36/30 = 1.2 < 1.3 missed.
        assert_eq!(t[0].met(), Some(true));
        assert_eq!(t[1].met(), Some(true));
        assert_eq!(t[2].met(), Some(false));
        assert_eq!(t[2].ratio, Some(1.2));
        assert!(t.iter().all(|g| g.note.is_none()));
        let table = table(&cells, &t);
        assert!(table.contains("MISSED"), "{table}");
        assert!(table.contains("1.64x"), "{table}");
        assert!(token_mismatches(&s).is_empty());
        let out = results_json(&RpcArgs::default(), &[], &s, &cells, &t, &[]);
        let back = json::parse(&out)?;
        assert_eq!(back.get("config").and_then(|c| c.str("burst")), Some("4kb"));
        assert_eq!(back.num("tokens_match"), None);
        assert_eq!(back.get("tokens_match"), Some(&Json::Bool(true)));
        match back.get("runs") {
            Some(Json::Arr(runs)) => assert_eq!(runs.len(), 18),
            other => assert_eq!(other, Some(&Json::Arr(vec![]))),
        }
        Ok(())
    }

    #[test]
    fn missing_cells_and_other_stage_counts_are_flagged() -> Result<(), String> {
        use Arm::*;
        let s = samples(&[(Hub, 1, [10.0; 3]), (Direct, 1, [14.0; 3])])?;
        let cells = summarize(&cell_order(&[Hub, Direct], &[1]), &s);
        let t = targets(&cells, 3);
        assert_eq!(t[0].met(), Some(false));
        assert!(t[0].note.as_deref().is_some_and(|n| n.contains("4 stages")));
        assert_eq!(t[1].met(), None, "no engine run");
        assert_eq!(t[2].met(), None, "no 3-group run");
        Ok(())
    }

    #[test]
    fn different_tokens_for_one_config_are_reported() -> Result<(), String> {
        use Arm::*;
        let mut s = samples(&[(Hub, 1, [10.0; 3]), (Engine, 1, [14.0; 3])])?;
        s[3].tokens_md5 = "bad".into();
        let m = token_mismatches(&s);
        assert_eq!(m.len(), 1);
        // Schedule order: hub engine | engine hub | hub engine; run 3 is hub#2.
        assert!(m[0].contains("bad (hub#2)"), "{m:?}");
        Ok(())
    }

    #[test]
    fn fallbacks_are_counted_and_bad_reports_refused() -> Result<(), String> {
        let run = schedule(&[Arm::Engine], &[1], 1)[0];
        let text =
            report("engine", 5.0, "x").replace(r#""arm_used":"engine""#, r#""arm_used":"direct""#);
        let s = Sample::from_report(run, &json::parse(&text)?)?;
        let hub_run = schedule(&[Arm::Hub], &[1], 1)[0];
        let hub = Sample::from_report(hub_run, &json::parse(&report("hub", 2.0, "x"))?)?;
        let cells = summarize(&[(Arm::Hub, 1), (Arm::Engine, 1)], &[hub, s]);
        assert_eq!(cells[1].fell_back, 1);
        let t = targets(&cells, 4);
        // engine/hub = 2.5 would meet 1.5, but the engine never ran.
        assert_eq!(t[1].ratio, Some(2.5));
        assert_eq!(t[1].met(), None);
        let text = table(&cells, &t);
        assert!(text.contains("FELL BACK in 1/1"), "{text}");
        assert!(text.contains("NOT MEASURED: engine fell back"), "{text}");
        let broken = json::parse(r#"{"arm_used":"hub","tokens_per_s":1}"#)?;
        assert!(Sample::from_report(run, &broken).is_err());
        Ok(())
    }
}
