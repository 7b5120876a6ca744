//! Resolved peers: AV entries, the address cache, and dead-peer marks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use transfer_core::{PeerId, PeerLoss, Result, TransferError};

use crate::sys;

/// One resolved peer NIC.
pub(crate) struct Peer {
    /// Its AV entry.
    pub(crate) fi_addr: sys::fi_addr_t,
    /// The raw provider address it was resolved from.
    pub(crate) raw: Vec<u8>,
    /// Why it is considered dead, once it is.
    pub(crate) dead: Option<String>,
    /// Connection errors since the last success.
    pub(crate) strikes: u32,
    /// When it last answered (a completion or a non-connection error).
    pub(crate) answered: Option<Instant>,
}

/// Peers of one domain.
#[derive(Default)]
pub(crate) struct Peers {
    next: u64,
    by_id: HashMap<u64, Peer>,
    by_raw: HashMap<Vec<u8>, PeerId>,
}

impl Peers {
    /// The peer already resolved from `raw`, if any.
    pub(crate) fn cached(&self, raw: &[u8]) -> Option<PeerId> {
        self.by_raw.get(raw).copied()
    }

    /// Records a freshly inserted peer.
    pub(crate) fn add(&mut self, raw: &[u8], fi_addr: sys::fi_addr_t) -> PeerId {
        self.next += 1;
        let id = PeerId(self.next);
        self.by_id.insert(
            id.0,
            Peer {
                fi_addr,
                raw: raw.to_vec(),
                dead: None,
                strikes: 0,
                answered: None,
            },
        );
        self.by_raw.insert(raw.to_vec(), id);
        id
    }

    /// Forgets a peer; returns its AV entry.
    pub(crate) fn remove(&mut self, id: PeerId) -> Option<sys::fi_addr_t> {
        let peer = self.by_id.remove(&id.0)?;
        if self.by_raw.get(&peer.raw) == Some(&id) {
            self.by_raw.remove(&peer.raw);
        }
        Some(peer.fi_addr)
    }

    /// The AV entry of a live peer, or why it cannot be used.
    pub(crate) fn fi_addr(&self, call: &'static str, id: PeerId) -> Result<sys::fi_addr_t> {
        match self.by_id.get(&id.0) {
            None => Err(TransferError::PeerUnreachable {
                call,
                cause: PeerLoss::Forgotten,
                reason: format!("peer {} is not resolved on this domain (removed?)", id.0),
            }),
            Some(Peer {
                dead: Some(reason), ..
            }) => Err(TransferError::PeerUnreachable {
                call,
                cause: PeerLoss::Dead,
                reason: reason.clone(),
            }),
            Some(p) => Ok(p.fi_addr),
        }
    }

    /// Marks a peer dead (first reason wins).
    pub(crate) fn mark_dead(&mut self, id: PeerId, reason: String) {
        if let Some(p) = self.by_id.get_mut(&id.0) {
            p.dead.get_or_insert(reason);
        }
    }

    /// Records a connection error; returns true when the peer should now
    /// be considered dead: at once for a refused connection (nobody
    /// listens), else at the second error without a success in between.
    /// One broken connection alone is not death: tcp;ofi_rxm drops a
    /// connection after some refused writes and reconnects on the next one.
    pub(crate) fn strike(&mut self, id: PeerId, refused: bool) -> bool {
        match self.by_id.get_mut(&id.0) {
            Some(p) => {
                p.strikes += 1;
                refused || p.strikes >= 2
            }
            None => false,
        }
    }

    /// The raw address and AV entry of a peer, to reset its connection.
    pub(crate) fn entry(&self, id: PeerId) -> Option<(Vec<u8>, sys::fi_addr_t)> {
        self.by_id.get(&id.0).map(|p| (p.raw.clone(), p.fi_addr))
    }

    /// Points a peer at a new AV entry.
    pub(crate) fn set_fi_addr(&mut self, id: PeerId, fi_addr: sys::fi_addr_t) {
        if let Some(p) = self.by_id.get_mut(&id.0) {
            p.fi_addr = fi_addr;
        }
    }

    /// Records that the peer answered (a success, or an error only a live
    /// peer sends, such as a refused key).
    pub(crate) fn success(&mut self, id: PeerId) {
        if let Some(p) = self.by_id.get_mut(&id.0) {
            p.strikes = 0;
            p.answered = Some(Instant::now());
        }
    }

    /// Whether `id` answered within `limit` before `now`: its connection
    /// moves, so its other operations wait their turn, they are not lost.
    pub(crate) fn answered_within(&self, id: PeerId, now: Instant, limit: Duration) -> bool {
        self.by_id
            .get(&id.0)
            .and_then(|p| p.answered)
            .is_some_and(|t| now.saturating_duration_since(t) <= limit)
    }

    /// Whether the peer is marked dead.
    pub(crate) fn is_dead(&self, id: PeerId) -> bool {
        self.by_id.get(&id.0).is_some_and(|p| p.dead.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_alive_for_the_limit_after_its_last_answer() {
        let mut peers = Peers::default();
        let id = peers.add(b"peer", 0);
        let limit = Duration::from_millis(100);
        // Never answered: nothing vouches for it.
        assert!(!peers.answered_within(id, Instant::now(), limit));
        peers.success(id);
        let now = Instant::now();
        assert!(peers.answered_within(id, now, limit));
        assert!(!peers.answered_within(id, now + 2 * limit, limit));
        // Unknown peers never count as alive.
        assert!(!peers.answered_within(PeerId(id.0 + 1), now, limit));
    }
}
