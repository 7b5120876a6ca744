//! Data path of [`super::LibfabricDomain`]: posting with backpressure,
//! the per-peer queues, reading the completion queue.
//!
//! Posting policy (as fabric-lib on EFA): each submit call posts one
//! operation eagerly, so a lone request starts at once; the rest wait in
//! per-peer queues ([`crate::queue`]), drained by up to
//! [`crate::LibfabricConfig::post_batch`] posts per poll pass, peers taking turns.
//! `-FI_EAGAIN` puts the operation back at its peer's head and ends that
//! peer's pass: nothing is ever dropped. A peer may have at most half the
//! send queue posted, so one that stopped answering cannot take the whole
//! queue from the others until its timeout.

use std::time::{Duration, Instant};

use transfer_core::{BackendKind, DomainEvent, OpToken, PeerId, Result, TransferError, WriteOp};

use crate::posting::Posting;

use super::{LibfabricDomain, Pending, PendingRecv};
use crate::context::{SendPayload, SlotKind};
use crate::cq::CqRead;
use crate::mr::MemoryRegistration;
use crate::sys;

/// Why a post did not happen.
pub(super) enum PostError {
    /// The provider's queue is full: retry on a later poll.
    Again,
    /// The operation failed for good.
    Fail(TransferError),
}

/// Delay before a write that met a broken connection is posted again.
const RETRY_DELAY: Duration = Duration::from_millis(20);

/// CQ reads per poll pass (each up to 64 entries), so one pass is bounded.
const CQ_READS_PER_POLL: usize = 8;

impl LibfabricDomain {
    /// What a failed post's return value means: a full queue (retry on a
    /// later poll) or a failure.
    fn post_error(&self, call: &'static str, ret: isize) -> PostError {
        if ret == -(sys::FI_EAGAIN as isize) {
            PostError::Again
        } else {
            PostError::Fail(self.lib.error(call, ret))
        }
    }

    fn post_write(&mut self, op: u64, w: &Posting, retried: bool) -> Result<(), PostError> {
        const CALL: &str = "fi_writemsg";
        let h = &w.head;
        let dest = self.peers.fi_addr(CALL, h.peer).map_err(PostError::Fail)?;
        let desc = self
            .registration(CALL, h.local_mr)
            .map_err(PostError::Fail)?
            .desc();
        let ctx = self.slots.alloc(SlotKind::Write {
            op,
            peer: h.peer,
            write: *w,
            retried,
        });
        let flags = if w.len() == 0 { 0 } else { self.write_flags };
        // SAFETY: every local segment lies inside the live registration of
        // `h.local_mr` (each write was checked at submit; the engine keeps
        // it registered until Completed), `dest` comes from our AV, and
        // `ctx` is a slot that lives until its completion is read or the
        // endpoint is closed (a wedged shm endpoint's slots are abandoned,
        // never reused).
        let ret = unsafe {
            self.tx_ep().write(
                w.local(),
                desc,
                dest,
                w.remote(),
                h.remote_key.0,
                h.imm,
                ctx,
                flags,
            )
        };
        if ret == 0 {
            self.count_posted(h.peer);
            return Ok(());
        }
        self.slots.take(ctx);
        if ret == -(sys::FI_EAGAIN as isize) {
            self.ring(h.peer);
        }
        Err(self.post_error(CALL, ret))
    }

    fn count_posted(&mut self, peer: PeerId) {
        *self.posted_to.entry(peer).or_insert(0) += 1;
        self.ring(peer);
    }

    /// Rings `peer`'s doorbell if it may be blocked (shm peers of this
    /// crate): after a post, and after an EAGAIN (shm's first post to a new
    /// peer waits for that peer to map our region, which only its progress
    /// does).
    fn ring(&mut self, peer: PeerId) {
        if let Some(b) = self.peer_bells.get_mut(&peer) {
            b.ring_if_asleep();
        }
    }

