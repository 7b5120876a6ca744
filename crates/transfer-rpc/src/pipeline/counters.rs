//! Per-decode-step counters, summed over every connection of the
//! coordinator: commands by type, request bytes and response bytes.

use std::fmt;

use crate::client::{CommandStats, Stats};
use crate::protocol::Command;

/// Counters summed over a number of steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterTable {
    /// Steps added.
    pub steps: u64,
    /// Sum over those steps.
    pub sum: Stats,
}

/// One row: a command type per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerStep {
    /// Commands per step.
    pub count: f64,
    /// Request bytes per step (headers included).
    pub request_bytes: f64,
    /// Response bytes per step (headers included).
    pub response_bytes: f64,
}

impl PerStep {
    fn of(s: CommandStats, steps: u64) -> PerStep {
        let d = steps.max(1) as f64;
        PerStep {
            count: s.count as f64 / d,
            request_bytes: s.request_bytes as f64 / d,
            response_bytes: s.response_bytes as f64 / d,
        }
    }
}

impl CounterTable {
    /// Adds one step (the merged stats of all connections).
    pub fn add_step(&mut self, step: &Stats) {
        self.steps += 1;
        self.sum.merge(step);
    }

    /// Adds another table (e.g. another pipeline group's).
    pub fn merge(&mut self, other: &CounterTable) {
        self.steps += other.steps;
        self.sum.merge(&other.sum);
    }

    /// One command per step.
    pub fn per_step(&self, cmd: Command) -> PerStep {
        PerStep::of(self.sum.get(cmd), self.steps)
    }

    /// All commands per step.
    pub fn total_per_step(&self) -> PerStep {
        PerStep::of(self.sum.total(), self.steps)
    }

    /// Commands that occurred, with their per-step rows.
    pub fn rows(&self) -> Vec<(Command, PerStep)> {
        Command::ALL
            .iter()
            .filter(|c| self.sum.get(**c).count > 0)
            .map(|c| (*c, self.per_step(*c)))
            .collect()
    }
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

impl fmt::Display for CounterTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>10} {:>14} {:>14}   (per decode step, {} steps)",
            "command", "count/step", "request B/step", "response B/step", self.steps
        )?;
        for (c, r) in self.rows() {
            writeln!(
                f,
                "{:<18} {:>10} {:>14} {:>14}",
                c.name(),
                num(r.count),
                num(r.request_bytes),
                num(r.response_bytes)
            )?;
        }
        let t = self.total_per_step();
        write!(
            f,
            "{:<18} {:>10} {:>14} {:>14}",
            "total",
            num(t.count),
            num(t.request_bytes),
            num(t.response_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_step_averages() {
        let mut t = CounterTable::default();
        let mut s = Stats::default();
        s.record(Command::SetTensor, 100, 0);
        s.record(Command::GetTensor, 20, 0);
        s.add_response(Command::GetTensor, 58);
        t.add_step(&s);
        t.add_step(&s);
        assert_eq!(t.per_step(Command::SetTensor).count, 1.0);
        assert_eq!(t.per_step(Command::GetTensor).response_bytes, 58.0);
        assert_eq!(t.total_per_step().request_bytes, 120.0);
        assert_eq!(t.rows().len(), 2);
        let shown = t.to_string();
        assert!(shown.contains("SET_TENSOR") && shown.contains("total"));
    }
}
