//! [`DomainGroup`]: the NICs one worker thread owns, and the bookkeeping of
//! what is in flight on them (fabric-lib's `domain_group.rs`).
//!
//! A request arrives as a job (`job.rs`); the group plans it into
//! per-NIC batches (`plan.rs`, pure), resolves peers through its peer
//! cache, submits one batch per NIC and counts the batches down
//! ([`Countdown`]) to one notification. The worker thread around it
//! (`worker.rs`) only feeds it jobs and polls it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::addr::{BackendKind, GroupAddress, Ordering};
use crate::callbacks::CallbackQueue;
use crate::completion::{Delivery, Notify};
use crate::countdown::Countdown;
use crate::domain::{Domain, DomainEvent, DomainMr, OpToken, PeerId, RecvToken, Registration};
use crate::error::{Result, TransferError};
use crate::imm_counter::ImmCounters;
use crate::job::{BarrierJob, PagedJob, ScatterJob, WriteJob};
use crate::memory::{MemoryLocation, MemorySpan};
use crate::peer::Peer;
use crate::plan::{Layout, PagedPiece, Piece, Plan, Resolve, Source};
use crate::recv_pool::RecvPool;
use crate::region::{HostBuffer, RegionInner};
use crate::shard::{ShardPolicy, split_pages};

/// Where a group's results go: the engine's callback thread and its
/// immediate counters (shared by every group of the engine).
pub(crate) struct Sinks {
    pub(crate) callbacks: Arc<CallbackQueue>,
    pub(crate) imms: Arc<ImmCounters>,
}

/// One logical operation in flight: its per-NIC batches counted down to
/// one notification; the source region is released when it ends.
struct InFlight {
    batches: Countdown,
    notify: Notify,
    src: Option<Arc<RegionInner>>,
}

impl InFlight {
    fn end(self, result: Result<()>, sinks: &Sinks) {
        if let Some(src) = &self.src {
            src.release();
        }
        sinks.callbacks.notify(self.notify, result);
    }
}

/// The [`PeerId`] each local NIC resolved for each peer's domain group, so a
/// peer is resolved once per NIC, not once per write.
#[derive(Default)]
struct PeerCache {
    /// `(peer id, its domain group index)` -> one slot per NIC.
    ids: HashMap<(u64, u32), Vec<Option<PeerId>>>,
}

/// The peer cache and the domains it resolves with, as a planning resolver.
struct Resolver<'a, D> {
    cache: &'a mut PeerCache,
    domains: &'a mut [D],
}

impl<D: Domain> Resolve for Resolver<'_, D> {
    fn resolve(&mut self, peer: &Peer, peer_domain_group: u32, nic: usize) -> Result<PeerId> {
        const CALL: &str = "resolve peer";
        let slots = self
            .cache
            .ids
            .entry((peer.0.id, peer_domain_group))
            .or_default();
        if let Some(Some(id)) = slots.get(nic) {
            return Ok(*id);
        }
        let addr = peer
            .0
            .addr
            .group(CALL, peer_domain_group as usize)?
            .nics
            .get(nic)
            .ok_or_else(|| {
                TransferError::invalid(CALL, format!("peer domain group has no NIC {nic}"))
            })?;
        let domain = self
            .domains
            .get_mut(nic)
            .ok_or_else(|| TransferError::invalid(CALL, format!("no local NIC {nic}")))?;
        let id = domain.resolve_peer(addr)?;
        if slots.len() <= nic {
            slots.resize(nic + 1, None);
        }
        slots[nic] = Some(id);
        Ok(id)
    }
}

