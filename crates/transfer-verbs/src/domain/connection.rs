//! Connection management of [`super::VerbsDomain`]: per-peer QPs, the UD
//! handshake applied (see [`crate::handshake::decide`]), retransmission
//! timers, teardown and reconnection.

use std::time::Instant;

use transfer_core::{PeerLoss, Result, TransferError};

use super::{MAX_BACKOFF, MAX_PASSIVE, VerbsDomain};
use crate::handshake::{self, Hello, Phase, WireAddress};
use crate::peer::{Channel, MSG, Peer, RMA, State};
use crate::qp;
use crate::rdma_op::Work;
use crate::resources::{Qp, Srq, ThreadDomain};
use crate::sys;
use crate::trace::trace;

impl VerbsDomain {
    pub(super) fn new_channels(&mut self, pid: u64) -> Result<[Channel; 2]> {
        let mk = |d: &Self, srq: &Srq| -> Result<(Qp, u32)> {
            let pd = d.td.as_ref().map_or(&d.pd, ThreadDomain::pd);
            let qp = Qp::create(pd, &d.cq, Some(srq), sys::IBV_QPT_RC, d.sq_depth as u32, 0)?;
            qp::rc_init(&qp, &d.path)?;
            Ok((qp, rand::random::<u32>() & 0x00ff_ffff))
        };
        let (mq, mpsn) = mk(self, &self.msg_srq)?;
        let (rq, rpsn) = mk(self, &self.rma_srq)?;
        let first_seq = self.next_seq;
        let ch = |qp: Qp, psn: u32| Channel {
            qp,
            psn,
            pending: Default::default(),
            outstanding: Default::default(),
            sq_used: 0,
            run: 0,
            first_seq,
            partial: None,
        };
        self.qpn_map.insert(mq.qpn(), (pid, MSG));
        self.qpn_map.insert(rq.qpn(), (pid, RMA));
        Ok([ch(mq, mpsn), ch(rq, rpsn)])
    }

    /// Tears down the peer's QPs, failing work that was (partly) posted
    /// with `err`; returns the work that never reached the NIC.
    pub(super) fn drop_channels(&mut self, p: &mut Peer, err: &TransferError) -> [Vec<Work>; 2] {
        let mut keep: [Vec<Work>; 2] = Default::default();
        let Some(chans) = p.chans.take() else {
            return keep;
        };
        for (i, ch) in chans.into_iter().enumerate() {
            self.qpn_map.remove(&ch.qp.qpn());
            self.sq_total = self.sq_total.saturating_sub(ch.sq_used);
            for e in ch.outstanding {
                if let Some(b) = e.release {
                    self.release_buf(b);
                }
                if let Some(op) = e.done {
                    self.batch_done(op, Err(err.clone()));
                }
            }
            for w in ch.pending {
                if Some(w.op) == ch.partial {
                    self.fail_work(w, err);
                } else {
                    keep[i].push(w);
                }
            }
        }
        keep
    }

    /// Fails everything and leaves the peer without QPs in `state`.
    pub(super) fn close_peer(&mut self, p: &mut Peer, err: &TransferError, state: State) {
        let keep = self.drop_channels(p, err);
        for w in keep.into_iter().flatten() {
            self.fail_work(w, err);
        }
        p.state = state;
        if let Some(rc) = p.remote_conn.take() {
            p.min_remote_conn = p.min_remote_conn.max(rc + 1);
        }
        p.confirmed = false;
    }

