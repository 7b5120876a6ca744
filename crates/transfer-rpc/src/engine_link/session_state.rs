//! One session's engine state and the ENGINE_* handlers.
//!
//! Every refusal is answered (ok = 0) with a logged reason and leaves the
//! session open: the client falls back to another path. Only the session's
//! own connection thread blocks, in ENGINE_WAIT (capped) and while settling
//! its posted writes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer_core::{EngineAddress, LocalRegion, Pending, RemoteTarget, WriteRequest, WriteShape};

use super::link::EngineLink;
use super::ticket::{LaneTicket, SLOT_BYTES, SLOTS, new_secret, slot_offset, slot_value};
use crate::protocol::engine::{
    CloseKind, LaneId, MAX_ENGINE_BYTES, MAX_LANE, OutboundId, PROBE_LANE, lane_imm,
};
use crate::protocol::{Request, Response, RpcTensor};
use crate::server::Shared;
use crate::server::peer::PeerAllow;
use crate::validate::check_tensor;

struct Inbound {
    sender: EngineAddress,
    size: u64,
    /// The lane's secret and slot ring ([`super::ticket`]).
    secret: u64,
    slots: LocalRegion,
}

struct Outbound {
    target: RemoteTarget,
    lane: LaneId,
    /// Where this sender proves each write: the destination's slot ring.
    slot_target: RemoteTarget,
    secret: u64,
    /// Local source of the slot writes, one entry per slot.
    ring: LocalRegion,
}

struct PostedWrite {
    pending: Pending,
    outbound: OutboundId,
    seq: u32,
}

/// The engine state of one session.
pub struct EngineSession {
    link: Arc<EngineLink>,
    session: u64,
    inbound: HashMap<LaneId, Inbound>,
    outbound: HashMap<OutboundId, Outbound>,
    next_outbound: u32,
    posted: VecDeque<PostedWrite>,
    /// First failure of a posted write not yet reported to the client.
    failure: Option<String>,
}

impl std::fmt::Debug for EngineSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineSession")
            .field("session", &self.session)
            .field("inbound", &self.inbound.len())
            .field("outbound", &self.outbound.len())
            .field("posted", &self.posted.len())
            .finish()
    }
}

fn inbound_refused() -> Response {
    Response::EngineInbound {
        ok: 0,
        lane: LaneId(0),
        descriptor: Vec::new(),
    }
}

fn outbound_refused() -> Response {
    Response::EngineOutbound {
        ok: 0,
        id: OutboundId(0),
    }
}

impl EngineSession {
    /// Engine state for session `session`.
    pub fn new(link: Arc<EngineLink>, session: u64) -> Self {
        EngineSession {
            link,
            session,
            inbound: HashMap::new(),
            outbound: HashMap::new(),
            next_outbound: 1,
            posted: VecDeque::new(),
            failure: None,
        }
    }

    /// The server's engine link.
    pub fn link(&self) -> &Arc<EngineLink> {
        &self.link
    }

    /// Writes posted and not yet known to be complete.
    pub fn posted(&self) -> usize {
        self.posted.len()
    }

    fn log(&self, shared: &Shared, msg: &str) {
        shared.log(&format!("session {}: {msg}", self.session));
    }

