//! [`TestDomain`]: one NIC of the in-memory fabric.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rand::Rng;

use crate::addr::{BackendKind, NicAddress, Ordering};
use crate::countdown::Countdowns;
use crate::domain::{
    Domain, DomainEvent, DomainInfo, DomainMr, OpToken, PeerId, RecvToken, Registration, WriteOp,
};
use crate::error::{PeerLoss, Result, TransferError};
use crate::memory::{MemorySpan, RemoteKey, RemoteNicRegion};
use crate::wakeup::EventFd;

use super::fabric::{FabricState, Mr, TestFabric, decode_nic, encode_nic};

enum Posted {
    Write(WriteOp),
    Send { peer: PeerId, data: Vec<u8> },
}

struct PendingOp {
    token: OpToken,
    op: Posted,
}

/// One NIC of a [`TestFabric`].
pub struct TestDomain {
    fabric: TestFabric,
    id: u64,
    ordering: Ordering,
    mrs: HashMap<u64, (Mr, u64)>,
    next_mr: u64,
    peers: Vec<Option<u64>>,
    queue: VecDeque<PendingOp>,
    calls: Countdowns,
    ready: Vec<DomainEvent>,
    event: Option<Arc<EventFd>>,
}

impl TestDomain {
    pub(crate) fn new(
        fabric: TestFabric,
        id: u64,
        ordering: Ordering,
        event: Option<Arc<EventFd>>,
    ) -> Self {
        Self {
            fabric,
            id,
            ordering,
            mrs: HashMap::new(),
            next_mr: 1,
            peers: Vec::new(),
            queue: VecDeque::new(),
            calls: Countdowns::default(),
            ready: Vec::new(),
            event,
        }
    }

    fn peer_nic(&self, peer: PeerId) -> Option<u64> {
        self.peers
            .get(usize::try_from(peer.0).ok()?)
            .copied()
            .flatten()
    }

    fn done(&mut self, token: OpToken, result: Result<()>, events: &mut Vec<DomainEvent>) {
        events.extend(self.calls.settle(token, result));
    }

    fn execute_write(&self, s: &mut FabricState, w: &WriteOp) -> Result<()> {
        const CALL: &str = "TestDomain::write";
        if s.fail_writes > 0 {
            s.fail_writes -= 1;
            return Err(TransferError::Backend {
                call: CALL,
                backend: BackendKind::Test,
                code: 5,
                message: "injected failure".into(),
            });
        }
        if w.len as u64 > s.config.max_write_size {
            // As libfabric refuses a write above the endpoint's max_msg_size.
            return Err(TransferError::Backend {
                call: CALL,
                backend: BackendKind::Test,
                code: libc::EMSGSIZE,
                message: format!(
                    "write of {} bytes exceeds max_write_size {}",
                    w.len, s.config.max_write_size
                ),
            });
        }
        let nic = self
            .peer_nic(w.peer)
            .ok_or_else(|| TransferError::invalid(CALL, "unknown peer id"))?;
        let target = s
            .nics
            .get_mut(&nic)
            .ok_or_else(|| TransferError::unreachable(CALL, PeerLoss::Dead, "test NIC is gone"))?;
        let mr =
            *target
                .remote_mrs
                .get(&w.remote_key.0)
                .ok_or_else(|| TransferError::RemoteAccess {
                    call: CALL,
                    reason: format!("unknown remote key {:#x}", w.remote_key.0),
                })?;
        let off = w
            .remote_addr
            .checked_sub(mr.base)
            .and_then(|o| usize::try_from(o).ok());
        let in_range = off
            .and_then(|o| o.checked_add(w.len))
            .is_some_and(|end| end <= mr.len);
        let Some(off) = off.filter(|_| in_range) else {
            return Err(TransferError::RemoteAccess {
                call: CALL,
                reason: format!(
                    "remote range {:#x}+{} outside the region",
                    w.remote_addr, w.len
                ),
            });
        };
        if w.len > 0 {
            // SAFETY: both spans are registered memory the engines keep alive
            // while registered; the destination range was bounds-checked
            // against its registration above; the source was checked by the
            // engine at submit time. `copy` tolerates overlap (loopback).
            unsafe { std::ptr::copy(w.local, (mr.ptr as *mut u8).add(off), w.len) };
        }
        if let Some(imm) = w.imm {
            target.imms.push_back(imm);
            target.notify();
        }
        Ok(())
    }

    /// Delivers a message; `None` means no receive is posted yet (retry later).
    fn execute_send(&self, s: &mut FabricState, peer: PeerId, data: &[u8]) -> Option<Result<()>> {
        const CALL: &str = "TestDomain::send";
        let Some(nic) = self.peer_nic(peer) else {
            return Some(Err(TransferError::invalid(CALL, "unknown peer id")));
        };
        let Some(target) = s.nics.get_mut(&nic) else {
            return Some(Err(TransferError::unreachable(
                CALL,
                PeerLoss::Dead,
                "test NIC is gone",
            )));
        };
        let (token, ptr, len) = target.posted.pop_front()?;
        if data.len() > len {
            return Some(Err(TransferError::RemoteAccess {
                call: CALL,
                reason: format!(
                    "message of {} bytes exceeds the {len}-byte receive buffer",
                    data.len()
                ),
            }));
        }
        // SAFETY: the receive buffer was posted by the peer's engine, lies in
        // its registered pool, and is not touched by it until reported.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
        target.received.push_back((token, data.len()));
        target.notify();
        Some(Ok(()))
    }
}

impl Domain for TestDomain {
    fn backend(&self) -> BackendKind {
        BackendKind::Test
    }

    fn info(&self) -> DomainInfo {
        DomainInfo {
            name: format!("test{}", self.id),
            provider: "test".into(),
            link_speed_bps: 0,
            numa_node: None,
            ordering: self.ordering,
            max_write_size: self.fabric.lock().config.max_write_size,
        }
    }

