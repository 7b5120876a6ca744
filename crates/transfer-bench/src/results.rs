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
        }
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
