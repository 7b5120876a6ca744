//! Immediates held back until the writes they vouch for have landed.
//!
//! transfer-core's plan puts one immediate on the last write of each NIC's
//! share when the domain reports [`transfer_core::Ordering::InOrder`]
//! (instead of one on every write), and the receiver counts that one
//! immediate as "the whole share landed". libfabric's ordering bits cannot
//! promise that here: EFA (SRD) does not order writes at all, and on
//! `tcp;ofi_rxm` a write that met a broken connection is posted again
//! (`data_path::on_error`) after later writes of the same call may already
//! have landed over the new connection; FI_ORDER_RMA_WAW says nothing
//! across two connections. So an in-order domain of this crate holds every
//! write carrying an immediate until each write of its submit call that
//! carries none has completed with FI_DELIVERY_COMPLETE (its bytes are in
//! the target's memory), and only then posts it. That costs one completion
//! round trip per share (a paged write's layer) and needs no ordering from
//! the provider, across reconnects and replacement transmit endpoints alike.
//!
//! Measured (kv workload R4 L32 P64 16 KiB pages, C=0, release, 2 cores at
//! load 10-12, interleaved runs): holding immediates alone (one per layer
//! instead of 64) moved time-to-last-layer from 143/129 to 119/152 ms on
//! shm and 539/437 to 383/492 ms on tcp, i.e. within the noise: the
//! immediates were not the cost, the 8,192 write operations are (see
//! [`crate::posting`], which this makes possible).

use std::collections::HashMap;

use crate::posting::Posting;

/// One submit call's held immediates.
struct Gate {
    /// Writes of the call without an immediate not yet settled.
    open: usize,
    /// Writes with an immediate, in submit order, waiting for `open == 0`.
    held: Vec<Posting>,
}

/// Held immediates of every submit call in flight (at most one entry per
/// call, so bounded by the calls in flight).
#[derive(Default)]
pub(crate) struct Gates {
    map: HashMap<u64, Gate>,
}

impl Gates {
    /// Splits call `op`'s writes: those that may go now are passed to
    /// `post`, in order; a write with an immediate that follows a write
    /// without one is held until [`Gates::settled`] releases it. A write
    /// with an immediate before any without one vouches for nothing
    /// earlier and goes at once.
    pub(crate) fn admit(&mut self, op: u64, writes: &[Posting], mut post: impl FnMut(&Posting)) {
        let mut open = 0;
        let mut held = Vec::new();
        for w in writes {
            match w.head.imm {
                None => {
                    open += 1;
                    post(w);
                }
                Some(_) if open > 0 => held.push(*w),
                Some(_) => post(w),
            }
        }
        if !held.is_empty() {
            self.map.insert(op, Gate { open, held });
        }
    }

    /// A write of call `op` left for good (completed, failed, or dropped
    /// because its call ended): returns the call's held writes, in submit
    /// order, once it was the last write without an immediate. A write that
    /// will be posted again (a retry) has not left.
    pub(crate) fn settled(&mut self, op: u64, write: &Posting) -> Vec<Posting> {
        if write.head.imm.is_some() {
            return Vec::new();
        }
        let Some(gate) = self.map.get_mut(&op) else {
            return Vec::new();
        };
        gate.open = gate.open.saturating_sub(1);
        if gate.open > 0 {
            return Vec::new();
        }
        self.map.remove(&op).map(|g| g.held).unwrap_or_default()
    }

    /// Drops the gates of calls that ended (aborted by a timeout or a dead
    /// peer: their held writes will never be posted).
    pub(crate) fn retain_live(&mut self, live: impl Fn(u64) -> bool) {
        if !self.map.is_empty() {
            self.map.retain(|op, _| live(*op));
        }
    }

    /// Number of calls with held writes.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_core::{DomainMr, PeerId, RemoteKey, WriteOp};

    fn w(at: u64, imm: Option<u32>) -> Posting {
        Posting::single(WriteOp {
            local_mr: DomainMr(1),
            local: std::ptr::null(),
            len: 8,
            peer: PeerId(0),
            remote_addr: at,
            remote_key: RemoteKey(1),
            imm,
        })
    }

    fn admit(g: &mut Gates, op: u64, writes: &[Posting]) -> Vec<u64> {
        let mut now = Vec::new();
        g.admit(op, writes, |w| now.push(w.head.remote_addr));
        now
    }

    #[test]
    fn a_layers_immediate_waits_for_every_page() {
        let mut g = Gates::default();
        let writes = [w(0, None), w(1, None), w(2, None), w(3, Some(7))];
        assert_eq!(admit(&mut g, 1, &writes), [0, 1, 2]);
        assert!(g.settled(1, &writes[1]).is_empty());
        assert!(g.settled(1, &writes[0]).is_empty());
        let released = g.settled(1, &writes[2]);
        assert_eq!(released, [writes[3]]);
        assert_eq!(g.len(), 0);
        // Nothing more for the call.
        assert!(g.settled(1, &writes[2]).is_empty());
    }

    #[test]
    fn immediates_with_nothing_before_them_go_at_once() {
        let mut g = Gates::default();
        let writes = [w(0, Some(1)), w(1, Some(2))];
        assert_eq!(admit(&mut g, 1, &writes), [0, 1]);
        assert_eq!(g.len(), 0);
    }

    #[test]
    fn every_later_immediate_is_held_and_released_in_order() {
        let mut g = Gates::default();
        let writes = [w(0, None), w(1, Some(1)), w(2, None), w(3, Some(2))];
        assert_eq!(admit(&mut g, 4, &writes), [0, 2]);
        // Calls are independent.
        assert_eq!(admit(&mut g, 5, &[w(9, None), w(10, Some(3))]), [9]);
        assert!(g.settled(4, &writes[0]).is_empty());
        assert_eq!(g.settled(4, &writes[2]), [writes[1], writes[3]]);
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn ended_calls_lose_their_gates() {
        let mut g = Gates::default();
        admit(&mut g, 1, &[w(0, None), w(1, Some(1))]);
        admit(&mut g, 2, &[w(0, None), w(1, Some(1))]);
        g.retain_live(|op| op == 2);
        assert_eq!(g.len(), 1);
        assert!(g.settled(1, &w(0, None)).is_empty());
    }
}