    fn address(&self) -> NicAddress {
        encode_nic(self.id)
    }

    fn register(&mut self, span: MemorySpan) -> Result<Registration> {
        let mut s = self.fabric.lock();
        let key = s.next_key;
        s.next_key += 1;
        let base = if s.config.virt_addr {
            span.ptr as u64
        } else {
            0
        };
        let mr = Mr {
            ptr: span.ptr as usize,
            len: span.len,
            base,
        };
        let nic = s.nics.get_mut(&self.id).ok_or_else(|| {
            TransferError::unreachable(
                "TestDomain::register",
                PeerLoss::Dead,
                "this NIC was killed",
            )
        })?;
        nic.remote_mrs.insert(key, mr);
        drop(s);
        let id = self.next_mr;
        self.next_mr += 1;
        self.mrs.insert(id, (mr, key));
        Ok(Registration {
            mr: DomainMr(id),
            remote: RemoteNicRegion {
                base,
                key: RemoteKey(key),
            },
        })
    }

    fn unregister(&mut self, mr: DomainMr) -> Result<()> {
        {
            let mut s = self.fabric.lock();
            if s.refuse_unregisters > 0 {
                s.refuse_unregisters -= 1;
                return Err(TransferError::RegionBusy { in_flight: 1 });
            }
        }
        let (_, key) = self
            .mrs
            .remove(&mr.0)
            .ok_or(TransferError::RegionUnregistered {
                call: "TestDomain::unregister",
            })?;
        if let Some(nic) = self.fabric.lock().nics.get_mut(&self.id) {
            nic.remote_mrs.remove(&key);
        }
        Ok(())
    }

    fn resolve_peer(&mut self, addr: &NicAddress) -> Result<PeerId> {
        let nic = decode_nic(addr)?;
        self.peers.push(Some(nic));
        Ok(PeerId(self.peers.len() as u64 - 1))
    }

    fn remove_peer(&mut self, peer: PeerId) {
        if let Some(p) = usize::try_from(peer.0)
            .ok()
            .and_then(|i| self.peers.get_mut(i))
        {
            *p = None;
        }
    }

    fn post_recv(
        &mut self,
        token: RecvToken,
        _mr: DomainMr,
        buf: *mut u8,
        len: usize,
    ) -> Result<()> {
        let mut s = self.fabric.lock();
        let nic = s.nics.get_mut(&self.id).ok_or_else(|| {
            TransferError::unreachable(
                "TestDomain::post_recv",
                PeerLoss::Dead,
                "this NIC was killed",
            )
        })?;
        nic.posted.push_back((token.0, buf as usize, len));
        Ok(())
    }

    fn submit_send(&mut self, op: OpToken, peer: PeerId, data: Vec<u8>) {
        self.calls.expect(op, 1);
        self.queue.push_back(PendingOp {
            token: op,
            op: Posted::Send { peer, data },
        });
    }

    fn submit_writes(&mut self, op: OpToken, writes: &[WriteOp]) {
        let delay = self.fabric.lock().config.submit_delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if writes.is_empty() {
            self.ready
                .push(DomainEvent::Completed { op, result: Ok(()) });
            return;
        }
        self.calls.expect(op, writes.len());
        if let Some(nic) = self.fabric.lock().nics.get_mut(&self.id) {
            nic.writes_posted
                .extend(writes.iter().map(|w| (w.remote_addr, w.len)));
        }
        for w in writes {
            self.queue.push_back(PendingOp {
                token: op,
                op: Posted::Write(*w),
            });
        }
    }

    fn poll(&mut self, events: &mut Vec<DomainEvent>) {
        if let Some(e) = &self.event {
            // Like fi_cq_read resetting a wait object: what is pending is reported now.
            e.drain();
        }
        events.append(&mut self.ready);
        let fabric = self.fabric.clone();
        let mut s = fabric.lock();
        let budget = if s.held {
            0
        } else {
            s.config.ops_per_poll.max(1)
        };
        let reorder = s.config.reorder;
        let mut deferred = Vec::new();
        for _ in 0..budget {
            if self.queue.is_empty() {
                break;
            }
            let idx = if reorder {
                s.rng.gen_range(0..self.queue.len())
            } else {
                0
            };
            let Some(p) = self.queue.remove(idx) else {
                break;
            };
            match &p.op {
                Posted::Write(w) => {
                    let r = self.execute_write(&mut s, w);
                    self.done(p.token, r, events);
                }
                Posted::Send { peer, data } => match self.execute_send(&mut s, *peer, data) {
                    Some(r) => self.done(p.token, r, events),
                    None => deferred.push(p),
                },
            }
        }
        for p in deferred.into_iter().rev() {
            self.queue.push_front(p);
        }
        if let Some(nic) = s.nics.get_mut(&self.id) {
            events.extend(nic.imms.drain(..).map(|imm| DomainEvent::Imm { imm }));
            events.extend(
                nic.received
                    .drain(..)
                    .map(|(t, len)| DomainEvent::Received {
                        token: RecvToken(t),
                        len,
                    }),
            );
        }
    }

    fn has_pending(&self) -> bool {
        !self.queue.is_empty() || !self.ready.is_empty()
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.event.as_ref().map(|e| e.raw())
    }

    fn prepare_wait(&mut self) -> bool {
        if self.has_pending() {
            return false;
        }
        let s = self.fabric.lock();
        s.nics
            .get(&self.id)
            .is_none_or(|n| n.imms.is_empty() && n.received.is_empty())
    }
}

impl Drop for TestDomain {
    fn drop(&mut self) {
        self.fabric.lock().nics.remove(&self.id);
    }
}
