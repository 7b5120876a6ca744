//! Sharing a device between sessions.
//!
//! Two parts: a bound on the work one graph may ask for
//! ([`graph_work`], capped by `ServerConfig::max_graph_work`), so that no
//! graph keeps a device for long; and a first-come, first-served queue per
//! device ([`DeviceQueue`]), so that sessions take turns graph by graph. A
//! session sends its frames one after another and has at most one graph
//! waiting, so first come, first served is round-robin between the
//! sessions that want the device: a session that floods GRAPH_RECOMPUTE
//! gets one graph in, then every other waiting session gets one, and a
//! one-node graph waits at most one bounded graph per session ahead of it.
//! (A plain mutex lets the thread that just released it take it again
//! before a sleeping waiter wakes: measured, the flooding session kept the
//! device and the other's graph waited for the whole flood.)

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Result, RpcError};
use crate::validate::ValidatedGraph;

/// Default `ServerConfig::max_graph_work`: 2^47 ≈ 1.4e14 element
/// operations, about a 70B-parameter model's forward pass over 1,000
/// tokens in one graph; minutes of CPU at most.
pub const DEFAULT_MAX_GRAPH_WORK: u64 = 1 << 47;

fn elements(ne: [u32; 4]) -> u128 {
    ne.iter().map(|&d| u128::from(d)).product()
}

/// Estimated element operations of one execution of `g`: per listed node
/// (a node listed twice counts twice), what it reads and writes, and for
/// ops that contract a dimension (matrix products, attention,
/// convolutions, scans), the output times the contracted length.
/// Saturates at `u64::MAX`.
pub fn graph_work(g: &ValidatedGraph) -> u64 {
    let mut total: u128 = 0;
    for &n in &g.nodes {
        let Some(t) = g.tensors.get(n) else { continue };
        let src = |k: usize| -> Option<[u32; 4]> {
            let i = g.srcs.get(n)?.get(k).copied()??;
            g.tensors.get(i).map(|s| s.ne)
        };
        let out = elements(t.ne);
        let mut work = out;
        for k in 0..g.srcs.get(n).map_or(0, |s| s.len()) {
            work = work.saturating_add(src(k).map_or(0, elements));
        }
        let s0 = src(0).unwrap_or([1; 4]);
        let contracted: u128 = match t.op {
            // MUL_MAT, MUL_MAT_ID: over src0's rows.
            29 | 30 => u128::from(s0[0]),
            // OUT_PROD: over src0's columns.
            31 => u128::from(s0[1]),
            // FLASH_ATTN_EXT / _BACK: over the keys (src1's rows), twice
            // (scores and values); backward three times.
            74 => 2 * u128::from(src(1).map_or(1, |k| k[1])),
            75 => 3 * u128::from(src(1).map_or(1, |k| k[1])),
            // Convolutions: over one output channel's kernel.
            51 | 56..=59 => elements(s0) / u128::from(s0[3].max(1)),
            // SSM_SCAN: over the state size (src3 = A, [d_state, ...]).
            77 => u128::from(src(3).map_or(1, |a| a[0])),
            // Linear-attention scans and triangular solves: over a head
            // (src0's rows).
            82..=86 => u128::from(s0[0]),
            // Sorts: log2 of the row.
            69 | 70 => u128::from(32 - s0[0].max(1).leading_zeros()),
            _ => 0,
        };
        work = work.saturating_add(out.saturating_mul(contracted));
        total = total.saturating_add(work);
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Refuses a graph whose [`graph_work`] is over `cap`.
pub fn check_work(call: &'static str, work: u64, cap: u64) -> Result<()> {
    if work > cap {
        return Err(RpcError::refused(
            call,
            format!(
                "the graph asks for ~{work} element operations, over this server's \
                 --max-graph-work of {cap}"
            ),
        ));
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Line {
    /// Next ticket to hand out.
    next: u64,
    /// Ticket whose holder has the device (or may take it now).
    serving: u64,
    /// Tickets whose holders stopped waiting (skipped when reached). At
    /// most one per waiting session.
    gone: BTreeSet<u64>,
}

/// One device's first-come, first-served turns.
#[derive(Debug, Default)]
pub struct DeviceQueue {
    line: Mutex<Line>,
    turn: Condvar,
}

/// Holding the device; the next in line gets it on drop.
#[derive(Debug)]
pub struct DeviceTurn<'a> {
    queue: &'a DeviceQueue,
}

impl DeviceQueue {
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits (at most `wait`) for this caller's turn on the device.
    pub fn acquire(&self, call: &'static str, wait: Duration) -> Result<DeviceTurn<'_>> {
        let deadline = Instant::now() + wait;
        let mut line = self.lock();
        let ticket = line.next;
        line.next += 1;
        loop {
            if line.serving == ticket {
                return Ok(DeviceTurn { queue: self });
            }
            let now = Instant::now();
            if now >= deadline {
                line.gone.insert(ticket);
                return Err(RpcError::refused(
                    call,
                    format!(
                        "the device stayed busy with other sessions' graphs for {} s",
                        wait.as_secs_f32()
                    ),
                ));
            }
            line = self
                .turn
                .wait_timeout(line, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Sessions waiting for the device (not counting its holder).
    pub fn waiting(&self) -> u64 {
        let line = self.lock();
        (line.next - line.serving).saturating_sub(1 + line.gone.len() as u64)
    }
}

impl Drop for DeviceTurn<'_> {
    fn drop(&mut self) {
        let mut line = self.queue.lock();
        line.serving += 1;
        loop {
            let next = line.serving;
            if !line.gone.remove(&next) {
                break;
            }
            line.serving += 1;
        }
        // Nobody in line (the usual case: one session per device): no
        // wake-up call (a `futex` system call per graph, strace).
        let waiting = line.next > line.serving;
        drop(line);
        if waiting {
            self.queue.turn.notify_all();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn turns_go_in_arrival_order_and_skip_those_who_left() {
        let q = Arc::new(DeviceQueue::default());
        let first = q.acquire("t", Duration::from_secs(1)).unwrap();
        // A waiter that gives up does not block the line.
        assert!(q.acquire("t", Duration::from_millis(20)).is_err());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for i in 0..3 {
            let (mine, order) = (Arc::clone(&q), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                let _t = mine.acquire("t", Duration::from_secs(10)).unwrap();
                order.lock().unwrap().push(i);
            }));
            // Each queues before the next starts.
            while q.waiting() < i + 1 {
                std::thread::yield_now();
            }
        }
        drop(first);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert!(q.acquire("t", Duration::ZERO).is_ok(), "free again");
    }
}
