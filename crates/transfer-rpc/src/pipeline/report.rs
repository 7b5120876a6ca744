//! The summary of a run: what the CLI prints and its one JSON object.

use std::fmt::Write as _;

use super::boundary::{Arm, Fallback};
use super::counters::CounterTable;
use super::groups::GroupsResult;
use super::md5::md5_hex;
use crate::error::{Result, RpcError};
use crate::protocol::Command;

/// Everything a run reports.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Requested arm.
    pub arm: Arm,
    /// Arm actually used: the one name when every boundary of every group
    /// used it, `mixed` otherwise, `none` with a single stage.
    pub arm_used: String,
    /// Stages (servers).
    pub stages: usize,
    /// Streams per group.
    pub streams: u32,
    /// Groups.
    pub groups: usize,
    /// Tokens generated per stream.
    pub tokens: u32,
    /// Generated tokens over all streams and groups per second of decode.
    pub tokens_per_s: f64,
    /// Median step time (one token per stream), ms.
    pub ms_per_token_p50: f64,
    /// 99th percentile step time, ms.
    pub ms_per_token_p99: f64,
    /// Counters per decode step, summed over every connection of every
    /// group (groups step concurrently).
    pub counters: CounterTable,
    /// MD5 of group 0's generated tokens (i32 LE, stream after stream).
    pub tokens_md5: String,
    /// Negotiated fallbacks (all groups).
    pub fallbacks: Vec<Fallback>,
    /// Steps on which a direct copy fell back to the hub (all groups).
    pub runtime_fallbacks: u64,
}

/// Nearest-rank percentile of `v` (`q` in 0..=100).
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

/// Bytes of the token streams as hashed for `tokens_md5`.
pub fn token_bytes(tokens: &[Vec<i32>]) -> Vec<u8> {
    tokens
        .iter()
        .flatten()
        .flat_map(|t| t.to_le_bytes())
        .collect()
}

impl RunReport {
    /// Builds the report; every group must have produced the same tokens
    /// (they ran the same prompts), otherwise that is an error.
    pub fn new(arm: Arm, streams: u32, tokens: u32, r: &GroupsResult) -> Result<RunReport> {
        let Some(first) = r.groups.first() else {
            return Err(RpcError::refused("report", "no group ran"));
        };
        for g in &r.groups[1..] {
            if g.output.tokens != first.output.tokens {
                return Err(RpcError::refused(
                    "report",
                    format!("group {} generated other tokens than group 0", g.group),
                ));
            }
        }
        let mut used: Vec<Arm> = r
            .groups
            .iter()
            .flat_map(|g| g.arms.iter().copied())
            .collect();
        used.sort();
        used.dedup();
        let arm_used = match used.as_slice() {
            [] => "none".to_owned(),
            [one] => one.name().to_owned(),
            _ => "mixed".to_owned(),
        };
        let steps: Vec<f64> = r
            .groups
            .iter()
            .flat_map(|g| g.output.step_secs.iter().map(|s| s * 1e3))
            .collect();
        // Groups step concurrently: a step's counters are summed over the
        // connections of every group.
        let mut counters = first.output.counters.clone();
        for g in &r.groups[1..] {
            counters.sum.merge(&g.output.counters.sum);
        }
        let generated = u64::from(tokens) * u64::from(streams) * r.groups.len() as u64;
        Ok(RunReport {
            arm,
            arm_used,
            stages: first.endpoints.len(),
            streams,
            groups: r.groups.len(),
            tokens,
            tokens_per_s: if r.wall_secs > 0.0 {
                generated as f64 / r.wall_secs
            } else {
                0.0
            },
            ms_per_token_p50: percentile(&steps, 50.0),
            ms_per_token_p99: percentile(&steps, 99.0),
            counters,
            tokens_md5: md5_hex(&token_bytes(&first.output.tokens)),
            fallbacks: r
                .groups
                .iter()
                .flat_map(|g| g.fallbacks.iter().cloned())
                .collect(),
            runtime_fallbacks: r.groups.iter().map(|g| g.output.runtime_fallbacks).sum(),
        })
    }

    /// Hidden-state and other bytes the coordinator moves per step (request
    /// plus response, all commands).
    pub fn coordinator_bytes_per_step(&self) -> f64 {
        let t = self.counters.total_per_step();
        t.request_bytes + t.response_bytes
    }

    /// Human-readable summary (after the counter table).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "arm {} (used: {}), {} stages, {} streams × {} groups, {} tokens each",
            self.arm, self.arm_used, self.stages, self.streams, self.groups, self.tokens
        );
        let _ = writeln!(
            s,
            "{:.1} tokens/s, step p50 {:.3} ms, p99 {:.3} ms, coordinator {:.0} B/step",
            self.tokens_per_s,
            self.ms_per_token_p50,
            self.ms_per_token_p99,
            self.coordinator_bytes_per_step()
        );
        let _ = writeln!(s, "tokens md5 {}", self.tokens_md5);
        for f in &self.fallbacks {
            let _ = writeln!(
                s,
                "fallback: boundary {} {} -> {}: {}",
                f.boundary, f.from, f.to, f.reason
            );
        }
        if self.runtime_fallbacks > 0 {
            let _ = writeln!(
                s,
                "direct copies that went through the hub: {}",
                self.runtime_fallbacks
            );
        }
        s
    }

    /// The one JSON object of `--json`.
    pub fn to_json(&self) -> String {
        let num = |v: f64| {
            if v.is_finite() {
                format!("{v}")
            } else {
                "null".to_owned()
            }
        };
        let mut cmds = String::new();
        for (i, (c, r)) in self.counters.rows().iter().enumerate() {
            if i > 0 {
                cmds.push(',');
            }
            let _ = write!(cmds, "\"{}\":{}", c.name(), num(r.count));
        }
        let t = self.counters.total_per_step();
        format!(
            concat!(
                "{{\"arm\":\"{}\",\"arm_used\":\"{}\",\"stages\":{},\"streams\":{},\"groups\":{},",
                "\"tokens\":{},\"tokens_per_s\":{},\"ms_per_token_p50\":{},\"ms_per_token_p99\":{},",
                "\"request_bytes_per_step\":{},\"response_bytes_per_step\":{},",
                "\"coordinator_bytes_per_step\":{},\"commands_per_step\":{{{}}},",
                "\"tokens_md5\":\"{}\",\"fallbacks\":{}}}"
            ),
            self.arm,
            self.arm_used,
            self.stages,
            self.streams,
            self.groups,
            self.tokens,
            num(self.tokens_per_s),
            num(self.ms_per_token_p50),
            num(self.ms_per_token_p99),
            num(t.request_bytes),
            num(t.response_bytes),
            num(self.coordinator_bytes_per_step()),
            cmds,
            self.tokens_md5,
            self.fallbacks.len() as u64 + self.runtime_fallbacks
        )
    }

    /// Counters per step of one command.
    pub fn commands_per_step(&self, cmd: Command) -> f64 {
        self.counters.per_step(cmd).count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 3.0);
        assert_eq!(percentile(&v, 99.0), 5.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
