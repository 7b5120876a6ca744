//! Data path of [`super::VerbsDomain`]: queueing work per peer, posting
//! chains within send-queue and completion-queue room, reaping
//! completions, and the receive queues.

use transfer_core::{DomainEvent, PeerId, PeerLoss, RecvToken, Result, TransferError};

use super::{RECV_CHAIN, VerbsDomain};
use crate::error::{ConnFate, errno_error, post_is_backpressure, wc_error, wc_fate};
use crate::peer::{Entry, MSG, State};
use crate::rdma_op::{Work, WorkKind, must_signal, wr_id};
use crate::sys::{self, datapath, ibv_recv_wr, ibv_sge, ibv_wc};
use crate::trace::trace;

impl VerbsDomain {
    pub(super) fn cq_room(&self) -> usize {
        self.cq_depth
            .saturating_sub(self.msg_posted + self.rma_posted + self.sq_total)
    }

    /// Queues work for a peer; starts a connection if it has none.
    pub(super) fn enqueue(&mut self, peer: PeerId, ci: usize, works: &[Work]) -> Result<()> {
        let Some(mut p) = self.peers.remove(&peer.0) else {
            return Err(TransferError::invalid("verbs submit", "unknown peer id"));
        };
        let r = match &p.state {
            State::Dead(e) => Err(e.clone()),
            State::Idle => {
                let err = TransferError::unreachable(
                    "verbs connection",
                    PeerLoss::Reconnecting,
                    "reconnecting",
                );
                self.reconnect(peer.0, &mut p, &err);
                Ok(())
            }
            State::Connecting | State::Ready => Ok(()),
        };
        if r.is_ok() {
            match p.chans.as_mut() {
                Some(c) => c[ci].pending.extend(works.iter().copied()),
                None => {
                    let e = match &p.state {
                        State::Dead(e) => e.clone(),
                        _ => TransferError::unreachable(
                            "verbs submit",
                            PeerLoss::Reconnecting,
                            "no connection",
                        ),
                    };
                    self.peers.insert(peer.0, p);
                    return Err(e);
                }
            }
        }
        self.peers.insert(peer.0, p);
        r
    }

