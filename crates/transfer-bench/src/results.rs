//! The result schema (written as JSON under `target/bench/`).

use serde::{Deserialize, Serialize};

use crate::stats::Latency;

/// Version of the JSON layout; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// What a figure measures, which decides how ratios read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Metric {
    /// Bytes per second (higher is better).
    Bandwidth,
    /// Operations per second (higher is better).
    Rate,
    /// Round-trip or completion time in µs (lower is better).
    Latency,
    /// CPU time of both processes per operation, in µs (lower is better).
    CpuPerOp,
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Bytes/s, ops/s, or µs (p50) by metric.
    pub value: f64,
    /// Latency distribution, for latency rows.
    pub latency: Option<Latency>,
}

/// One row of the report: the engine next to its baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Sweep name (e.g. `write_bw`).
    pub sweep: String,
    /// Human label of the point (e.g. `1 MiB`, `4 KiB x 100 pages`).
    pub label: String,
    /// Bytes per operation (for plots).
    pub size: u64,
    /// What is measured.
    pub metric: Metric,
    /// The engine's figure.
    pub engine: Figure,
    /// The baseline's name, when there is one.
    pub baseline_name: Option<String>,
    /// The baseline's figure.
    pub baseline: Option<Figure>,
    /// engine / baseline (bandwidth, rate) or engine / baseline (latency).
    pub ratio: Option<f64>,
    /// The target for the ratio, as text (e.g. `>= 0.95`), when the issue sets one.
    pub target: Option<String>,
    /// Whether the data moved was verified.
    pub verified: bool,
    /// False for rows that move no data (barrier, immediate ping-pong):
    /// there is nothing to verify.
    #[serde(default = "moves_data_default")]
    pub moves_data: bool,
    /// Lowest and highest per-repeat ratio when the row is the median of
    /// interleaved repeats (engine, baseline, engine, ...).
    #[serde(default)]
    pub ratio_spread: Option<(f64, f64)>,
    /// Interleaved repeats behind the figures (1 = a single run).
    #[serde(default = "one")]
    pub repeats: u32,
}

fn moves_data_default() -> bool {
    true
}

fn one() -> u32 {
    1
}

impl Row {
    /// Builds a row and computes its ratio.
    pub fn new(sweep: &str, label: String, size: u64, metric: Metric, engine: Figure) -> Self {
        Self {
            sweep: sweep.into(),
            label,
            size,
            metric,
            engine,
            baseline_name: None,
            baseline: None,
            ratio: None,
            target: None,
            verified: false,
            moves_data: true,
            ratio_spread: None,
            repeats: 1,
        }
    }

    /// A row from interleaved repeats: engine and baseline are the medians,
    /// the ratio is the median of the per-repeat ratios and its spread the
    /// lowest and highest of them (what tells a regression from noise).
    pub fn from_repeats(
        sweep: &str,
        label: String,
        size: u64,
        metric: Metric,
        engine: &[f64],
        baseline_name: &str,
        baseline: &[f64],
    ) -> Self {
        let fig = |v| Figure {
            value: v,
            latency: None,
        };
        let mut row = Row::new(sweep, label, size, metric, fig(median(engine)))
            .with_baseline(baseline_name, fig(median(baseline)));
        let ratios: Vec<f64> = engine
            .iter()
            .zip(baseline)
            .filter(|(_, b)| **b > 0.0)
            .map(|(e, b)| e / b)
            .collect();
        if !ratios.is_empty() {
            row.ratio = Some(median(&ratios));
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.ratio_spread = Some((lo, hi));
        }
        row.repeats = u32::try_from(engine.len()).unwrap_or(u32::MAX);
        row
    }

    /// Marks a row that moves no data (nothing to verify).
    pub fn no_data(mut self) -> Self {
        self.moves_data = false;
        self
    }

    /// Attaches a baseline.
    pub fn with_baseline(mut self, name: &str, fig: Figure) -> Self {
        if fig.value > 0.0 && self.engine.value.is_finite() {
            self.ratio = Some(self.engine.value / fig.value);
        }
        self.baseline_name = Some(name.into());
        self.baseline = Some(fig);
        self
    }

    /// Sets the target text.
    pub fn with_target(mut self, t: &str) -> Self {
        self.target = Some(t.into());
        self
    }

    /// Sets the target text when `cond` holds (the issue sets targets for
    /// some points of a sweep only).
    pub fn with_target_if(self, cond: bool, t: &str) -> Self {
        if cond { self.with_target(t) } else { self }
    }