/// 1..N domains (any N) of one backend, owned by one worker thread, so the
/// data path takes no locks. NIC `i` of this group pairs with NIC `i` of the
/// peer's group.
///
/// Field order is drop order: the NICs close first, so no DMA can touch
/// the regions and buffers dropped after them.
pub struct DomainGroup<D: Domain> {
    domains: Vec<D>,
    peers: PeerCache,
    /// Per-NIC batches of the operation being planned.
    plan: Plan,
    ops: HashMap<u64, InFlight>,
    next_token: u64,
    /// Regions registered with this group, kept alive while registered.
    regions: HashMap<u64, Arc<RegionInner>>,
    recv_pool: Option<(Arc<RecvPool>, DomainMr)>,
    /// A registered byte on every NIC: the local side of zero-byte
    /// (barrier) writes, which EFA wants registered.
    zero: (HostBuffer, Vec<DomainMr>),
    /// Rotates the first NIC of successive operations.
    next_start: usize,
}

impl<D: Domain> DomainGroup<D> {
    /// Groups `domains`; refuses an empty list or mixed backends.
    pub fn new(mut domains: Vec<D>) -> Result<Self> {
        const CALL: &str = "DomainGroup::new";
        let Some(first) = domains.first() else {
            return Err(TransferError::invalid(
                CALL,
                "a domain group needs at least one domain",
            ));
        };
        let backend = first.backend();
        if let Some(d) = domains.iter().find(|d| d.backend() != backend) {
            return Err(TransferError::BackendMismatch {
                call: CALL,
                expected: backend,
                got: d.backend(),
            });
        }
        let zero = HostBuffer::new(64)?;
        let span = MemorySpan {
            ptr: zero.as_ptr(),
            len: zero.len(),
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        let mut zero_mrs = Vec::with_capacity(domains.len());
        for d in &mut domains {
            zero_mrs.push(d.register(span)?.mr);
        }
        let mut group = Self {
            plan: Plan::new(Layout {
                nics: domains.len(),
                policy: ShardPolicy::default(),
                ordered: false,
                max_write: 0,
            }),
            domains,
            peers: PeerCache::default(),
            ops: HashMap::new(),
            next_token: 0,
            regions: HashMap::new(),
            recv_pool: None,
            zero: (zero, zero_mrs),
            next_start: 0,
        };
        group.set_shard_policy(ShardPolicy::default());
        Ok(group)
    }

    /// Sets how single writes are split over the NICs.
    pub fn set_shard_policy(&mut self, policy: ShardPolicy) {
        let addr = self.address(policy);
        self.plan = Plan::new(Layout {
            nics: self.domains.len(),
            policy,
            ordered: addr.ordering == Ordering::InOrder,
            max_write: addr.max_write_size,
        });
    }

    /// Number of NICs.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Always false (construction refuses empty groups).
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The backend of every domain.
    pub fn backend(&self) -> BackendKind {
        self.domains
            .first()
            .map_or(BackendKind::Test, Domain::backend)
    }

    /// All domains.
    pub fn domains(&self) -> &[D] {
        &self.domains
    }

    /// All domains, mutably.
    pub fn domains_mut(&mut self) -> &mut [D] {
        &mut self.domains
    }

    /// The group's address: InOrder only if every NIC delivers in order;
    /// the write size limit of its most limited NIC.
    pub fn address(&self, shard_policy: ShardPolicy) -> GroupAddress {
        let ordering = if self
            .domains
            .iter()
            .all(|d| d.info().ordering == Ordering::InOrder)
        {
            Ordering::InOrder
        } else {
            Ordering::Unordered
        };
        // 0 (no limit known) must not win the minimum.
        let max_write_size = self
            .domains
            .iter()
            .map(|d| d.info().max_write_size)
            .filter(|&m| m != 0)
            .min()
            .unwrap_or(0);
        GroupAddress {
            nics: self.domains.iter().map(Domain::address).collect(),
            ordering,
            shard_policy,
            max_write_size,
        }
    }

    /// Polls every domain, appending `(nic, event)` pairs.
    pub fn poll(&mut self, scratch: &mut Vec<DomainEvent>, out: &mut Vec<(usize, DomainEvent)>) {
        for (i, d) in self.domains.iter_mut().enumerate() {
            scratch.clear();
            d.poll(scratch);
            out.extend(scratch.drain(..).map(|e| (i, e)));
        }
    }

    /// Whether any domain has operations outstanding.
    pub fn has_pending(&self) -> bool {
        self.domains.iter().any(Domain::has_pending)
    }

    /// Whether nothing is in flight, here or in a domain: only then may
    /// the worker sleep (many providers progress only when polled).
    pub(crate) fn is_quiet(&self) -> bool {
        self.ops.is_empty() && !self.has_pending()
    }

    /// Whether the worker may sleep now: nothing in flight, or every
    /// domain's wait descriptor also wakes it for the work in flight
    /// ([`Domain::wait_covers_in_flight`]).
    pub(crate) fn may_sleep(&self) -> bool {
        self.is_quiet()
            || (!self.domains.is_empty() && self.domains.iter().all(Domain::wait_covers_in_flight))
    }

    // ---- memory -------------------------------------------------------

    /// Registers `span` with every NIC, or with none.
    pub(crate) fn register(&mut self, span: MemorySpan) -> Result<Vec<Registration>> {
        let mut regs = Vec::with_capacity(self.domains.len());
        for i in 0..self.domains.len() {
            match self.domains[i].register(span) {
                Ok(r) => regs.push(r),
                Err(e) => {
                    for (d, r) in self.domains.iter_mut().zip(&regs) {
                        let _ = d.unregister(r.mr);
                    }
                    return Err(e);
                }
            }
        }
        Ok(regs)
    }

    /// Keeps a registered region alive until it is unregistered.
    pub(crate) fn adopt(&mut self, region: Arc<RegionInner>) {
        self.regions.insert(region.id, region);
    }

    /// Releases a region on every NIC.
    pub(crate) fn unregister(&mut self, region: &RegionInner) -> Result<()> {
        let mut result = Ok(());
        for (d, mr) in self.domains.iter_mut().zip(&region.mrs) {
            match d.unregister(*mr) {
                // Already released by an earlier, partly refused attempt.
                Ok(()) | Err(TransferError::RegionUnregistered { .. }) => {}
                Err(e) => result = Err(e),
            }
        }
        if result.is_ok() {
            self.regions.remove(&region.id);
        } else {
            // A NIC still holds transfers it could not cancel (e.g.
            // failed by timeout): the memory stays allocated and
            // registered, and a later unregister may retry.
            region.reopen_for_unregister();
        }
        result
    }

    // ---- peers --------------------------------------------------------

    /// Forgets every NIC's connection to engine peer `id`.
    pub(crate) fn forget_peer(&mut self, id: u64) {
        let keys: Vec<_> = self
            .peers
            .ids
            .keys()
            .filter(|k| k.0 == id)
            .copied()
            .collect();
        for k in keys {
            let Some(ids) = self.peers.ids.remove(&k) else {
                continue;
            };
            for (d, p) in self.domains.iter_mut().zip(ids) {
                if let Some(p) = p {
                    d.remove_peer(p);
                }
            }
        }
    }

    /// An empty plan, and the resolver to fill it with.
    fn begin(&mut self) -> (&mut Plan, Resolver<'_, D>) {
        self.plan.begin();
        let resolver = Resolver {
            cache: &mut self.peers,
            domains: &mut self.domains,
        };
        (&mut self.plan, resolver)
    }

    fn next_start(&mut self) -> usize {
        self.next_start = self.next_start.wrapping_add(1);
        self.next_start
    }

    // ---- transfers ----------------------------------------------------

    pub(crate) fn write(&mut self, j: WriteJob, sinks: &Sinks) {
        let start = self.next_start();
        let (plan, mut resolve) = self.begin();
        let piece = Piece {
            src_offset: j.src_offset,
            dst: &j.dst,
            dst_offset: j.dst_offset,
            len: j.len,
        };
        let built = plan.single(source(&j.src), piece, j.imm, start, &mut resolve);
        self.launch(built, j.notify, Some(j.src), sinks);
    }

    pub(crate) fn paged(&mut self, j: PagedJob, sinks: &Sinks) {
        let start = self.next_start();
        let (plan, mut resolve) = self.begin();
        let paged = PagedPiece {
            src_pages: &j.src_pages,
            dst: &j.dst,
            dst_pages: &j.dst_pages,
            page_len: j.page_len,
        };
        let built = plan.paged(source(&j.src), paged, j.imm, start, &mut resolve);
        self.launch(built, j.notify, Some(j.src), sinks);
    }

    pub(crate) fn scatter(&mut self, j: ScatterJob, sinks: &Sinks) {
        let start = self.next_start();
        // Items go to the NICs in contiguous runs, as pages do (the first
        // 1/nics of them from NIC `start`, the next from the NIC after it),
        // not round robin: adjacent rows of a batch stay adjacent on their
        // NIC, where the domain merges them into one multi-segment write.
        // Round robin left two tcp endpoints per engine 15-25 % behind one
        // at 64 KiB rows (Python peers bench, `Engine(nics=2)`); with runs,
        // two were ahead of one (4.76-4.95 against 4.21-4.60 GB/s).
        let blocks = split_pages(j.items.len(), self.domains.len(), start);
        let (plan, mut resolve) = self.begin();
        let built = blocks
            .iter()
            .flat_map(|b| {
                j.items
                    .iter()
                    .skip(b.first)
                    .take(b.count)
                    .map(|item| (b.nic, item))
            })
            .try_for_each(|(nic, item)| {
                let piece = Piece {
                    src_offset: item.src_offset,
                    dst: &item.dst,
                    dst_offset: item.dst_offset,
                    len: item.len,
                };
                plan.single(source(&j.src), piece, j.imm, nic, &mut resolve)
            });
        self.launch(built, j.notify, Some(j.src), sinks);
    }

    pub(crate) fn barrier(&mut self, j: BarrierJob, sinks: &Sinks) {
        let start = self.next_start();
        let zero = Source {
            ptr: self.zero.0.as_ptr(),
            mrs: &self.zero.1,
        };
        self.plan.begin();
        let mut resolve = Resolver {
            cache: &mut self.peers,
            domains: &mut self.domains,
        };
        let built = self
            .plan
            .barrier(zero, &j.targets, j.imm, start, &mut resolve);
        self.launch(built, j.notify, None, sinks);
    }

    /// Sends a message from NIC 0 to the peer's NIC 0 of its domain group 0.
    pub(crate) fn send(&mut self, peer: &Peer, data: Vec<u8>, notify: Notify, sinks: &Sinks) {
        let resolved = Resolver {
            cache: &mut self.peers,
            domains: &mut self.domains,
        }
        .resolve(peer, 0, 0);
        let token = self.new_op(notify, None);
        match (resolved, self.domains.first_mut()) {
            (Ok(p), Some(d)) => {
                d.submit_send(OpToken(token), p, data);
                self.expect_batches(token, 1);
            }
            (Err(e), _) => self.finish(token, Some(e), sinks),
            (Ok(_), None) => self.finish(token, None, sinks),
        }
    }

    fn new_op(&mut self, notify: Notify, src: Option<Arc<RegionInner>>) -> u64 {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        let op = InFlight {
            batches: Countdown::new(0),
            notify,
            src,
        };
        self.ops.insert(token, op);
        token
    }

    fn expect_batches(&mut self, token: u64, n: usize) {
        if let Some(op) = self.ops.get_mut(&token) {
            op.batches.add(n);
        }
    }

    /// Submits the planned batches as one logical operation.
    fn launch(
        &mut self,
        built: Result<()>,
        notify: Notify,
        src: Option<Arc<RegionInner>>,
        sinks: &Sinks,
    ) {
        let token = self.new_op(notify, src);
        if let Err(e) = built {
            return self.finish(token, Some(e), sinks);
        }
        let mut submitted = 0;
        for (nic, batch) in self.plan.batches() {
            if let Some(d) = self.domains.get_mut(nic) {
                d.submit_writes(OpToken(token), batch);
                submitted += 1;
            }
        }
        if submitted == 0 {
            return self.finish(token, None, sinks);
        }
        self.expect_batches(token, submitted);
    }

    /// Ends operation `token` now (with `error` unless one was recorded).
    fn finish(&mut self, token: u64, error: Option<TransferError>, sinks: &Sinks) {
        if let Some(mut op) = self.ops.remove(&token) {
            let result = op.batches.finish(error);
            op.end(result, sinks);
        }
    }

    /// Takes a domain's report of one batch or an arriving immediate.
    /// `fired` is scratch space for the immediates' notifications.
    pub(crate) fn on_event(&mut self, ev: DomainEvent, sinks: &Sinks, fired: &mut Vec<Delivery>) {
        match ev {
            DomainEvent::Completed { op, result } => {
                let Some(state) = self.ops.get_mut(&op.0) else {
                    return;
                };
                if let Some(result) = state.batches.settle(result) {
                    if let Some(done) = self.ops.remove(&op.0) {
                        done.end(result, sinks);
                    }
                }
            }
            DomainEvent::Imm { imm } => {
                sinks.imms.arrive(imm, 1, fired);
                sinks.callbacks.deliver_all(fired.drain(..));
            }
            // Messages are the worker's: their buffers are reposted through its queue.
            DomainEvent::Received { .. } => {}
        }
    }

    // ---- receive pool -------------------------------------------------

    /// Registers the pool on NIC 0 and posts every buffer.
    pub(crate) fn start_recv_pool(&mut self, pool: Arc<RecvPool>) -> Result<()> {
        const CALL: &str = "start_recv_pool";
        if self.recv_pool.is_some() {
            return Err(TransferError::invalid(
                CALL,
                "a receive pool is already running",
            ));
        }
        let d = self
            .domains
            .first_mut()
            .ok_or_else(|| TransferError::invalid(CALL, "no NIC"))?;
        let reg = d.register(pool.span())?;
        for t in 0..pool.count() as u64 {
            if let Some(buf) = pool.buffer(t) {
                d.post_recv(RecvToken(t), reg.mr, buf, pool.buf_len())?;
            }
        }
        self.recv_pool = Some((pool, reg.mr));
        Ok(())
    }

    /// The running receive pool.
    pub(crate) fn recv_pool(&self) -> Option<&Arc<RecvPool>> {
        self.recv_pool.as_ref().map(|(p, _)| p)
    }

    /// Posts receive buffer `token` again after its message was delivered.
    pub(crate) fn repost(&mut self, token: u64) {
        let Some((pool, mr)) = &self.recv_pool else {
            return;
        };
        let (Some(buf), len) = (pool.buffer(token), pool.buf_len()) else {
            return;
        };
        if let Some(d) = self.domains.first_mut() {
            // A failed repost shrinks the pool; nothing else to do on this path.
            let _ = d.post_recv(RecvToken(token), *mr, buf, len);
        }
    }

    /// Closes the NICs, then fails everything still in flight. The NICs go
    /// first: once they are gone no DMA can touch the regions whose
    /// transfers are failed here.
    pub(crate) fn close(self, sinks: &Sinks) {
        let Self {
            domains,
            ops,
            regions,
            recv_pool,
            zero,
            ..
        } = self;
        drop(domains);
        drop(regions);
        drop(recv_pool);
        drop(zero);
        for (_, op) in ops {
            op.end(
                Err(TransferError::Shutdown {
                    call: "engine drop",
                }),
                sinks,
            );
        }
    }
}

fn source(region: &RegionInner) -> Source<'_> {
    Source {
        ptr: region.ptr,
        mrs: &region.mrs,
    }
}