    /// A posted operation to `peer` came back (completion or error).
    pub(super) fn count_returned(&mut self, peer: PeerId) {
        if let Some(n) = self.posted_to.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.posted_to.remove(&peer);
            }
        }
    }

    /// Whether `p` must wait because its peer has `peer_cap` operations
    /// posted. Work that would not reach the provider (its call already
    /// ended or failed, its peer is dead or gone) never waits: it is
    /// settled at once, or a dead peer's queue would never drain.
    fn held_back(&self, p: &Pending) -> bool {
        let peer = p.peer();
        if self.posted_to.get(&peer).copied().unwrap_or(0) < self.peer_cap {
            return false;
        }
        let settles = match p {
            Pending::Write { op, .. } => !self.ops.is_live(*op) || self.ops.has_failed(*op),
            Pending::Send { op, .. } => !self.ops.is_live(*op),
        };
        !settles && self.peers.fi_addr("post", peer).is_ok()
    }

    /// Posts a send; on failure hands the message back.
    fn post_send(
        &mut self,
        op: u64,
        peer: PeerId,
        data: Vec<u8>,
    ) -> Result<(), (PostError, Vec<u8>)> {
        const CALL: &str = "fi_send";
        let dest = match self.peers.fi_addr(CALL, peer) {
            Ok(d) => d,
            Err(e) => return Err((PostError::Fail(e), data)),
        };
        let len = data.len();
        let (buf, desc, payload) = if self.mr_mode & sys::FI_MR_LOCAL == 0 {
            let buf = data.as_ptr();
            (buf, std::ptr::null_mut(), SendPayload::Owned(data))
        } else if let Some((slot, buf, desc)) = self.bounce.as_mut().and_then(|b| b.take(&data)) {
            (buf, desc, SendPayload::Bounce(slot))
        } else {
            let key = self.take_key();
            let ep = (self.mr_mode & sys::FI_MR_ENDPOINT != 0).then_some(&self.ep);
            match MemoryRegistration::register(&self.domain, data.as_ptr(), len.max(1), key, ep) {
                Ok(mr) => {
                    let buf = data.as_ptr();
                    let desc = mr.desc();
                    (buf, desc, SendPayload::Registered(mr, data))
                }
                Err(e) => return Err((PostError::Fail(e), data)),
            }
        };
        let ctx = self.slots.alloc(SlotKind::Send { op, peer, payload });
        // SAFETY: `buf` points into the payload now owned by the slot (a
        // Vec's heap buffer or a bounce slot, neither moves), described by
        // `desc`; the slot lives until the completion.
        let ret = unsafe { self.tx_ep().send(buf, len, desc, dest, ctx) };
        if ret == 0 {
            self.count_posted(peer);
            return Ok(());
        }
        if ret == -(sys::FI_EAGAIN as isize) {
            self.ring(peer);
        }
        let err = self.post_error(CALL, ret);
        let data = match self.slots.take(ctx) {
            Some(SlotKind::Send { payload, .. }) => self.release_payload(payload),
            _ => None,
        };
        Err((err, data.unwrap_or_default()))
    }

    /// Frees a send payload; returns the caller's bytes when it held them.
    fn release_payload(&mut self, payload: SendPayload) -> Option<Vec<u8>> {
        match payload {
            SendPayload::Owned(v) => Some(v),
            SendPayload::Bounce(slot) => {
                if let Some(b) = self.bounce.as_mut() {
                    b.give_back(slot);
                }
                None
            }
            SendPayload::Registered(mr, v) => {
                drop(mr);
                Some(v)
            }
        }
    }

    pub(super) fn post_recv_now(&mut self, r: &PendingRecv) -> Result<(), PostError> {
        const CALL: &str = "fi_recv";
        let desc = self
            .registration(CALL, r.mr)
            .map_err(PostError::Fail)?
            .desc();
        let ctx = self.slots.alloc(SlotKind::Recv(*r));
        // SAFETY: the buffer lies in a live registration (checked by
        // post_recv); the engine keeps it untouched until `Received`.
        let ret = unsafe { self.ep.recv(r.buf, r.len, desc, ctx) };
        if ret == 0 {
            return Ok(());
        }
        self.slots.take(ctx);
        Err(self.post_error(CALL, ret))
    }

    /// A key for a registration where the application chooses keys (no
    /// FI_MR_PROV_KEY: tcp, udp, sockets here). Random, not a counter: the
    /// key is all that stands between a peer and our registered memory on
    /// these providers, so a peer that learned one key must not be able to
    /// name the others. (Falls back to the counter only if the OS cannot
    /// give randomness.) Keys below `next_key` stay for local slabs.
    pub(super) fn take_key(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let random = getrandom::getrandom(&mut b)
            .ok()
            .map(|()| u64::from_le_bytes(b) & self.key_mask)
            .filter(|&k| k >= self.next_key);
        random.unwrap_or_else(|| {
            let k = self.next_key;
            self.next_key += 1;
            k
        })
    }

    /// Write `write` of call `op` left for good (completed, failed, or
    /// dropped with its call): the immediates its call held back until
    /// then go to the head of their peers' queues, in submit order.
    fn write_left(&mut self, op: u64, write: &Posting) {
        if !self.ordered {
            return;
        }
        for w in self.gates.settled(op, write).into_iter().rev() {
            self.queue.push_front(Pending::Write {
                op,
                write: w,
                retried: false,
            });
        }
    }

    fn finish(&mut self, op: u64, result: Result<()>, was_posted: bool) {
        if let Some(ev) = self.ops.finish_one(op, result, was_posted, Instant::now()) {
            self.ready.push(ev);
        }
    }

    /// Posts one queued item; gives it back when the provider said EAGAIN.
    #[must_use = "an item given back must be queued again"]
    fn post_pending(&mut self, pending: Pending) -> Option<Pending> {
        match pending {
            Pending::Write { op, write, retried } => {
                if !self.ops.is_live(op) {
                    self.write_left(op, &write);
                    return None;
                }
                if self.ops.has_failed(op) {
                    self.finish(op, Ok(()), false);
                    self.write_left(op, &write);
                    return None;
                }
                match self.post_write(op, &write, retried) {
                    Ok(()) => {
                        self.ops.posted(op, Instant::now());
                        None
                    }
                    Err(PostError::Again) => Some(Pending::Write { op, write, retried }),
                    Err(PostError::Fail(e)) => {
                        self.finish(op, Err(e), false);
                        self.write_left(op, &write);
                        None
                    }
                }
            }
            Pending::Send { op, peer, data } => {
                if !self.ops.is_live(op) {
                    return None;
                }
                match self.post_send(op, peer, data) {
                    Ok(()) => {
                        self.ops.posted(op, Instant::now());
                        None
                    }
                    Err((PostError::Again, data)) => Some(Pending::Send { op, peer, data }),
                    Err((PostError::Fail(e), _)) => {
                        self.finish(op, Err(e), false);
                        None
                    }
                }
            }
        }
    }

    /// Posts new work at once (so a lone request starts without waiting for
    /// a poll) unless it must queue: its peer already has work waiting
    /// (which goes first), is at its cap, or the provider says EAGAIN.
    pub(super) fn post_or_queue(&mut self, p: Pending) {
        if self.queue.has(p.peer()) || self.held_back(&p) {
            return self.queue.push_back(p);
        }
        if let Some(back) = self.post_pending(p) {
            self.queue.push_front(back);
        }
    }

    /// Posts queued work, up to `limit` items.
    pub(super) fn drain_queue(&mut self, limit: usize) {
        if !self.retries.is_empty() {
            let now = Instant::now();
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            self.retries = later;
            for (_, p) in due {
                self.queue.push_front(p);
            }
        }
        // Peers take turns, one post each. EAGAIN for one peer (e.g. its
        // connection is still being set up, or it stopped answering) and a
        // peer at `peer_cap` end that peer's pass only: its work waits, in
        // order, at no cost to the others' budget. A full send queue makes
        // every post fail, which `limit` bounds.
        let mut blocked: Vec<PeerId> = Vec::new();
        let mut budget = limit;
        let mut idle_turns = 0;
        while budget > 0 && idle_turns < self.queue.peers() {
            let Some(peer) = self.queue.next_turn() else {
                break;
            };
            let held =
                blocked.contains(&peer) || self.queue.front(peer).is_none_or(|p| self.held_back(p));
            if held {
                idle_turns += 1;
                continue;
            }
            let Some(p) = self.queue.pop(peer) else {
                idle_turns += 1;
                continue;
            };
            budget -= 1;
            match self.post_pending(p) {
                Some(back) => {
                    self.queue.push_front(back);
                    blocked.push(peer);
                    idle_turns += 1;
                }
                None => idle_turns = 0,
            }
        }
        while let Some(r) = self.recv_queue.pop_front() {
            match self.post_recv_now(&r) {
                Ok(()) => {}
                Err(PostError::Again) => {
                    self.recv_queue.push_front(r);
                    break;
                }
                // The region went away: the buffer leaves service.
                Err(PostError::Fail(_)) => {}
            }
        }
    }

    fn on_completion(&mut self, e: &sys::fi_cq_data_entry) {
        let kind = self.slots.take(e.op_context);
        let remote_data = e.flags & sys::FI_REMOTE_CQ_DATA != 0;
        let remote_write = e.flags & (sys::FI_RMA | sys::FI_REMOTE_WRITE) != 0;
        match kind {
            None => {
                if remote_data {
                    self.ready.push(DomainEvent::Imm { imm: e.data as u32 });
                }
            }
            Some(SlotKind::Write {
                op, peer, write, ..
            }) => {
                self.count_returned(peer);
                self.peers.success(peer);
                self.finish(op, Ok(()), true);
                self.write_left(op, &write);
            }
            Some(SlotKind::Send { op, payload, peer }) => {
                self.count_returned(peer);
                self.peers.success(peer);
                self.release_payload(payload);
                self.finish(op, Ok(()), true);
            }
            Some(SlotKind::Recv(r)) => {
                if remote_data && remote_write {
                    // A receive consumed by remote CQ data (FI_RX_CQ_DATA
                    // semantics): deliver the immediate, put the buffer back.
                    self.ready.push(DomainEvent::Imm { imm: e.data as u32 });
                    self.recv_queue.push_back(r);
                } else {
                    self.ready.push(DomainEvent::Received {
                        token: r.token,
                        len: e.len,
                    });
                }
            }
        }
        self.last_completion = Instant::now();
    }

    fn on_error(&mut self, e: &sys::fi_cq_err_entry, message: String) {
        let kind = self.slots.take(e.op_context);
        let error = |call| TransferError::Backend {
            call,
            backend: BackendKind::Libfabric,
            code: e.err,
            message: message.clone(),
        };
        match kind {
            Some(SlotKind::Write {
                op,
                peer,
                write,
                retried,
            }) => {
                self.count_returned(peer);
                let broken = self.connection_error(peer, e, &message, "fi_writemsg");
                // A write that met a broken connection is posted once more
                // (tcp;ofi_rxm reconnects on the next operation): writes are
                // idempotent. Not with an immediate, which could then be
                // delivered twice.
                if broken
                    && !retried
                    && write.head.imm.is_none()
                    && !self.peers.is_dead(peer)
                    && self.ops.is_live(op)
                {
                    self.ops.unpost(op);
                    // Not at once: the provider resets the connection when it
                    // processes the disconnect event, during a later progress
                    // call; a retry posted before that meets the dead socket.
                    self.retries.push((
                        Instant::now() + RETRY_DELAY,
                        Pending::Write {
                            op,
                            write,
                            retried: true,
                        },
                    ));
                } else {
                    self.finish(op, Err(error("fi_writemsg")), true);
                    self.write_left(op, &write);
                }
            }
            Some(SlotKind::Send { op, peer, payload }) => {
                self.count_returned(peer);
                self.release_payload(payload);
                let _ = self.connection_error(peer, e, &message, "fi_send");
                self.finish(op, Err(error("fi_send")), true);
            }
            // The trait has no receive-failure event: a failed receive
            // (e.g. truncation) loses that message, and the buffer goes
            // back into service. Cancelled receives are not reposted.
            Some(SlotKind::Recv(r)) if e.err != libc::ECANCELED => {
                self.recv_queue.push_back(r);
            }
            Some(SlotKind::Recv(_)) | None => {}
        }
        self.last_completion = Instant::now();
    }

    pub(super) fn read_cq(&mut self) {
        let mut buf = std::mem::take(&mut self.cq_buf);
        for _ in 0..CQ_READS_PER_POLL {
            match self.cq.read(&mut buf) {
                CqRead::Entries(n) => {
                    for e in buf.iter().take(n) {
                        self.on_completion(e);
                    }
                    if n < buf.len() {
                        break;
                    }
                }
                CqRead::Empty => break,
                CqRead::ErrorAvailable => match self.cq.read_error() {
                    Some((e, msg)) => self.on_error(&e, msg),
                    None => break,
                },
                CqRead::Failed => break,
            }
        }
        self.cq_buf = buf;
    }

    pub(super) fn fail_now(&mut self, op: OpToken, error: TransferError) {
        self.ready.push(DomainEvent::Completed {
            op,
            result: Err(error),
        });
    }

    pub(super) fn check_write(&self, w: &WriteOp) -> Result<()> {
        const CALL: &str = "submit_writes";
        self.peers.fi_addr(CALL, w.peer)?;
        let mr = self.registration(CALL, w.local_mr)?;
        if w.len > 0 && !mr.contains(w.local as usize, w.len) {
            return Err(TransferError::invalid(
                CALL,
                format!(
                    "local span of {} bytes lies outside its registration",
                    w.len
                ),
            ));
        }
        if w.len as u64 > self.max_write {
            return Err(TransferError::invalid(
                CALL,
                format!(
                    "write of {} bytes exceeds the provider's {}",
                    w.len, self.max_write
                ),
            ));
        }
        Ok(())
    }
}
