//! Per-command counters (commands, request bytes, response bytes).

use std::collections::BTreeMap;
use std::fmt;

use crate::protocol::Command;

/// Counters for one command type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandStats {
    /// Commands sent.
    pub count: u64,
    /// Request bytes on the wire (headers included).
    pub request_bytes: u64,
    /// Response bytes on the wire (headers included).
    pub response_bytes: u64,
}

/// Counters by command; reset with [`Stats::take`] to get per-step tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    by_command: BTreeMap<Command, CommandStats>,
}

impl Stats {
    /// Records one command.
    pub fn record(&mut self, cmd: Command, request_bytes: u64, response_bytes: u64) {
        let s = self.by_command.entry(cmd).or_default();
        s.count += 1;
        s.request_bytes += request_bytes;
        s.response_bytes += response_bytes;
    }

    /// Adds response bytes to the last-recorded entry for `cmd`.
    pub fn add_response(&mut self, cmd: Command, bytes: u64) {
        self.by_command.entry(cmd).or_default().response_bytes += bytes;
    }

    /// Counters of one command.
    pub fn get(&self, cmd: Command) -> CommandStats {
        self.by_command.get(&cmd).copied().unwrap_or_default()
    }

    /// Sum over all commands.
    pub fn total(&self) -> CommandStats {
        self.by_command
            .values()
            .fold(CommandStats::default(), |a, s| CommandStats {
                count: a.count + s.count,
                request_bytes: a.request_bytes + s.request_bytes,
                response_bytes: a.response_bytes + s.response_bytes,
            })
    }

    /// Returns the counters and resets them.
    pub fn take(&mut self) -> Stats {
        std::mem::take(self)
    }

    /// Adds another table into this one.
    pub fn merge(&mut self, other: &Stats) {
        for (c, s) in &other.by_command {
            let e = self.by_command.entry(*c).or_default();
            e.count += s.count;
            e.request_bytes += s.request_bytes;
            e.response_bytes += s.response_bytes;
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>8} {:>14} {:>14}",
            "command", "count", "req bytes", "resp bytes"
        )?;
        for (c, s) in &self.by_command {
            writeln!(
                f,
                "{:<18} {:>8} {:>14} {:>14}",
                c.name(),
                s.count,
                s.request_bytes,
                s.response_bytes
            )?;
        }
        let t = self.total();
        write!(
            f,
            "{:<18} {:>8} {:>14} {:>14}",
            "total", t.count, t.request_bytes, t.response_bytes
        )
    }
}
