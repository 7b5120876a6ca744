//! [`VerbsDomain`]: one verbs device port as a transfer-core [`Domain`].
//!
//! Resources: one PD; one CQ shared by every RC QP and both SRQs; a message
//! SRQ (receive buffers posted by the engine) and an RMA SRQ of zero-length
//! receives that absorb writes-with-immediate (reposted as consumed); one
//! UD QP (with its own CQ) for the handshake; two RC QPs per peer. Both
//! CQs report on one completion channel, whose descriptor is the domain's
//! [`Domain::wait_fd`]: an idle worker sleeps on it and wakes on any
//! completion, a handshake included.
//!
//! `resolve_peer` is synchronous but connecting is not: it returns a
//! [`PeerId`] at once and starts the UD handshake; work submitted for the
//! peer queues until both sides are connected, then goes. Both sides answer
//! hellos from `poll`.

mod connection;
mod data_path;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use transfer_core::{
    BackendKind, Countdowns, Domain, DomainEvent, DomainInfo, DomainMr, HostBuffer, MemorySpan,
    NicAddress, OpToken, Ordering, PeerId, PeerLoss, RecvToken, Registration, RemoteKey,
    RemoteNicRegion, Result, TransferError, WriteOp,
};

use crate::config::VerbsConfig;
use crate::devinfo::{self, DeviceInfo, LinkLayer, PortInfo};
use crate::handshake::{self, WireAddress};
use crate::peer::{MSG, Peer, RMA, State};
use crate::qp::Path;
use crate::rdma_op::{SendChain, Work, WorkKind, WriteSpec, expand_writes, wr_id};
use crate::resources::{CompChannel, Context, Cq, Mr, Pd, Srq, ThreadDomain};
use crate::sys::ibv_wc;
use crate::ud::UdEndpoint;

/// Longest handshake retransmission interval.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Zero-length RMA receives reposted per doorbell.
const RECV_CHAIN: usize = 32;
/// Most peer entries created by hellos (not by `resolve_peer`) at once.
const MAX_PASSIVE: usize = 4096;

enum SendBuf {
    /// A bounce slot of the registered pool.
    Slot(usize),
    /// A message registered on the fly (too long for a slot, or none free).
    Owned(#[allow(dead_code)] Vec<u8>, #[allow(dead_code)] Mr),
}

/// One verbs device port. See the module documentation.
///
/// Field order is drop order: peers' QPs, the UD endpoint, SRQs, memory
/// registrations, the CQ, the completion channel (after every CQ on it),
/// the PD, then the device context; buffers last.
pub struct VerbsDomain {
    peers: HashMap<u64, Peer>,
    ud: UdEndpoint,
    rma_srq: Srq,
    msg_srq: Srq,
    mrs: HashMap<u64, Mr>,
    send_bufs: HashMap<u64, SendBuf>,
    slot_mr: Mr,
    cq: Cq,
    /// Where `cq` and the UD CQ report; `None` when the library or
    /// provider has none (idle workers then park on timers).
    channel: Option<CompChannel>,
    /// Set when a CQ could not be armed: the channel is kept (its CQs use
    /// it) but no longer offered as a wait descriptor.
    wait_disabled: bool,
    /// Thread domain + parent domain for the RC QPs, when the provider has them.
    td: Option<ThreadDomain>,
    pd: Pd,
    ctx: Context,
    slot_buf: HostBuffer,
    cfg: VerbsConfig,
    dev: DeviceInfo,
    port: PortInfo,
    gid_index: Option<u32>,
    path: Path,
    wire: WireAddress,
    by_addr: HashMap<WireAddress, u64>,
    qpn_map: HashMap<u32, (u64, usize)>,
    next_peer: u64,
    next_conn: u64,
    next_seq: u64,
    next_mr: u64,
    next_buf: u64,
    free_slots: Vec<usize>,
    /// Submit calls in flight: one part per peer batch or send.
    ops: Countdowns,
    ready: Vec<DomainEvent>,
    chain: SendChain,
    sigs: Vec<(bool, u64)>,
    cq_depth: usize,
    sq_depth: usize,
    sq_total: usize,
    msg_posted: usize,
    rma_posted: usize,
    rma_cap: usize,
    msg_bufs: HashMap<u64, (u64, u32, u32)>,
    wcs: Vec<ibv_wc>,
    hellos: Vec<Vec<u8>>,
    scratch_pids: Vec<u64>,
    /// Peers in `State::Connecting` (cleaned lazily by the timers).
    handshaking: HashSet<u64>,
    /// Ready peers with queued work that found no room (SQ/CQ full).
    blocked: HashSet<u64>,
    passive: usize,
}

// SAFETY: verbs objects may be used from any thread; the domain is owned
// by exactly one worker thread at a time (Domain: Send, not Sync), and
// every raw pointer it holds names memory it owns or registered memory
// the engine keeps alive.
unsafe impl Send for VerbsDomain {}

impl VerbsDomain {
    /// Opens a domain with [`VerbsConfig::from_env`].
    pub fn open_default() -> Result<Self> {
        Self::open(VerbsConfig::from_env())
    }