    /// Serves one ENGINE_* request; `None` for any other request.
    pub fn handle(&mut self, shared: &Shared, req: Request<'_>) -> Option<Response> {
        Some(match req {
            Request::EngineInfo => Response::EngineInfo {
                backend: self.link.backend_tag(),
                address: self.link.address_bytes().to_vec(),
            },
            Request::EngineOpenInbound {
                buffer,
                offset,
                size,
                sender,
            } => match self.open_inbound(shared, buffer, offset, size, sender) {
                Ok(r) => r,
                Err(reason) => {
                    self.log(shared, &format!("ENGINE_OPEN_INBOUND answered 0: {reason}"));
                    inbound_refused()
                }
            },
            Request::EngineOpenOutbound {
                destination,
                descriptor,
                lane,
            } => match self.open_outbound(&shared.config.peer_allow, destination, descriptor, lane)
            {
                Ok(r) => r,
                Err(reason) => {
                    self.log(
                        shared,
                        &format!("ENGINE_OPEN_OUTBOUND answered 0: {reason}"),
                    );
                    outbound_refused()
                }
            },
            Request::EngineWrite {
                outbound,
                src,
                src_offset,
                size,
                dst_offset,
                seq,
            } => {
                let r = self.write(shared, outbound, &src, src_offset, size, dst_offset, seq);
                self.status("ENGINE_WRITE", shared, r)
            }
            Request::EngineWait {
                lane,
                seq,
                timeout_ms,
                size,
            } => {
                let r = self.wait(shared, lane, seq, timeout_ms, size);
                self.status("ENGINE_WAIT", shared, r)
            }
            Request::EngineClose { kind, id } => {
                let closed = match kind {
                    CloseKind::Inbound => match self.inbound.remove(&LaneId(id)) {
                        Some(inb) => {
                            self.link.close_target(LaneId(id));
                            self.link.drop_region(inb.slots);
                            self.link.lanes().free(LaneId(id), self.session)
                        }
                        None => false,
                    },
                    CloseKind::Outbound => {
                        // Posted writes may still read the ring.
                        self.settle(shared);
                        match self.outbound.remove(&OutboundId(id)) {
                            Some(o) => {
                                self.link.drop_region(o.ring);
                                true
                            }
                            None => false,
                        }
                    }
                };
                if !closed {
                    self.log(shared, &format!("ENGINE_CLOSE of unknown {kind:?} {id}"));
                }
                Response::Status(u8::from(closed))
            }
            _ => return None,
        })
    }

    fn status(&self, call: &str, shared: &Shared, r: std::result::Result<(), String>) -> Response {
        match r {
            Ok(()) => Response::Status(1),
            Err(reason) => {
                self.log(shared, &format!("{call} answered 0: {reason}"));
                Response::Status(0)
            }
        }
    }

    fn open_inbound(
        &mut self,
        shared: &Shared,
        handle: u64,
        offset: u64,
        size: u64,
        sender: &[u8],
    ) -> std::result::Result<Response, String> {
        const CALL: &str = "ENGINE_OPEN_INBOUND";
        if self.inbound.len() >= self.link.config().max_lanes_per_session {
            return Err("this session holds the most lanes allowed".into());
        }
        let sender = EngineAddress::from_bytes(sender).map_err(|e| e.to_string())?;
        let engine = self.link.engine();
        if sender.backend != engine.address().backend {
            return Err(format!(
                "sender backend {} is not this engine's {}",
                sender.backend,
                engine.address().backend
            ));
        }
        let registry = &shared.registry;
        let buffer = registry
            .get(handle)
            .ok_or_else(|| format!("unknown buffer handle {handle:#x}"))?;
        if size == 0 || offset.checked_add(size).is_none_or(|end| end > buffer.size) {
            return Err(format!(
                "range {offset}+{size} is not inside the buffer's {} bytes",
                buffer.size
            ));
        }
        let lane = self
            .link
            .alloc_lane(self.session)
            .ok_or("every lane of this server is in use")?;
        // Only the lane's range is registered: the descriptor is the whole
        // of what a sender can reach, however it is rewritten.
        let secret = new_secret().ok_or("no randomness from the OS")?;
        let slots = match self
            .link
            .engine()
            .alloc_host((SLOTS * SLOT_BYTES) as usize, 0)
        {
            Ok(r) => r,
            Err(e) => {
                self.link.lanes().free(lane, self.session);
                return Err(e.to_string());
            }
        };
        let slot_desc = slots.remote().clone();
        let described = self
            .link
            .register_target(CALL, lane, &buffer, offset, size)
            .map_err(|e| e.to_string())
            .and_then(|data| {
                LaneTicket {
                    data,
                    slots: slot_desc,
                    secret,
                }
                .to_bytes()
            })
            .and_then(|d| {
                if d.len() > MAX_ENGINE_BYTES {
                    Err(format!("descriptor of {} bytes", d.len()))
                } else if !registry
                    .get(handle)
                    .is_some_and(|live| Arc::ptr_eq(&live, &buffer))
                {
                    // Freed by its owner while we registered it.
                    Err("the buffer was freed".into())
                } else {
                    Ok(d)
                }
            });
        let descriptor = match described {
            Ok(d) => d,
            Err(e) => {
                self.link.close_target(lane);
                self.link.drop_region(slots);
                self.link.lanes().free(lane, self.session);
                return Err(e);
            }
        };
        self.inbound.insert(
            lane,
            Inbound {
                sender,
                size,
                secret,
                slots,
            },
        );
        Ok(Response::EngineInbound {
            ok: 1,
            lane,
            descriptor,
        })
    }