    /// (Re)creates the peer's QPs with a new connection number and starts
    /// the handshake; queued work that never reached the NIC is kept.
    pub(super) fn reconnect(&mut self, pid: u64, p: &mut Peer, err: &TransferError) {
        let keep = self.drop_channels(p, err);
        if let Some(rc) = p.remote_conn.take() {
            p.min_remote_conn = p.min_remote_conn.max(rc + 1);
        }
        match self.new_channels(pid) {
            Ok(mut chans) => {
                for (ch, works) in chans.iter_mut().zip(keep) {
                    ch.pending.extend(works);
                }
                p.chans = Some(chans);
                p.conn = self.next_conn;
                self.next_conn += 1;
                p.confirmed = false;
                p.state = State::Connecting;
                self.handshaking.insert(pid);
                let now = Instant::now();
                p.started = now;
                p.backoff = self.cfg.handshake_retry;
                p.next_hello = now;
            }
            Err(e) => {
                for w in keep.into_iter().flatten() {
                    self.fail_work(w, &e);
                }
                p.state = State::Dead(e);
            }
        }
    }

    pub(super) fn hello_for(&self, p: &Peer, bye: bool) -> Hello {
        let (qpns, psns) = match &p.chans {
            Some(c) => ([c[0].qp.qpn(), c[1].qp.qpn()], [c[0].psn, c[1].psn]),
            None => ([0; 2], [0; 2]),
        };
        Hello {
            from: self.wire,
            to_nonce: p.addr.nonce,
            bye,
            conn: p.conn,
            peer_conn: p.remote_conn,
            confirmed: p.confirmed,
            min_peer_conn: p.min_remote_conn,
            qpns,
            psns,
        }
    }

    pub(super) fn send_hello(&mut self, p: &Peer, bye: bool) {
        if p.chans.is_none() && !bye {
            return;
        }
        let h = self.hello_for(p, bye);
        if let Ok(bytes) = handshake::encode_hello(&h) {
            // Best effort: a lost or unsendable hello is retried by the timer
            // and, failing that, ends in a handshake timeout.
            let _ = self.ud.send(&self.pd, &p.addr, &bytes);
        }
    }

    pub(super) fn connect(&self, p: &Peer, h: &Hello) -> Result<()> {
        let Some(chans) = &p.chans else {
            return Err(TransferError::invalid("connect", "peer has no QPs"));
        };
        for (i, ch) in chans.iter().enumerate() {
            qp::rc_rtr(
                &ch.qp,
                &self.path,
                &p.addr,
                h.qpns[i],
                h.psns[i],
                self.cfg.min_rnr_timer,
            )?;
            qp::rc_rts(
                &ch.qp,
                ch.psn,
                self.cfg.rc_timeout,
                self.cfg.rc_retry_cnt.min(6),
                self.cfg.rnr_retry,
            )?;
        }
        Ok(())
    }

    pub(super) fn new_peer(&mut self, addr: WireAddress, resolved: bool) -> u64 {
        let pid = self.next_peer;
        self.next_peer += 1;
        let now = Instant::now();
        let mut p = Peer {
            addr,
            state: State::Idle,
            chans: None,
            conn: 0,
            remote_conn: None,
            min_remote_conn: 0,
            confirmed: false,
            started: now,
            next_hello: now,
            backoff: self.cfg.handshake_retry,
            resolved,
        };
        self.reconnect(pid, &mut p, &TransferError::Shutdown { call: "connect" });
        self.by_addr.insert(addr, pid);
        self.peers.insert(pid, p);
        pid
    }

    pub(super) fn on_hello(&mut self, h: Hello) {
        if h.to_nonce != self.wire.nonce {
            return;
        }
        let pid = match self.by_addr.get(&h.from) {
            Some(&pid) => pid,
            None if h.bye => return,
            None if self.passive >= MAX_PASSIVE => {
                trace!("hello from an unknown peer dropped: {MAX_PASSIVE} passive peers already");
                return;
            }
            None => {
                self.passive += 1;
                self.new_peer(h.from, false)
            }
        };
        let Some(mut p) = self.peers.remove(&pid) else {
            return;
        };
        self.handle_hello(pid, &mut p, &h);
        if !p.resolved && p.state == State::Idle {
            // The remote closed a connection it opened and we never used.
            self.by_addr.remove(&p.addr);
            self.passive = self.passive.saturating_sub(1);
            return;
        }
        let ready = p.state == State::Ready;
        self.peers.insert(pid, p);
        if ready {
            self.progress(pid);
        }
    }