    /// Opens `count` domains on the same device port (e.g. the NICs of a
    /// test group on one soft-RoCE device).
    pub fn open_many(cfg: &VerbsConfig, count: usize) -> Result<Vec<Self>> {
        (0..count).map(|_| Self::open(cfg.clone())).collect()
    }

    /// Opens the configured device and port and creates the domain's
    /// resources.
    pub fn open(cfg: VerbsConfig) -> Result<Self> {
        let ctx = Context::open(cfg.device.as_deref())?;
        let dev = devinfo::query(&ctx)?;
        let port = devinfo::select_port(&dev.ports, cfg.port)?.clone();
        let gid_index = devinfo::select_gid(port.link_layer, &port.gids, cfg.gid_index)?;
        let gid = gid_index
            .and_then(|i| port.gids.iter().find(|g| g.index == i))
            .map_or([0; 16], |g| g.gid);
        let sgid_index =
            match gid_index {
                Some(i) => Some(u8::try_from(i).map_err(|_| {
                    TransferError::invalid("VerbsDomain::open", "GID index above 255")
                })?),
                None => None,
            };
        let path = Path {
            port: port.port,
            sgid_index,
            pkey_index: cfg.pkey_index,
            sl: cfg.service_level,
            traffic_class: cfg.traffic_class,
            mtu: port.active_mtu.max(1),
        };
        let pd = Pd::alloc(&ctx)?;
        let td = if cfg.thread_domain {
            ThreadDomain::create(&ctx, &pd)
        } else {
            None
        };
        let sq_depth = cfg.sq_depth.clamp(1, dev.max_qp_wr.max(1));
        let srq_cap = dev.max_srq_wr.max(1);
        let msg_cap = cfg.msg_srq_depth.clamp(1, srq_cap);
        // Every posted receive and send WR may produce a completion: the CQ
        // must hold both SRQs plus room for sends, or nothing could post.
        let need = cfg
            .rma_srq_depth
            .saturating_add(msg_cap)
            .saturating_add(sq_depth.saturating_mul(2));
        let cq_req = cfg.cq_depth.max(need).min(dev.max_cqe.max(1));
        let channel = CompChannel::create(&ctx);
        let cq = Cq::create(&ctx, cq_req, channel.as_ref())?;
        let room = cq.depth().saturating_sub(msg_cap + 2 * sq_depth).max(1);
        let rma_cap = cfg.rma_srq_depth.clamp(1, srq_cap).min(room);
        let rma_srq = Srq::create(&pd, rma_cap, 1)?;
        let msg_srq = Srq::create(&pd, msg_cap, 1)?;
        let qkey = rand::random::<u32>() & 0x7fff_ffff;
        let ud = UdEndpoint::new(
            &ctx,
            &pd,
            path,
            qkey,
            rand::random::<u32>() & 0x00ff_ffff,
            channel.as_ref(),
        )?;
        let slot_size = cfg.send_slot_size.max(64);
        let slots = cfg.send_slots.max(1);
        let slot_buf = HostBuffer::new(slot_size * slots)?;
        let slot_mr = Mr::register(&pd, slot_buf.as_ptr(), slot_buf.len(), false)?;
        let wire = WireAddress {
            version: handshake::VERSION,
            gid,
            global: port.link_layer == LinkLayer::Ethernet || gid_index.is_some(),
            lid: port.lid,
            ud_qpn: ud.qpn(),
            qkey: ud.qkey(),
            mtu: path.mtu,
            nonce: rand::random(),
        };
        let cq_depth = cq.depth() as usize;
        let mut d = Self {
            peers: HashMap::new(),
            ud,
            rma_srq,
            msg_srq,
            mrs: HashMap::new(),
            send_bufs: HashMap::new(),
            slot_mr,
            cq,
            channel,
            wait_disabled: false,
            td,
            pd,
            ctx,
            slot_buf,
            chain: SendChain::new(cfg.chain_len),
            cfg,
            dev,
            port,
            gid_index,
            path,
            wire,
            by_addr: HashMap::new(),
            qpn_map: HashMap::new(),
            next_peer: 1,
            next_conn: u64::from(rand::random::<u32>()) + 1,
            next_seq: 1,
            next_mr: 1,
            next_buf: 1,
            free_slots: (0..slots).rev().collect(),
            ops: Countdowns::default(),
            ready: Vec::new(),
            sigs: Vec::new(),
            cq_depth,
            sq_depth: sq_depth as usize,
            sq_total: 0,
            msg_posted: 0,
            rma_posted: 0,
            rma_cap: rma_cap as usize,
            msg_bufs: HashMap::new(),
            wcs: vec![ibv_wc::default(); 64],
            hellos: Vec::new(),
            scratch_pids: Vec::new(),
            handshaking: HashSet::new(),
            blocked: HashSet::new(),
            passive: 0,
        };
        d.repost_rma()?;
        Ok(d)
    }

