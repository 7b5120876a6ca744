//! Connection management of [`super::LibfabricDomain`]: connection
//! errors counted per peer, a broken connection reset (a fresh AV entry),
//! a dead peer's calls failed at once, and calls without progress timed out.

use std::time::{Duration, Instant};

use transfer_core::{PeerId, PeerLoss, TransferError};

use super::{LibfabricDomain, Pending};
use crate::context::SlotKind;
use crate::sys;

/// Error codes that mean the peer cannot be reached any more.
fn is_connection_error(code: i32) -> bool {
    [
        libc::ECONNREFUSED,
        libc::ECONNRESET,
        libc::ECONNABORTED,
        libc::EHOSTUNREACH,
        libc::EHOSTDOWN,
        libc::ENETUNREACH,
        libc::ETIMEDOUT,
        libc::ENOTCONN,
        libc::EPIPE,
    ]
    .contains(&code)
}

impl LibfabricDomain {
    /// Counts a connection error against `peer`, killing it when
    /// [`crate::peer::Peers::strike`] says so. Returns whether `e` was a
    /// connection error.
    pub(super) fn connection_error(
        &mut self,
        peer: PeerId,
        e: &sys::fi_cq_err_entry,
        message: &str,
        call: &str,
    ) -> bool {
        if !(is_connection_error(e.err) || is_connection_error(e.prov_errno)) {
            // Any other error (e.g. a refused key) is an answer: the peer lives.
            self.peers.success(peer);
            return false;
        }
        let refused = e.err == libc::ECONNREFUSED || e.prov_errno == libc::ECONNREFUSED;
        if self.peers.strike(peer, refused) {
            self.kill_peer(peer, format!("{call}: {message}"));
        } else {
            self.reset_connection(peer);
        }
        true
    }

    /// Replaces a peer's AV entry with a fresh one: connection-oriented
    /// providers (tcp;ofi_rxm) drop the broken connection with the old
    /// entry and connect anew on the next operation.
    fn reset_connection(&mut self, peer: PeerId) {
        let Some((raw, old)) = self.peers.entry(peer) else {
            return;
        };
        let _ = self.av.remove(old);
        match self.av.insert(&raw) {
            Ok(new) => self.peers.set_fi_addr(peer, new),
            Err(e) => self.kill_peer(peer, format!("reconnect: {e}")),
        }
    }

    /// Marks a peer dead and fails every call with work posted to it.
    pub(super) fn kill_peer(&mut self, peer: PeerId, reason: String) {
        if self.peers.is_dead(peer) {
            return;
        }
        self.peers.mark_dead(peer, reason.clone());
        let ops: Vec<u64> = self
            .slots
            .posted()
            .filter_map(|k| match k {
                SlotKind::Write { op, peer: p, .. } | SlotKind::Send { op, peer: p, .. }
                    if *p == peer =>
                {
                    Some(*op)
                }
                _ => None,
            })
            .collect();
        for op in ops {
            let err =
                TransferError::unreachable("libfabric transfer", PeerLoss::Dead, reason.clone());
            if let Some(ev) = self.ops.abort(op, err) {
                self.ready.push(ev);
            }
        }
    }

    pub(super) fn check_timeouts(&mut self) {
        let now = Instant::now();
        let limit = self.config.peer_timeout;
        let every = (limit / 8).min(Duration::from_millis(50));
        if now.saturating_duration_since(self.last_timeout_check) < every || self.ops.is_empty() {
            return;
        }
        self.last_timeout_check = now;
        let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        for id in self.ops.overdue(now, limit, self.last_completion) {
            // Peers with work of this call in flight, or, when nothing of it
            // could be posted while the domain made no progress at all, the
            // peers it waits for in the queue.
            let mut peers: Vec<PeerId> = self
                .slots
                .posted()
                .filter_map(|k| match k {
                    SlotKind::Write { op, peer, .. } | SlotKind::Send { op, peer, .. }
                        if *op == id =>
                    {
                        Some(*peer)
                    }
                    _ => None,
                })
                .collect();
            if peers.is_empty() {
                peers = self
                    .queue
                    .iter()
                    .filter_map(|p| match p {
                        Pending::Write { op, write, .. } if *op == id => Some(write.peer),
                        Pending::Send { op, peer, .. } if *op == id => Some(*peer),
                        _ => None,
                    })
                    .collect();
            }
            peers.sort_unstable_by_key(|p| p.0);
            peers.dedup();
            let err = TransferError::Timeout {
                call: "libfabric transfer",
                millis,
            };
            if let Some(ev) = self.ops.abort(id, err) {
                self.ready.push(ev);
            }
            for p in peers {
                self.kill_peer(p, format!("no completion within {millis} ms"));
            }
        }
    }
}