    fn open_outbound(
        &mut self,
        allow: &PeerAllow,
        destination: &[u8],
        descriptor: &[u8],
        lane: LaneId,
    ) -> std::result::Result<Response, String> {
        if self.outbound.len() >= self.link.config().max_outbound_per_session {
            return Err("this session holds the most outbound targets allowed".into());
        }
        if lane.0 == PROBE_LANE || lane.0 > MAX_LANE {
            return Err(format!("lane {} is not 1..={MAX_LANE}", lane.0));
        }
        let addr = EngineAddress::from_bytes(destination).map_err(|e| e.to_string())?;
        // The operator's --peer-allow, as for COPY_TENSOR_TO, before the
        // address is resolved or anything is sent: a refused destination
        // is answered at once and alike whether or not it is reachable.
        if !engine_destination_allowed(allow, &addr) {
            return Err(
                "destination not allowed (the server's --peer-allow; none by default)".into(),
            );
        }
        let ticket = LaneTicket::from_bytes(descriptor)?;
        let engine = self.link.engine();
        let peer = engine.peer(&addr).map_err(|e| e.to_string())?;
        let target = engine
            .remote(&peer, ticket.data)
            .map_err(|e| e.to_string())?;
        let slot_target = engine
            .remote(&peer, ticket.slots)
            .map_err(|e| e.to_string())?;
        self.link
            .probe(&target)
            .map_err(|e| format!("the destination cannot be reached: {e}"))?;
        let ring = engine
            .alloc_host((SLOTS * SLOT_BYTES) as usize, 0)
            .map_err(|e| e.to_string())?;
        let mut id = self.next_outbound;
        while id == 0 || self.outbound.contains_key(&OutboundId(id)) {
            id = id.wrapping_add(1);
        }
        self.next_outbound = id.wrapping_add(1);
        self.outbound.insert(
            OutboundId(id),
            Outbound {
                target,
                lane,
                slot_target,
                secret: ticket.secret,
                ring,
            },
        );
        Ok(Response::EngineOutbound {
            ok: 1,
            id: OutboundId(id),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        shared: &Shared,
        outbound: OutboundId,
        src: &RpcTensor,
        src_offset: u64,
        size: u64,
        dst_offset: u64,
        seq: u32,
    ) -> std::result::Result<(), String> {
        const CALL: &str = "ENGINE_WRITE";
        self.reap(shared);
        if let Some(f) = self.failure.take() {
            return Err(format!("an earlier write failed: {f}"));
        }
        // The ring entry of this seq must not still be on its way for the
        // write SLOTS before.
        let slot_index = u64::from(seq) % SLOTS;
        while self
            .posted
            .iter()
            .any(|w| w.outbound == outbound && u64::from(w.seq) % SLOTS == slot_index)
        {
            self.settle_oldest(shared, self.link.config().settle_timeout);
        }
        let o = self
            .outbound
            .get(&outbound)
            .ok_or_else(|| format!("unknown outbound id {}", outbound.0))?;
        let registry = &shared.registry;
        let checked = check_tensor(CALL, src, registry.as_ref()).map_err(|e| e.to_string())?;
        let (region, at) = checked
            .range(CALL, src_offset, size)
            .map_err(|e| e.to_string())?;
        o.target
            .region()
            .check_range(CALL, dst_offset, size)
            .map_err(|e| e.to_string())?;
        let buffer = registry
            .get(region.handle)
            .ok_or("the source buffer was freed")?;
        let local = self
            .link
            .region_for(CALL, &buffer)
            .map_err(|e| e.to_string())?;
        let target = o.target.clone();
        let slot_target = o.slot_target.clone();
        let ring = o.ring.clone();
        let proof = slot_value(o.secret, seq);
        let imm = lane_imm(o.lane, seq);
        if self.posted.len() + 1 >= self.link.config().max_pending_writes {
            self.settle_oldest(shared, self.link.config().settle_timeout);
        }
        let pending = self
            .link
            .engine()
            .write(WriteRequest {
                src: &local,
                src_offset: at,
                dst: &target,
                dst_offset,
                len: size,
                imm: Some(imm),
            })
            .map_err(|e| e.to_string())?;
        self.posted.push_back(PostedWrite {
            pending,
            outbound,
            seq,
        });
        // Then the proof (secret, seq) into the lane's slot: the
        // destination's wait needs the immediates *and* the proof. Posted
        // after the data, so on an in-order transport with one NIC (verbs RC)
        // a proof that landed means the data landed; on unordered ones (libfabric)
        // a stray immediate sent while the real write is in flight can
        // still end the wait before its last piece is placed.
        let at_slot = slot_offset(seq);
        ring.write_at(at_slot as usize, &proof)
            .map_err(|e| e.to_string())?;
        let proved = self
            .link
            .engine()
            .write(WriteRequest {
                src: &ring,
                src_offset: at_slot,
                dst: &slot_target,
                dst_offset: at_slot,
                len: SLOT_BYTES,
                imm: None,
            })
            .map_err(|e| e.to_string())?;
        self.posted.push_back(PostedWrite {
            pending: proved,
            outbound,
            seq,
        });
        Ok(())
    }

    fn wait(
        &mut self,
        shared: &Shared,
        lane: LaneId,
        seq: u32,
        timeout_ms: u32,
        size: u64,
    ) -> std::result::Result<(), String> {
        self.reap(shared);
        let inbound = self
            .inbound
            .get(&lane)
            .ok_or_else(|| format!("lane {} is not open on this session", lane.0))?;
        if size > inbound.size {
            return Err(format!(
                "a write of {size} bytes does not fit the lane's {} bytes",
                inbound.size
            ));
        }
        let engine = self.link.engine();
        let expected = engine
            .expected_imms(&inbound.sender, 0, 0, WriteShape::Single { len: size })
            .map_err(|e| e.to_string())?;
        let timeout = Duration::from_millis(u64::from(timeout_ms)).min(self.link.config().max_wait);
        let deadline = Instant::now() + timeout;
        engine
            .wait_imm(lane_imm(lane, seq), expected, timeout)
            .map_err(|e| format!("lane {} seq {seq}: {e}", lane.0))?;
        // The immediates alone prove nothing (any sender can send any
        // immediate): the slot must hold this lane's secret and this seq.
        let want = slot_value(inbound.secret, seq);
        let mut got = [0u8; SLOT_BYTES as usize];
        loop {
            inbound
                .slots
                .read_at(slot_offset(seq) as usize, &mut got)
                .map_err(|e| e.to_string())?;
            if got == want {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "lane {} seq {seq}: the immediates arrived but the lane's slot does not \
                     hold this write's proof (an immediate from another sender?)",
                    lane.0
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        match self.failure.take() {
            Some(f) => Err(format!("an earlier write of this session failed: {f}")),
            None => Ok(()),
        }
    }

    fn record(
        &mut self,
        shared: &Shared,
        outbound: OutboundId,
        seq: u32,
        e: transfer_core::TransferError,
    ) {
        let msg = format!("write seq {seq} to outbound {}: {e}", outbound.0);
        self.log(shared, &format!("posted {msg}"));
        if let Some(o) = self.outbound.get(&outbound) {
            // A dead peer stays dead in the engine until forgotten; a later
            // ENGINE_OPEN_OUTBOUND then resolves it afresh.
            let _ = self.link.engine().forget_peer(o.target.peer());
        }
        self.failure.get_or_insert(msg);
    }

    /// Collects the outcome of every posted write that has finished.
    fn reap(&mut self, shared: &Shared) {
        let mut still = VecDeque::with_capacity(self.posted.len());
        while let Some(w) = self.posted.pop_front() {
            if !w.pending.is_done() {
                still.push_back(w);
                continue;
            }
            let PostedWrite {
                pending,
                outbound,
                seq,
            } = w;
            if let Err(e) = pending.wait_timeout(Duration::ZERO) {
                self.record(shared, outbound, seq, e);
            }
        }
        self.posted = still;
    }

    fn settle_oldest(&mut self, shared: &Shared, bound: Duration) {
        if let Some(w) = self.posted.pop_front() {
            let PostedWrite {
                pending,
                outbound,
                seq,
            } = w;
            if let Err(e) = pending.wait_timeout(bound) {
                self.record(shared, outbound, seq, e);
            }
        }
    }

    /// Waits (bounded by the configured settle timeout) until every posted
    /// write of this session has completed; failures are kept for the next
    /// ENGINE_WRITE / ENGINE_WAIT answer. Called before any command that
    /// could overwrite or free a buffer a posted write reads from.
    pub fn settle(&mut self, shared: &Shared) {
        if self.posted.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.link.config().settle_timeout;
        while !self.posted.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            self.settle_oldest(shared, left);
        }
    }

    /// Ends the session: settles posted writes, frees its lanes and
    /// outbound targets.
    pub fn close(&mut self, shared: &Shared) {
        self.settle(shared);
        for (lane, inb) in self.inbound.drain() {
            self.link.close_target(lane);
            self.link.drop_region(inb.slots);
        }
        self.link.lanes().free_all(self.session);
        self.link.end_session(self.session);
        for (_, o) in self.outbound.drain() {
            self.link.drop_region(o.ring);
        }
        if let Some(f) = self.failure.take() {
            self.log(shared, &format!("closing with an unreported failure: {f}"));
        }
    }
}

/// The host (and port) of a libfabric NIC address: `b"LF"`, version 1, the
/// provider name, the address format and the raw `fi_getname` bytes
/// (`transfer-efa`'s layout). IPv4/IPv6 socket addresses give their IP and
/// port; shm's names are this host's (loopback, no port); anything else
/// (EFA GIDs, verbs, test domains) has no IP to check.
pub fn nic_host(nic: &[u8]) -> Option<(std::net::IpAddr, Option<u16>)> {
    const FI_SOCKADDR: u32 = 1;
    const FI_SOCKADDR_IN: u32 = 2;
    const FI_SOCKADDR_IN6: u32 = 3;
    const FI_ADDR_STR: u32 = 9;
    if nic.get(..3) != Some(&b"LF\x01"[..]) {
        return None;
    }
    let prov_len = usize::from(*nic.get(3)?);
    let prov = nic.get(4..4 + prov_len)?;
    let af = u32::from_le_bytes(nic.get(4 + prov_len..8 + prov_len)?.try_into().ok()?);
    let raw = nic.get(8 + prov_len..)?;
    let family = u16::from_ne_bytes(raw.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(raw.get(2..4)?.try_into().ok()?);
    let v4 = |raw: &[u8]| {
        let b: [u8; 4] = raw.get(4..8)?.try_into().ok()?;
        Some((std::net::IpAddr::from(b), Some(port)))
    };
    let v6 = |raw: &[u8]| {
        let b: [u8; 16] = raw.get(8..24)?.try_into().ok()?;
        Some((std::net::IpAddr::from(b), Some(port)))
    };
    match af {
        FI_SOCKADDR_IN => v4(raw),
        FI_SOCKADDR_IN6 => v6(raw),
        FI_SOCKADDR if i32::from(family) == libc::AF_INET => v4(raw),
        FI_SOCKADDR if i32::from(family) == libc::AF_INET6 => v6(raw),
        FI_ADDR_STR if prov == b"shm" => Some((std::net::IpAddr::from([127, 0, 0, 1]), None)),
        _ => None,
    }
}

/// Whether `--peer-allow` lets this server's engine reach `addr`: every
/// NIC of every group must be allowed; a NIC without an IP only by `any`.
pub fn engine_destination_allowed(allow: &PeerAllow, addr: &EngineAddress) -> bool {
    if allow.permits_any() {
        return true;
    }
    addr.groups
        .iter()
        .flat_map(|g| g.nics.iter())
        .all(|nic| nic_host(&nic.0).is_some_and(|(ip, port)| allow.permits_ip(ip, port)))
}