    /// Posts queued work of a connected peer, in chains of `chain_len`,
    /// within send-queue and completion-queue room.
    pub(super) fn progress(&mut self, pid: u64) {
        let Some(mut p) = self.peers.remove(&pid) else {
            return;
        };
        let mut failure = None;
        if p.state == State::Ready {
            if let Some(chans) = p.chans.as_mut() {
                'chans: for ch in chans.iter_mut() {
                    while !ch.pending.is_empty() {
                        let room_sq = self.sq_depth.saturating_sub(ch.sq_used);
                        let n = self
                            .chain
                            .capacity()
                            .min(ch.pending.len())
                            .min(room_sq)
                            .min(self.cq_room());
                        if n == 0 {
                            break;
                        }
                        self.chain.clear();
                        self.sigs.clear();
                        let mut run = ch.run;
                        for (i, w) in ch.pending.iter().take(n).enumerate() {
                            let sig = must_signal(
                                w.last,
                                run,
                                self.cfg.signal_interval,
                                ch.sq_used + i + 1,
                                self.sq_depth,
                            );
                            let seq = self.next_seq;
                            self.next_seq += 1;
                            self.chain.push(w, seq, sig);
                            self.sigs.push((sig, seq));
                            run = if sig { 0 } else { run + 1 };
                        }
                        let mut bad = std::ptr::null_mut();
                        // SAFETY: live QP; the chain's WRs and SGEs are valid
                        // and linked; local buffers are registered memory the
                        // engine keeps alive until the op completes.
                        let rc = unsafe {
                            datapath::post_send(ch.qp.as_ptr(), self.chain.head(), &mut bad)
                        };
                        let posted = if rc == 0 {
                            n
                        } else {
                            self.chain.index_of(bad).unwrap_or(0)
                        };
                        for &(sig, seq) in self.sigs.iter().take(posted) {
                            let Some(w) = ch.pending.pop_front() else {
                                break;
                            };
                            ch.sq_used += 1;
                            self.sq_total += 1;
                            ch.partial = if w.last { None } else { Some(w.op) };
                            if sig {
                                ch.outstanding.push_back(Entry {
                                    seq,
                                    wrs: ch.run + 1,
                                    done: w.last.then_some(w.op),
                                    release: match w.kind {
                                        WorkKind::Send { buf } => Some(buf),
                                        WorkKind::Write { .. } => None,
                                    },
                                });
                                ch.run = 0;
                            } else {
                                ch.run += 1;
                            }
                        }
                        if rc != 0 {
                            if !post_is_backpressure(rc) {
                                failure = Some(errno_error("ibv_post_send", rc.abs()));
                            }
                            break 'chans;
                        }
                    }
                }
            }
        }
        if let Some(e) = failure {
            trace!("peer {pid}: post failed: {e}");
            self.reconnect(pid, &mut p, &e);
            self.send_hello(&p, false);
        }
        let left = p.state == State::Ready
            && p.chans
                .as_ref()
                .is_some_and(|c| c.iter().any(|ch| !ch.pending.is_empty()));
        if left {
            self.blocked.insert(pid);
        } else {
            self.blocked.remove(&pid);
        }
        self.peers.insert(pid, p);
    }

    pub(super) fn complete_entries(&mut self, pid: u64, ci: usize, seq: u64) {
        let mut done = Vec::new();
        {
            let Some(ch) = self
                .peers
                .get_mut(&pid)
                .and_then(|p| p.chans.as_mut())
                .map(|c| &mut c[ci])
            else {
                return;
            };
            if seq < ch.first_seq {
                return;
            }
            while ch.outstanding.front().is_some_and(|e| e.seq <= seq) {
                let Some(e) = ch.outstanding.pop_front() else {
                    break;
                };
                ch.sq_used = ch.sq_used.saturating_sub(e.wrs);
                self.sq_total = self.sq_total.saturating_sub(e.wrs);
                done.push((e.done, e.release));
            }
        }
        for (op, buf) in done {
            if let Some(b) = buf {
                self.release_buf(b);
            }
            if let Some(op) = op {
                self.batch_done(op, Ok(()));
            }
        }
    }

    pub(super) fn conn_error(&mut self, pid: u64, ci: usize, wc: &ibv_wc) {
        let Some(mut p) = self.peers.remove(&pid) else {
            return;
        };
        let stale = p.chans.as_ref().is_none_or(|c| wc.wr_id < c[ci].first_seq);
        if !stale {
            let call = if ci == MSG { "send" } else { "write" };
            let err = wc_error(call, wc.status, wc.vendor_err);
            trace!("peer {pid}: error completion on channel {ci}: {err}");
            match wc_fate(wc.status) {
                ConnFate::Dead => {
                    self.close_peer(&mut p, &err, State::Dead(err.clone()));
                }
                ConnFate::Reconnect => {
                    self.reconnect(pid, &mut p, &err);
                    self.send_hello(&p, false);
                }
            }
        }
        self.peers.insert(pid, p);
    }

    pub(super) fn on_wc(&mut self, wc: ibv_wc) {
        if wc.wr_id & wr_id::RECV_RMA != 0 {
            self.rma_posted = self.rma_posted.saturating_sub(1);
            if wc.status == 0 && wc.wc_flags & sys::IBV_WC_WITH_IMM != 0 {
                self.ready.push(DomainEvent::Imm {
                    imm: u32::from_be(wc.imm_data),
                });
            }
            return;
        }
        if wc.wr_id & wr_id::RECV_MSG != 0 {
            self.msg_posted = self.msg_posted.saturating_sub(1);
            let token = wc.wr_id & !wr_id::TAGS;
            if wc.status == 0 {
                self.msg_bufs.remove(&token);
                self.ready.push(DomainEvent::Received {
                    token: RecvToken(token),
                    len: wc.byte_len as usize,
                });
            } else if let Some(&(addr, len, lkey)) = self.msg_bufs.get(&token) {
                // A receive that failed (e.g. too long a message) is handed
                // back to the SRQ; the sender sees the error.
                let _ = self.post_msg_recv(token, addr, len, lkey);
            }
            return;
        }
        let Some(&(pid, ci)) = self.qpn_map.get(&wc.qp_num) else {
            return;
        };
        if wc.status == 0 {
            self.complete_entries(pid, ci, wc.wr_id);
        } else {
            self.conn_error(pid, ci, &wc);
        }
    }

    pub(super) fn post_msg_recv(
        &mut self,
        token: u64,
        addr: u64,
        len: u32,
        lkey: u32,
    ) -> Result<()> {
        let mut sge = ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id: wr_id::RECV_MSG | token,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: live SRQ; wr/sge valid for the call; the buffer is
        // registered memory the engine keeps until it is reported.
        let rc = unsafe { datapath::post_srq_recv(self.msg_srq.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_error("ibv_post_srq_recv", rc.abs()));
        }
        self.msg_posted += 1;
        self.msg_bufs.insert(token, (addr, len, lkey));
        Ok(())
    }

    pub(super) fn repost_rma(&mut self) -> Result<()> {
        let mut wrs = [ibv_recv_wr::default(); RECV_CHAIN];
        while self.rma_posted < self.rma_cap {
            let n = (self.rma_cap - self.rma_posted).min(RECV_CHAIN);
            for i in 0..n {
                wrs[i].wr_id = wr_id::RECV_RMA;
                wrs[i].num_sge = 0;
                wrs[i].sg_list = std::ptr::null_mut();
                wrs[i].next = std::ptr::null_mut();
                if i > 0 {
                    let this: *mut ibv_recv_wr = &mut wrs[i];
                    wrs[i - 1].next = this;
                }
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: live SRQ; a linked chain of zero-length receives.
            let rc = unsafe {
                datapath::post_srq_recv(self.rma_srq.as_ptr(), wrs.as_mut_ptr(), &mut bad)
            };
            if rc != 0 {
                let posted = (0..n).find(|&i| std::ptr::eq(&wrs[i], bad)).unwrap_or(0);
                self.rma_posted += posted;
                return Err(errno_error("ibv_post_srq_recv(RMA)", rc.abs()));
            }
            self.rma_posted += n;
        }
        Ok(())
    }

    /// Reaps and handles completions of the data CQ; returns how many.
    pub(super) fn poll_cq(&mut self) -> usize {
        let mut reaped = 0;
        for _ in 0..16 {
            // SAFETY: live CQ; the buffer has room for its length.
            let n = unsafe { datapath::poll_cq(self.cq.as_ptr(), &mut self.wcs) };
            let Ok(n) = usize::try_from(n) else {
                return reaped;
            };
            let n = n.min(self.wcs.len());
            reaped += n;
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_wc(wc);
            }
            if n < self.wcs.len() {
                return reaped;
            }
        }
        reaped
    }
}