    pub(super) fn handle_hello(&mut self, pid: u64, p: &mut Peer, h: &Hello) {
        trace!(
            "peer {pid}: hello in conn={} peer_conn={:?} confirmed={} bye={} (mine: conn={} remote={:?} state={:?})",
            h.conn, h.peer_conn, h.confirmed, h.bye, p.conn, p.remote_conn, p.state
        );
        let view = handshake::ConnView {
            conn: p.conn,
            remote_conn: p.remote_conn,
            min_remote_conn: p.min_remote_conn,
            confirmed: p.confirmed,
            phase: match p.state {
                State::Idle => Phase::Idle,
                State::Connecting => Phase::Connecting,
                State::Ready => Phase::Ready,
                State::Dead(_) => Phase::Dead,
            },
        };
        let a = handshake::decide(&view, h);
        if a.ignore {
            return;
        }
        if a.close {
            let err = TransferError::unreachable(
                "verbs connection",
                PeerLoss::Closed,
                "the peer closed the connection",
            );
            self.close_peer(p, &err, State::Idle);
            return;
        }
        if a.rebuild {
            let err = TransferError::unreachable(
                "verbs connection",
                PeerLoss::Reconnecting,
                "the peer re-established the connection",
            );
            self.reconnect(pid, p, &err);
        }
        if a.repoint {
            let repointed = p.chans.as_ref().map(|c| {
                c.iter()
                    .try_for_each(|ch| qp::rc_reinit(&ch.qp, &self.path))
            });
            if let Some(Err(e)) = repointed {
                self.close_peer(p, &e, State::Dead(e.clone()));
                return;
            }
            p.remote_conn = None;
        }
        if p.chans.is_none() {
            // Rebuilding failed (the peer is Dead with the reason).
            return;
        }
        if a.connect {
            if let Err(e) = self.connect(p, h) {
                self.close_peer(p, &e, State::Dead(e.clone()));
                return;
            }
            p.remote_conn = Some(h.conn);
        }
        if a.confirm {
            trace!("peer {pid}: connected (conn {} <-> {})", p.conn, h.conn);
            p.confirmed = true;
            p.state = State::Ready;
        }
        if a.reply {
            self.send_hello(p, false);
        }
    }

    pub(super) fn handshake_timers(&mut self) {
        if self.handshaking.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut pids = std::mem::take(&mut self.scratch_pids);
        pids.clear();
        pids.extend(self.handshaking.iter().copied());
        for &pid in &pids {
            let Some(mut p) = self.peers.remove(&pid) else {
                self.handshaking.remove(&pid);
                continue;
            };
            if p.state != State::Connecting {
                self.handshaking.remove(&pid);
                self.peers.insert(pid, p);
                continue;
            }
            if p.next_hello > now {
                self.peers.insert(pid, p);
                continue;
            }
            if now.duration_since(p.started) > self.cfg.handshake_timeout {
                trace!("peer {pid}: handshake timed out");
                self.handshaking.remove(&pid);
                let err = TransferError::unreachable(
                    "verbs handshake",
                    PeerLoss::Dead,
                    format!(
                        "no answer from the peer's UD QP {:#x} within {} ms",
                        p.addr.ud_qpn,
                        self.cfg.handshake_timeout.as_millis()
                    ),
                );
                self.close_peer(&mut p, &err, State::Dead(err.clone()));
                if !p.resolved {
                    // A passive entry nobody uses: forget it entirely.
                    self.by_addr.remove(&p.addr);
                    self.passive = self.passive.saturating_sub(1);
                    continue;
                }
            } else {
                self.send_hello(&p, false);
                p.next_hello = now + p.backoff;
                p.backoff = (p.backoff * 2).min(MAX_BACKOFF);
            }
            self.peers.insert(pid, p);
        }
        self.scratch_pids = pids;
    }
}
