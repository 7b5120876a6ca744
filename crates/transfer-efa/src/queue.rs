//! Work waiting to be posted: one FIFO per peer, served in turn.
//!
//! A peer that stopped answering (its connection never set up, or its
//! posted writes never completing until the peer timeout) must hold back
//! only its own work. With one shared FIFO, its items at the head made
//! every poll pass spend the post budget on them, and work for live peers
//! behind them waited for the stuck peer's timeout. Per peer, a blocked
//! peer is skipped at no cost, each peer's own order is kept, and peers
//! take turns, so one busy peer cannot starve the others either.

use std::collections::{HashMap, VecDeque};

use transfer_core::PeerId;

use crate::domain::Pending;

#[derive(Default)]
pub(crate) struct PeerQueues {
    queues: HashMap<PeerId, VecDeque<Pending>>,
    /// Peers with queued work, each once, in turn order.
    turns: VecDeque<PeerId>,
    len: usize,
}

impl PeerQueues {
    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether work for `peer` is queued (new work for it must queue behind).
    pub(crate) fn has(&self, peer: PeerId) -> bool {
        self.queues.contains_key(&peer)
    }

    /// Number of peers with queued work.
    pub(crate) fn peers(&self) -> usize {
        self.turns.len()
    }

    fn queue_of(&mut self, peer: PeerId) -> &mut VecDeque<Pending> {
        self.queues.entry(peer).or_insert_with(|| {
            self.turns.push_back(peer);
            VecDeque::new()
        })
    }

    /// Queues `p` behind its peer's other work.
    pub(crate) fn push_back(&mut self, p: Pending) {
        self.queue_of(p.peer()).push_back(p);
        self.len += 1;
    }

    /// Puts `p` back at the head of its peer's work (it was taken and not
    /// posted, or it is a retry that goes first).
    pub(crate) fn push_front(&mut self, p: Pending) {
        self.queue_of(p.peer()).push_front(p);
        self.len += 1;
    }

    /// The peer whose turn it is; it moves to the back of the turns.
    pub(crate) fn next_turn(&mut self) -> Option<PeerId> {
        let peer = self.turns.pop_front()?;
        self.turns.push_back(peer);
        Some(peer)
    }

    /// The head of `peer`'s work.
    pub(crate) fn front(&self, peer: PeerId) -> Option<&Pending> {
        self.queues.get(&peer).and_then(VecDeque::front)
    }

    /// Takes the head of `peer`'s work; a peer left with none leaves the turns.
    pub(crate) fn pop(&mut self, peer: PeerId) -> Option<Pending> {
        let q = self.queues.get_mut(&peer)?;
        let p = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&peer);
            self.turns.retain(|t| *t != peer);
        }
        if p.is_some() {
            self.len -= 1;
        }
        p
    }

    /// Everything queued (any order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.queues.values().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(op: u64, peer: u64) -> Pending {
        Pending::Send {
            op,
            peer: PeerId(peer),
            data: Vec::new(),
        }
    }

    fn op(p: &Pending) -> u64 {
        match p {
            Pending::Write { op, .. } | Pending::Send { op, .. } => *op,
        }
    }

    #[test]
    fn peers_take_turns_and_keep_their_order() {
        let mut q = PeerQueues::default();
        for i in 0..3 {
            q.push_back(send(i, 1));
        }
        q.push_back(send(10, 2));
        q.push_front(send(99, 1));
        assert_eq!((q.peers(), q.iter().count()), (2, 5));
        let mut got = Vec::new();
        while let Some(peer) = q.next_turn() {
            if let Some(p) = q.pop(peer) {
                got.push((peer.0, op(&p)));
            }
        }
        assert_eq!(got, [(1, 99), (2, 10), (1, 0), (1, 1), (1, 2)]);
        assert!(q.is_empty() && !q.has(PeerId(1)) && q.peers() == 0);
    }
}