    /// What the device reports.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.dev
    }

    /// The port in use.
    pub fn port_info(&self) -> &PortInfo {
        &self.port
    }

    /// The GID index in use (`None`: LID-routed InfiniBand).
    pub fn gid_index(&self) -> Option<u32> {
        self.gid_index
    }

    /// Whether the RC QPs live in a thread domain (lock-free provider paths).
    pub fn uses_thread_domain(&self) -> bool {
        self.td.is_some()
    }

    /// The configuration the domain was opened with.
    pub fn config(&self) -> &VerbsConfig {
        &self.cfg
    }

    /// The decoded form of [`Domain::address`].
    pub fn wire_address(&self) -> WireAddress {
        self.wire
    }

    fn slot_size(&self) -> usize {
        self.cfg.send_slot_size.max(64)
    }

    fn batch_done(&mut self, op: OpToken, r: Result<()>) {
        self.ready.extend(self.ops.settle(op, r));
    }

    fn release_buf(&mut self, id: u64) {
        if let Some(SendBuf::Slot(s)) = self.send_bufs.remove(&id) {
            self.free_slots.push(s);
        }
    }

    fn fail_work(&mut self, w: Work, e: &TransferError) {
        if let WorkKind::Send { buf } = w.kind {
            self.release_buf(buf);
        }
        if w.last {
            self.batch_done(w.op, Err(e.clone()));
        }
    }

    fn numa_node(&self) -> Option<u32> {
        let path = format!("/sys/class/infiniband/{}/device/numa_node", self.ctx.name());
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok())
    }
}

impl Domain for VerbsDomain {
    fn backend(&self) -> BackendKind {
        BackendKind::Verbs
    }

    fn info(&self) -> DomainInfo {
        DomainInfo {
            name: self.ctx.name().to_string(),
            provider: match self.port.link_layer {
                LinkLayer::Ethernet => "verbs;roce".into(),
                _ => "verbs;ib".into(),
            },
            link_speed_bps: self.port.speed_bps,
            numa_node: self.numa_node(),
            ordering: Ordering::InOrder,
            // The port's limit: the engine splits longer writes (the
            // immediate on the last piece, RC places them in order);
            // `expand_writes` still splits as a safety net.
            max_write_size: u64::from(self.port.max_msg_sz),
        }
    }

    fn address(&self) -> NicAddress {
        handshake::encode_address(&self.wire).unwrap_or(NicAddress(Vec::new()))
    }

    fn register(&mut self, span: MemorySpan) -> Result<Registration> {
        let mr = match span.dmabuf_fd {
            Some(fd) => Mr::register_dmabuf(&self.pd, fd, span.len, span.ptr as u64)?,
            None => Mr::register(&self.pd, span.ptr, span.len, self.cfg.relaxed_ordering)?,
        };
        let id = self.next_mr;
        self.next_mr += 1;
        let remote = RemoteNicRegion {
            base: span.ptr as u64,
            key: RemoteKey(u64::from(mr.rkey())),
        };
        self.mrs.insert(id, mr);
        Ok(Registration {
            mr: DomainMr(id),
            remote,
        })
    }