    /// Marks the data as verified.
    pub fn verified(mut self) -> Self {
        self.verified = true;
        self
    }

    /// Whether the ratio meets the target (None when either is missing).
    pub fn meets_target(&self) -> Option<bool> {
        let (ratio, t) = (self.ratio?, self.target.as_deref()?);
        let (op, num) = t.split_once(' ')?;
        let n: f64 = num.parse().ok()?;
        match op {
            ">=" => Some(ratio >= n),
            "<=" => Some(ratio <= n),
            _ => None,
        }
    }
}

/// Median of `v` (mean of the middle two for an even count; NaN if empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// CPU cost of an idle engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleCost {
    /// Seconds observed.
    pub seconds: f64,
    /// CPU time used by the process over that time, as % of one core.
    pub percent_of_core: f64,
    /// The worker idle policy in effect.
    pub policy: String,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// Layout version.
    pub schema: u32,
    /// libfabric provider.
    pub provider: String,
    /// libfabric version string.
    pub libfabric: String,
    /// quick / default / full.
    pub mode: String,
    /// Hosts taking part (`local` for the two-process run).
    pub layout: String,
    /// Rows in sweep order.
    pub rows: Vec<Row>,
    /// Idle engine cost.
    pub idle: Option<IdleCost>,
    /// Measured memcpy bandwidth (bytes/s): this machine's limit for shm.
    pub memcpy_bytes_per_sec: Option<f64>,
    /// Notes (skipped sweeps and why).
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(metric: Metric, engine: f64, base: f64, target: &str) -> Row {
        Row::new(
            "s",
            "p".into(),
            1,
            metric,
            Figure {
                value: engine,
                latency: None,
            },
        )
        .with_baseline(
            "b",
            Figure {
                value: base,
                latency: None,
            },
        )
        .with_target(target)
    }

    #[test]
    fn ratios_and_targets() {
        let r = row(Metric::Bandwidth, 95.0, 100.0, ">= 0.95");
        assert_eq!(r.ratio, Some(0.95));
        assert_eq!(r.meets_target(), Some(true));
        assert_eq!(
            row(Metric::Bandwidth, 90.0, 100.0, ">= 0.95").meets_target(),
            Some(false)
        );
        assert_eq!(
            row(Metric::Latency, 12.0, 10.0, "<= 1.2").meets_target(),
            Some(true)
        );
        assert_eq!(
            row(Metric::Latency, 13.0, 10.0, "<= 1.2").meets_target(),
            Some(false)
        );
        assert_eq!(
            row(Metric::Rate, 1.0, 0.0, ">= 0.9").ratio,
            None,
            "no ratio against a zero baseline"
        );
        let no_target = Row::new(
            "s",
            "p".into(),
            1,
            Metric::Rate,
            Figure {
                value: 1.0,
                latency: None,
            },
        );
        assert_eq!(no_target.meets_target(), None);
    }

    #[test]
    fn repeats_report_medians_and_spread() {
        let r = Row::from_repeats(
            "s",
            "p".into(),
            1,
            Metric::Bandwidth,
            &[10.0, 30.0, 20.0],
            "b",
            &[10.0, 10.0, 40.0],
        );
        assert_eq!(r.engine.value, 20.0);
        assert_eq!(r.baseline.as_ref().map(|b| b.value), Some(10.0));
        assert_eq!(r.ratio, Some(1.0), "median of 1.0, 3.0, 0.5");
        assert_eq!(r.ratio_spread, Some((0.5, 3.0)));
        assert_eq!(r.repeats, 3);
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[1.0, 3.0]), 2.0);
    }

    #[test]
    fn results_round_trip_through_json() {
        let res = Results {
            schema: SCHEMA_VERSION,
            provider: "tcp;ofi_rxm".into(),
            libfabric: "1.17".into(),
            mode: "quick".into(),
            layout: "local".into(),
            rows: vec![row(Metric::Bandwidth, 1.0, 2.0, ">= 0.95").verified()],
            idle: Some(IdleCost {
                seconds: 5.0,
                percent_of_core: 0.1,
                policy: "spin".into(),
            }),
            memcpy_bytes_per_sec: Some(1e10),
            notes: vec!["n".into()],
        };
        let text = serde_json::to_string(&res).map_err(|e| e.to_string());
        let back: Result<Results, String> =
            text.and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()));
        assert_eq!(back, Ok(res.clone()));
        let table = crate::report::table(&res);
        assert!(
            table.contains("MISSED")
                && table.contains("tcp;ofi_rxm")
                && table.contains("idle engine"),
            "{table}"
        );
    }
}
