//! Connection management of [`super::LibfabricDomain`]: connection
//! errors counted per peer, a broken connection reset (a fresh AV entry),
//! a dead peer's calls failed at once, calls without progress timed out,
//! and shm's wedged transmit endpoint replaced.
//!
//! The shm wedge (libfabric 1.17.0, measured with a C program against the
//! installed library; the same code is in v1.18.0..v1.22.0): when the
//! target refuses a delivery-complete write (wrong key, range outside the
//! region), its `smr_progress_cmd_rma` returns at the failed
//! `ofi_mr_map_verify` without writing the response the writer waits for.
//! The writer's endpoint never gets past it: the refused write never
//! completes; for a small (SAR) write the peer's `sar_status` stays set and
//! every later `fi_writemsg` to that peer returns `-FI_EAGAIN`; and
//! `smr_progress_resp` stops at the unanswered response at the head of the
//! endpoint's response queue, so no later write or send of that endpoint,
//! to any peer, completes. A new endpoint on the same domain, AV and CQ
//! writes to the same peer at once. So when a call times out on shm and its
//! peers' endpoints are still there (process running, region in
//! /dev/shm), the domain opens a fresh transmit endpoint and
//! fails what was posted on the wedged one (its outcome is unknown: the
//! target may have placed it), instead of marking live peers dead; the
//! first endpoint keeps receiving, so the published address stays valid.

use std::time::{Duration, Instant};

use transfer_core::{PeerId, PeerLoss, TransferError};

use super::{LibfabricDomain, Pending};
use crate::context::SlotKind;
use crate::endpoint::Endpoint;
use crate::sys;

/// Transmit endpoints one shm domain may replace; past that, a call that
/// times out marks its peers dead as on every other provider (each wedged
/// endpoint stays open with what was posted on it).
pub(crate) const MAX_TX_REPLACEMENTS: usize = 16;

/// Whether the endpoint behind an shm address of this crate's naming
/// (`fi_shm://trx<pid>-...`, see `LibfabricDomain::open`) is still there:
/// its process runs (not a zombie) and its region is still in /dev/shm (a
/// dropped domain removes it). False for any other name.
fn shm_peer_alive(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some(name) = text.trim_end_matches('\0').strip_prefix("fi_shm://") else {
        return false;
    };
    let Some(pid) = name
        .strip_prefix("trx")
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    if name.contains('/') || !std::path::Path::new("/dev/shm").join(name).exists() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, tail)| tail.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X')),
        Err(_) => false,
    }
}

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

    /// The endpoint writes and sends are posted on.
    pub(super) fn tx_ep(&mut self) -> &mut Endpoint {
        self.tx.as_mut().unwrap_or(&mut self.ep)
    }

    /// Whether a call that timed out toward `peers` may be shm's transmit
    /// wedge rather than dead peers: shm, a replacement left, no
    /// endpoint-bound registrations, and every peer's endpoint still there.
    fn shm_wedge_suspected(&self, peers: &[PeerId]) -> bool {
        self.shm_name.is_some()
            && self.tx_replacements < MAX_TX_REPLACEMENTS
            && self.mr_mode & sys::FI_MR_ENDPOINT == 0
            && !peers.is_empty()
            && peers.iter().all(|&p| {
                self.peers
                    .entry(p)
                    .is_some_and(|(raw, _)| shm_peer_alive(&raw))
            })
    }

    /// Opens a fresh transmit endpoint (a name of its own, the same domain,
    /// CQ and AV) and fails every write and send posted on the wedged one.
    fn replace_tx(&mut self) -> transfer_core::Result<()> {
        let Some(name) = self.shm_name.clone() else {
            return Err(TransferError::invalid(
                "replace the transmit endpoint",
                "not an shm domain",
            ));
        };
        let n = self.tx_replacements + 1;
        self.info
            .set_src_addr_str(&format!("fi_shm://{name}-tx{n}"))?;
        let fresh = Endpoint::open(&self.domain, &self.info, &self.cq, &self.av)?;
        self.tx_replacements = n;
        if let Some(old) = self.tx.replace(fresh) {
            self.wedged.push(old);
        }
        let stuck = self
            .slots
            .abandon(|k| matches!(k, SlotKind::Write { .. } | SlotKind::Send { .. }));
        for kind in &stuck {
            let (SlotKind::Write { op, peer, .. } | SlotKind::Send { op, peer, .. }) = kind else {
                continue;
            };
            self.count_returned(*peer);
            let err = TransferError::unreachable(
                "libfabric transfer",
                PeerLoss::Reconnecting,
                "shm: a write the target refused wedged this endpoint's completions; this \
                 operation's outcome is unknown, later ones go through a fresh endpoint",
            );
            if let Some(ev) = self.ops.abort(*op, err) {
                self.ready.push(ev);
            }
        }
        self.abandoned.extend(stuck);
        Ok(())
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
            // Aborted meanwhile (by a transmit endpoint replacement).
            if !self.ops.is_live(id) {
                continue;
            }
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
                        Pending::Write { op, write, .. } if *op == id => Some(write.head.peer),
                        Pending::Send { op, peer, .. } if *op == id => Some(*peer),
                        _ => None,
                    })
                    .collect();
            }
            peers.sort_unstable_by_key(|p| p.0);
            peers.dedup();
            // A call whose every peer answered within the limit is queued
            // behind that peer's earlier work, not lost: on a slow link
            // (netns hosts shaped to 1 Gbit/s, 82 MB/s measured) a
            // trainer's 16 MiB tensor writes to four peers completed more
            // than 5 s after they were posted, and the weights workload
            // failed with "no completion within 5000 ms" while every
            // connection was moving. A peer that stops answering still
            // times out `limit` after its last answer.
            if !peers.is_empty()
                && peers
                    .iter()
                    .all(|p| self.peers.answered_within(*p, now, limit))
            {
                continue;
            }
            let err = TransferError::Timeout {
                call: "libfabric transfer",
                millis,
            };
            if let Some(ev) = self.ops.abort(id, err) {
                self.ready.push(ev);
            }
            let why = if self.shm_wedge_suspected(&peers) {
                match self.replace_tx() {
                    Ok(()) => continue,
                    Err(e) => format!("; replacing the wedged shm endpoint failed: {e}"),
                }
            } else {
                String::new()
            };
            for p in peers {
                self.kill_peer(p, format!("no completion within {millis} ms{why}"));
            }
        }
    }
}