    fn unregister(&mut self, mr: DomainMr) -> Result<()> {
        self.mrs.remove(&mr.0).map(drop).ok_or_else(|| {
            TransferError::invalid("VerbsDomain::unregister", "unknown registration")
        })
    }

    fn resolve_peer(&mut self, addr: &NicAddress) -> Result<PeerId> {
        let w = handshake::decode_address(addr)?;
        if let Some(&pid) = self.by_addr.get(&w) {
            if let Some(p) = self.peers.get_mut(&pid) {
                if !p.resolved {
                    p.resolved = true;
                    self.passive = self.passive.saturating_sub(1);
                }
            }
            return Ok(PeerId(pid));
        }
        let pid = self.new_peer(w, true);
        if let Some(mut p) = self.peers.remove(&pid) {
            if let State::Dead(e) = &p.state {
                let e = e.clone();
                self.by_addr.remove(&w);
                return Err(e);
            }
            self.send_hello(&p, false);
            p.next_hello = Instant::now() + p.backoff;
            self.peers.insert(pid, p);
        }
        Ok(PeerId(pid))
    }

    fn remove_peer(&mut self, peer: PeerId) {
        let Some(mut p) = self.peers.remove(&peer.0) else {
            return;
        };
        self.by_addr.remove(&p.addr);
        if !p.resolved {
            self.passive = self.passive.saturating_sub(1);
        }
        self.blocked.remove(&peer.0);
        if p.chans.is_some() {
            self.send_hello(&p, true);
        }
        let err = TransferError::unreachable("remove_peer", PeerLoss::Forgotten, "peer removed");
        self.close_peer(&mut p, &err, State::Idle);
    }

    fn post_recv(
        &mut self,
        token: RecvToken,
        mr: DomainMr,
        buf: *mut u8,
        len: usize,
    ) -> Result<()> {
        const CALL: &str = "VerbsDomain::post_recv";
        if token.0 & wr_id::TAGS != 0 {
            return Err(TransferError::invalid(CALL, "token uses the top two bits"));
        }
        let lkey = self
            .mrs
            .get(&mr.0)
            .map(Mr::lkey)
            .ok_or_else(|| TransferError::invalid(CALL, "unknown registration"))?;
        let len = u32::try_from(len)
            .map_err(|_| TransferError::invalid(CALL, "receive buffer above 4 GiB"))?;
        self.post_msg_recv(token.0, buf as u64, len, lkey)
    }

    fn submit_send(&mut self, op: OpToken, peer: PeerId, data: Vec<u8>) {
        self.ops.expect(op, 1);
        let id = self.next_buf;
        self.next_buf += 1;
        let len = match u32::try_from(data.len()) {
            Ok(l) => l,
            Err(_) => {
                return self.batch_done(
                    op,
                    Err(TransferError::invalid("send", "message above 4 GiB")),
                );
            }
        };
        let (addr, lkey) = if data.len() <= self.slot_size() && !self.free_slots.is_empty() {
            let Some(slot) = self.free_slots.pop() else {
                return;
            };
            let addr = self.slot_buf.as_ptr() as u64 + (slot * self.slot_size()) as u64;
            // SAFETY: the slot lies in slot_buf and is free (not in flight).
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len());
            }
            self.send_bufs.insert(id, SendBuf::Slot(slot));
            (addr, self.slot_mr.lkey())
        } else {
            let mut data = data;
            let ptr = data.as_mut_ptr();
            let mr = match Mr::register(&self.pd, ptr, data.len().max(1), false) {
                Ok(m) => m,
                Err(e) => return self.batch_done(op, Err(e)),
            };
            let lkey = mr.lkey();
            self.send_bufs.insert(id, SendBuf::Owned(data, mr));
            (ptr as u64, lkey)
        };
        let w = Work {
            op,
            local: addr,
            len,
            lkey,
            kind: WorkKind::Send { buf: id },
            last: true,
        };
        if let Err(e) = self.enqueue(peer, MSG, &[w]) {
            self.fail_work(w, &e);
            return;
        }
        self.progress(peer.0);
    }

    fn submit_writes(&mut self, op: OpToken, writes: &[WriteOp]) {
        const CALL: &str = "submit_writes";
        if writes.is_empty() {
            self.ready
                .push(DomainEvent::Completed { op, result: Ok(()) });
            return;
        }
        let mut groups: Vec<(PeerId, Vec<WriteSpec>)> = Vec::new();
        let mut bad: Option<TransferError> = None;
        for w in writes {
            let Some(lkey) = self.mrs.get(&w.local_mr.0).map(Mr::lkey) else {
                bad.get_or_insert(TransferError::invalid(CALL, "unknown local registration"));
                continue;
            };
            let Ok(rkey) = u32::try_from(w.remote_key.0) else {
                bad.get_or_insert(TransferError::invalid(
                    CALL,
                    "remote key is not a verbs rkey",
                ));
                continue;
            };
            let spec = WriteSpec {
                local: w.local as u64,
                len: w.len as u64,
                lkey,
                remote_addr: w.remote_addr,
                rkey,
                imm: w.imm,
            };
            match groups.iter_mut().find(|(p, _)| *p == w.peer) {
                Some((_, v)) => v.push(spec),
                None => groups.push((w.peer, vec![spec])),
            }
        }
        if let Some(e) = bad {
            self.ops.expect(op, 1);
            return self.batch_done(op, Err(e));
        }
        self.ops.expect(op, groups.len());
        let max_msg = self.port.max_msg_sz.max(1);
        let mut works = Vec::new();
        for (peer, specs) in groups {
            works.clear();
            if let Err(e) = expand_writes(op, &specs, max_msg, &mut works) {
                self.batch_done(op, Err(e));
                continue;
            }
            if let Err(e) = self.enqueue(peer, RMA, &works) {
                self.batch_done(op, Err(e));
                continue;
            }
            self.progress(peer.0);
        }
    }

    fn poll(&mut self, events: &mut Vec<DomainEvent>) {
        let mut hellos = std::mem::take(&mut self.hellos);
        self.ud.poll(&mut hellos);
        for bytes in hellos.drain(..) {
            if let Ok(h) = handshake::decode_hello(&bytes) {
                self.on_hello(h);
            }
        }
        self.hellos = hellos;
        self.handshake_timers();
        self.poll_cq();
        // A failed repost leaves fewer receives posted; retried next poll.
        let _ = self.repost_rma();
        if !self.blocked.is_empty() {
            let mut pids = std::mem::take(&mut self.scratch_pids);
            pids.clear();
            pids.extend(self.blocked.iter().copied());
            for &pid in &pids {
                self.progress(pid);
            }
            self.scratch_pids = pids;
        }
        events.append(&mut self.ready);
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        if self.wait_disabled {
            return None;
        }
        self.channel.as_ref().map(CompChannel::fd)
    }

    fn prepare_wait(&mut self) -> bool {
        let Some(channel) = &self.channel else {
            return true;
        };
        if !self.ready.is_empty() || !self.hellos.is_empty() {
            return false;
        }
        // Events already queued only say "look at the CQ": this pass is
        // about to, so drop them (acknowledged) before arming again, or the
        // descriptor would stay readable and the worker never sleep.
        channel.drain();
        if !(self.cq.arm() && self.ud.cq().arm()) {
            // Cannot arm: blocking could miss arrivals. Stop offering the
            // descriptor (the worker parks on timers from the next sleep)
            // and poll now.
            self.wait_disabled = true;
            return false;
        }
        // Completions that landed before arming raise no event: reap them
        // now (events for the next `poll`, hellos handled there) and stay
        // awake; an empty poll means anything later will wake the worker.
        let reaped = self.ud.poll(&mut self.hellos) + self.poll_cq();
        reaped == 0 && self.ready.is_empty()
    }

    fn has_pending(&self) -> bool {
        // Queued or posted work always belongs to a tracked op.
        !self.ops.is_empty() || !self.ready.is_empty() || !self.handshaking.is_empty()
    }
}

impl Drop for VerbsDomain {
    fn drop(&mut self) {
        // Tell connected peers, so they fail their work at once instead of
        // after transport retries; then release every QP before the SRQs,
        // CQs, MRs, PD and context (field order).
        let pids: Vec<u64> = self.peers.keys().copied().collect();
        let mut said_bye = false;
        for pid in pids {
            if let Some(p) = self.peers.remove(&pid) {
                if p.remote_conn.is_some() {
                    self.send_hello(&p, true);
                    said_bye = true;
                }
                self.peers.insert(pid, p);
            }
        }
        if said_bye {
            self.ud.drain_sends(Duration::from_millis(50));
        }
        self.peers.clear();
        self.send_bufs.clear();
        self.mrs.clear();
    }
}
