//! Worker threads: each owns one [`DomainGroup`] and everything it touches,
//! so the data path takes no locks. API threads feed it through a bounded
//! lock-free queue; it answers through completions and the callback thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use crate::callbacks::CallbackQueue;
use crate::completion::{Delivery, Notify};
use crate::domain::{
    Domain, DomainEvent, DomainMr, OpToken, PeerId, RecvToken, Registration, WriteOp,
};
use crate::error::{Result, TransferError};
use crate::group::DomainGroup;
use crate::idle::{IdlePolicy, IdleState, Sleep};
use crate::imm_counter::ImmCounters;
use crate::memory::MemorySpan;
use crate::oneshot;
use crate::peer::{Peer, RemoteTarget};
use crate::recv_pool::RecvPool;
use crate::region::{HostBuffer, RegionInner};
use crate::request::{Pages, ScatterItem};
use crate::shard::{ShardPolicy, shard_single_write, split_pages, split_write};
use crate::wakeup::{EventFd, wait_readable};

/// A memory span crossing to the worker thread.
pub(crate) struct SpanJob(pub(crate) MemorySpan);
// SAFETY: the span names memory that the caller keeps alive (see
// `TransferEngine::register_raw`); it is only handed to the NIC.
unsafe impl Send for SpanJob {}

pub(crate) struct WriteJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) src_offset: u64,
    pub(crate) len: u64,
    pub(crate) dst: RemoteTarget,
    pub(crate) dst_offset: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct PagedJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) src_pages: Pages,
    pub(crate) dst: RemoteTarget,
    pub(crate) dst_pages: Pages,
    pub(crate) page_len: u64,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct ScatterJob {
    pub(crate) src: Arc<RegionInner>,
    pub(crate) items: Vec<ScatterItem>,
    pub(crate) imm: Option<u32>,
    pub(crate) notify: Notify,
}

pub(crate) struct BarrierJob {
    pub(crate) targets: Arc<[RemoteTarget]>,
    pub(crate) imm: u32,
    pub(crate) notify: Notify,
}

/// A request for a worker.
pub(crate) enum Job {
    Register {
        span: SpanJob,
        reply: oneshot::Sender<Result<Vec<Registration>>>,
    },
    Adopt(Arc<RegionInner>),
    Unregister {
        region: Arc<RegionInner>,
        reply: oneshot::Sender<Result<()>>,
    },
    Write(WriteJob),
    Paged(PagedJob),
    Scatter(ScatterJob),
    Barrier(BarrierJob),
    Send {
        peer: Peer,
        data: Vec<u8>,
        notify: Notify,
    },
    StartRecvPool {
        pool: Arc<RecvPool>,
        reply: oneshot::Sender<Result<()>>,
    },
    Repost(u64),
    ForgetPeer(u64),
}

impl Job {
    /// Fails the job's notification (used when the worker is gone).
    fn fail(self, err: TransferError, callbacks: &CallbackQueue) {
        let notify = match self {
            Job::Write(j) => j.notify,
            Job::Paged(j) => j.notify,
            Job::Scatter(j) => j.notify,
            Job::Barrier(j) => j.notify,
            Job::Send { notify, .. } => notify,
            Job::Register { reply, .. } => return reply.send(Err(err)),
            Job::Unregister { reply, .. } | Job::StartRecvPool { reply, .. } => {
                return reply.send(Err(err));
            }
            Job::Adopt(_) | Job::Repost(_) | Job::ForgetPeer(_) => return,
        };
        if let Delivery::Deferred(job) = notify.deliver(Err(err)) {
            callbacks.push(job);
        }
    }
}

/// The queue into one worker.
pub(crate) struct WorkerQueue {
    jobs: ArrayQueue<Job>,
    thread: std::sync::OnceLock<Thread>,
    stop: AtomicBool,
    stopped: AtomicBool,
    /// Set while the worker blocks on wait descriptors (then `wake` signals `event`).
    sleeping: AtomicBool,
    event: Option<EventFd>,
    /// Times the worker blocked on wait descriptors / parked on a timer.
    pub(crate) blocked: AtomicU64,
    pub(crate) parked: AtomicU64,
}

impl WorkerQueue {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            jobs: ArrayQueue::new(capacity.max(1)),
            thread: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            // Without an eventfd the worker parks on timers instead of blocking.
            event: EventFd::new().ok(),
            blocked: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        })
    }

    pub(crate) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    fn wake(&self) {
        // SeqCst pairs with the worker's store of `sleeping` before its last
        // look at the queue: either it sees the job, or we see it sleeping.
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(e) = &self.event {
                e.signal();
            }
        }
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Hands a job to the worker. A full queue is backpressure: the caller
    /// waits (the worker never waits on API threads, so this cannot deadlock).
    pub(crate) fn push(&self, mut job: Job, callbacks: &CallbackQueue) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if self.stopped.load(Ordering::Acquire) {
                job.fail(TransferError::Shutdown { call: "submit" }, callbacks);
                return Err(TransferError::Shutdown { call: "submit" });
            }
            match self.jobs.push(job) {
                Ok(()) => {
                    self.wake();
                    return Ok(());
                }
                Err(j) => {
                    job = j;
                    self.wake();
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            }
        }
    }

    /// What the worker did when idle.
    pub(crate) fn idle_stats(&self) -> (u64, u64) {
        (
            self.blocked.load(Ordering::Relaxed),
            self.parked.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }
}

pub(crate) struct OpState {
    remaining: usize,
    error: Option<TransferError>,
    notify: Option<Notify>,
    src: Option<Arc<RegionInner>>,
}

/// Everything a worker thread owns.
pub(crate) struct Worker<D: Domain> {
    pub(crate) group: DomainGroup<D>,
    pub(crate) policy: ShardPolicy,
    /// Whether every NIC of the group delivers in order (one immediate per page block suffices).
    pub(crate) ordered: bool,
    /// Largest write every NIC of the group accepts (0: no limit); longer
    /// shards and pages are posted as several writes.
    pub(crate) max_write: u64,
    pub(crate) idle: IdlePolicy,
    pub(crate) queue: Arc<WorkerQueue>,
    pub(crate) callbacks: Arc<CallbackQueue>,
    pub(crate) imms: Arc<ImmCounters>,
    /// Tiny region registered on every domain: the local side of zero-byte writes.
    pub(crate) scratch_region: (HostBuffer, Vec<DomainMr>),
    pub(crate) ops: HashMap<u64, OpState>,
    pub(crate) next_token: u64,
    pub(crate) peers: HashMap<(u64, u32), Vec<Option<PeerId>>>,
    pub(crate) regions: HashMap<u64, Arc<RegionInner>>,
    pub(crate) batches: Vec<Vec<WriteOp>>,
    pub(crate) rr: usize,
    pub(crate) recv_pool: Option<(Arc<RecvPool>, DomainMr)>,
    /// Scratch list of descriptors to block on.
    pub(crate) wait_fds: Vec<std::os::fd::RawFd>,
}

/// Jobs taken per loop pass before the NICs are polled again, so a flood of
/// submits cannot starve completions.
const JOBS_PER_PASS: usize = 64;

impl<D: Domain> Worker<D> {
    pub(crate) fn run(mut self) {
        let mut idle = IdleState::new(self.idle);
        let mut scratch = Vec::with_capacity(64);
        let mut events = Vec::with_capacity(64);
        let mut fired = Vec::new();
        loop {
            let mut busy = false;
            for _ in 0..JOBS_PER_PASS {
                let Some(job) = self.queue.jobs.pop() else {
                    break;
                };
                busy = true;
                self.handle(job);
            }
            self.group.poll(&mut scratch, &mut events);
            busy |= !events.is_empty();
            for (nic, ev) in events.drain(..) {
                self.on_event(nic, ev, &mut fired);
            }
            if self.queue.stop.load(Ordering::Acquire) {
                break;
            }
            if busy {
                idle.active();
            } else if let Some(sleep) = idle.idle(self.ops.is_empty() && !self.group.has_pending())
            {
                if !self.sleep(sleep) {
                    // A NIC had work without reporting an event (data placed
                    // by a manual-progress provider): traffic is flowing, so
                    // spin again rather than block between arrivals.
                    idle.active();
                }
            }
        }
        self.shutdown();
    }

    /// Sleeps until work may be there: blocked on the NICs' wait
    /// descriptors and the submit eventfd when every NIC has one, else a
    /// timed park.
    /// Returns false when a NIC refused to wait because it has work.
    fn sleep(&mut self, sleep: Sleep) -> bool {
        let park = |q: &WorkerQueue| {
            q.parked.fetch_add(1, Ordering::Relaxed);
            std::thread::park_timeout(sleep.park);
            true
        };
        let Some(event) = &self.queue.event else {
            return park(&self.queue);
        };
        self.wait_fds.clear();
        self.wait_fds.push(event.raw());
        for d in self.group.domains() {
            match d.wait_fd() {
                Some(fd) => self.wait_fds.push(fd),
                None => return park(&self.queue),
            }
        }
        if !self
            .group
            .domains_mut()
            .iter_mut()
            .all(|d| d.prepare_wait())
        {
            return false;
        }
        self.queue.sleeping.store(true, Ordering::SeqCst);
        if self.queue.jobs.is_empty() && !self.queue.stop.load(Ordering::SeqCst) {
            self.queue.blocked.fetch_add(1, Ordering::Relaxed);
            wait_readable(&self.wait_fds, sleep.block);
        }
        self.queue.sleeping.store(false, Ordering::SeqCst);
        event.drain();
        true
    }

    fn shutdown(mut self) {
        self.queue.stopped.store(true, Ordering::Release);
        // Close the NICs first: once the domains are gone no DMA can touch
        // the regions whose transfers we are about to fail.
        let ops = std::mem::take(&mut self.ops);
        let regions = std::mem::take(&mut self.regions);
        let pool = self.recv_pool.take();
        let Worker {
            group,
            queue,
            callbacks,
            ..
        } = self;
        drop(group);
        drop(regions);
        drop(pool);
        for (_, op) in ops {
            if let Some(src) = &op.src {
                src.release();
            }
            if let Some(n) = op.notify {
                push_delivery(
                    &callbacks,
                    n.deliver(Err(TransferError::Shutdown {
                        call: "engine drop",
                    })),
                );
            }
        }
        while let Some(job) = queue.jobs.pop() {
            job.fail(
                TransferError::Shutdown {
                    call: "engine drop",
                },
                &callbacks,
            );
        }
    }

    fn handle(&mut self, job: Job) {
        match job {
            Job::Register { span, reply } => reply.send(self.register(span.0)),
            Job::Adopt(region) => {
                self.regions.insert(region.id, region);
            }
            Job::Unregister { region, reply } => {
                let mut result = Ok(());
                for (d, mr) in self.group.domains_mut().iter_mut().zip(&region.mrs) {
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
                reply.send(result);
            }
            Job::Write(j) => self.write(j),
            Job::Paged(j) => self.paged(j),
            Job::Scatter(j) => self.scatter(j),
            Job::Barrier(j) => self.barrier(j),
            Job::Send { peer, data, notify } => self.send(&peer, data, notify),
            Job::StartRecvPool { pool, reply } => reply.send(self.start_recv_pool(pool)),
            Job::Repost(token) => self.repost(token),
            Job::ForgetPeer(id) => {
                let keys: Vec<_> = self.peers.keys().filter(|k| k.0 == id).copied().collect();
                for k in keys {
                    if let Some(ids) = self.peers.remove(&k) {
                        for (nic, p) in ids.into_iter().enumerate() {
                            if let (Some(p), Some(d)) = (p, self.group.domain_mut(nic)) {
                                d.remove_peer(p);
                            }
                        }
                    }
                }
            }
        }
    }

    fn register(&mut self, span: MemorySpan) -> Result<Vec<Registration>> {
        let mut regs = Vec::with_capacity(self.group.len());
        for i in 0..self.group.len() {
            let Some(d) = self.group.domain_mut(i) else {
                break;
            };
            match d.register(span) {
                Ok(r) => regs.push(r),
                Err(e) => {
                    for (d, r) in self.group.domains_mut().iter_mut().zip(&regs) {
                        let _ = d.unregister(r.mr);
                    }
                    return Err(e);
                }
            }
        }
        Ok(regs)
    }

    fn resolve(&mut self, peer: &Peer, remote_group: u32, nic: usize) -> Result<PeerId> {
        let key = (peer.0.id, remote_group);
        let nics = peer
            .0
            .addr
            .group("resolve peer", remote_group as usize)?
            .nics
            .len();
        let slot = self.peers.entry(key).or_insert_with(|| vec![None; nics]);
        if let Some(Some(p)) = slot.get(nic) {
            return Ok(*p);
        }
        let addr = peer
            .0
            .addr
            .group("resolve peer", remote_group as usize)?
            .nics
            .get(nic)
            .ok_or_else(|| {
                TransferError::invalid("resolve peer", format!("peer group has no NIC {nic}"))
            })?;
        let d = self
            .group
            .domain_mut(nic)
            .ok_or_else(|| TransferError::invalid("resolve peer", format!("no local NIC {nic}")))?;
        let id = d.resolve_peer(addr)?;
        if let Some(s) = self.peers.get_mut(&key).and_then(|v| v.get_mut(nic)) {
            *s = Some(id);
        }
        Ok(id)
    }

    fn next_rr(&mut self) -> usize {
        self.rr = self.rr.wrapping_add(1);
        self.rr
    }

    fn clear_batches(&mut self) {
        let n = self.group.len();
        self.batches.resize_with(n, Vec::new);
        for b in &mut self.batches {
            b.clear();
        }
    }

    /// Appends the shards of one single write to the per-NIC batches.
    #[allow(clippy::too_many_arguments)]
    fn push_single(
        &mut self,
        src: &RegionInner,
        src_offset: u64,
        dst: &RemoteTarget,
        dst_offset: u64,
        len: u64,
        imm: Option<u32>,
        start: usize,
    ) -> Result<()> {
        let nics = dst.nics_with(self.group.len());
        for shard in shard_single_write(len, nics, start, self.policy) {
            let peer = self.resolve(&dst.peer, dst.region.group, shard.nic)?;
            let remote = dst.region.nics[shard.nic];
            // Pieces within the NICs' limit (see `expected_imms`): in order,
            // the last piece's immediate lands last; unordered, each piece
            // needs its own.
            for (piece, piece_len) in split_write(shard.len, self.max_write) {
                let offset = shard.offset + piece;
                let local_off = usize::try_from(src_offset + offset)
                    .map_err(|_| TransferError::invalid("write", "offset overflows usize"))?;
                let len = usize::try_from(piece_len)
                    .map_err(|_| TransferError::invalid("write", "length overflows usize"))?;
                let last = piece + piece_len == shard.len;
                self.batches[shard.nic].push(WriteOp {
                    local_mr: src.mrs[shard.nic],
                    // SAFETY (pointer arithmetic only): offset checked against the region on submit.
                    local: src.ptr.wrapping_add(local_off),
                    len,
                    peer,
                    remote_addr: remote.base.wrapping_add(dst_offset + offset),
                    remote_key: remote.key,
                    imm: if self.ordered && !last { None } else { imm },
                });
            }
        }
        Ok(())
    }

    fn write(&mut self, j: WriteJob) {
        self.clear_batches();
        let start = self.next_rr();
        let r = self.push_single(
            &j.src,
            j.src_offset,
            &j.dst,
            j.dst_offset,
            j.len,
            j.imm,
            start,
        );
        self.launch(r, j.notify, Some(j.src));
    }

    fn paged(&mut self, j: PagedJob) {
        self.clear_batches();
        let r = self.build_paged(&j);
        self.launch(r, j.notify, Some(j.src));
    }

    fn build_paged(&mut self, j: &PagedJob) -> Result<()> {
        const CALL: &str = "paged write";
        let nics = j.dst.nics_with(self.group.len());
        let ordered = self.ordered;
        for block in split_pages(j.src_pages.indices.len(), nics, self.next_rr()) {
            let peer = self.resolve(&j.dst.peer, j.dst.region.group, block.nic)?;
            let remote = j.dst.region.nics[block.nic];
            for i in block.first..block.first + block.count {
                let (Some(s), Some(d)) = (j.src_pages.byte_offset(i), j.dst_pages.byte_offset(i))
                else {
                    return Err(TransferError::invalid(CALL, "page offset overflow"));
                };
                let last_page = i + 1 == block.first + block.count;
                // Pages above the NICs' limit go as several writes; the
                // immediate rules are those of `push_single`.
                for (piece, piece_len) in split_write(j.page_len, self.max_write) {
                    let local = usize::try_from(s + piece)
                        .map_err(|_| TransferError::invalid(CALL, "offset overflows usize"))?;
                    let len = usize::try_from(piece_len)
                        .map_err(|_| TransferError::invalid(CALL, "page length overflows usize"))?;
                    let last = last_page && piece + piece_len == j.page_len;
                    self.batches[block.nic].push(WriteOp {
                        local_mr: j.src.mrs[block.nic],
                        local: j.src.ptr.wrapping_add(local),
                        len,
                        peer,
                        remote_addr: remote.base.wrapping_add(d + piece),
                        remote_key: remote.key,
                        imm: if ordered && !last { None } else { j.imm },
                    });
                }
            }
        }
        Ok(())
    }

    fn scatter(&mut self, j: ScatterJob) {
        self.clear_batches();
        let start = self.next_rr();
        let mut r = Ok(());
        for (i, item) in j.items.iter().enumerate() {
            r = self.push_single(
                &j.src,
                item.src_offset,
                &item.dst,
                item.dst_offset,
                item.len,
                j.imm,
                start + i,
            );
            if r.is_err() {
                break;
            }
        }
        self.launch(r, j.notify, Some(j.src));
    }

    fn barrier(&mut self, j: BarrierJob) {
        self.clear_batches();
        let start = self.next_rr();
        let mut r = Ok(());
        for (i, t) in j.targets.iter().enumerate() {
            let nic = (start + i) % t.nics_with(self.group.len());
            match self.resolve(&t.peer, t.region.group, nic) {
                Ok(peer) => {
                    let remote = t.region.nics[nic];
                    self.batches[nic].push(WriteOp {
                        local_mr: self.scratch_region.1[nic],
                        local: self.scratch_region.0.as_ptr(),
                        len: 0,
                        peer,
                        remote_addr: remote.base,
                        remote_key: remote.key,
                        imm: Some(j.imm),
                    });
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        self.launch(r, j.notify, None);
    }

    fn send(&mut self, peer: &Peer, data: Vec<u8>, notify: Notify) {
        let token = self.new_op(notify, None);
        match self.resolve(peer, 0, 0) {
            Ok(p) => {
                if let Some(d) = self.group.domain_mut(0) {
                    d.submit_send(OpToken(token), p, data);
                    if let Some(op) = self.ops.get_mut(&token) {
                        op.remaining = 1;
                    }
                }
            }
            Err(e) => self.finish(token, Some(e)),
        }
    }

    fn new_op(&mut self, notify: Notify, src: Option<Arc<RegionInner>>) -> u64 {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        self.ops.insert(
            token,
            OpState {
                remaining: 0,
                error: None,
                notify: Some(notify),
                src,
            },
        );
        token
    }

    /// Submits the filled batches as one logical operation.
    fn launch(&mut self, built: Result<()>, notify: Notify, src: Option<Arc<RegionInner>>) {
        let token = self.new_op(notify, src);
        if let Err(e) = built {
            return self.finish(token, Some(e));
        }
        let mut submitted = 0;
        for (nic, batch) in self.batches.iter().enumerate() {
            if batch.is_empty() {
                continue;
            }
            if let Some(d) = self.group.domain_mut(nic) {
                d.submit_writes(OpToken(token), batch);
                submitted += 1;
            }
        }
        if submitted == 0 {
            return self.finish(token, None);
        }
        if let Some(op) = self.ops.get_mut(&token) {
            op.remaining = submitted;
        }
    }

    fn finish(&mut self, token: u64, error: Option<TransferError>) {
        if let Some(mut op) = self.ops.remove(&token) {
            if let Some(src) = op.src.take() {
                src.release();
            }
            let result = match error.or(op.error) {
                Some(e) => Err(e),
                None => Ok(()),
            };
            if let Some(n) = op.notify.take() {
                push_delivery(&self.callbacks, n.deliver(result));
            }
        }
    }

    fn on_event(&mut self, nic: usize, ev: DomainEvent, fired: &mut Vec<Delivery>) {
        match ev {
            DomainEvent::Completed { op, result } => {
                let Some(state) = self.ops.get_mut(&op.0) else {
                    return;
                };
                if let Err(e) = result {
                    state.error.get_or_insert(e);
                }
                state.remaining = state.remaining.saturating_sub(1);
                if state.remaining == 0 {
                    self.finish(op.0, None);
                }
            }
            DomainEvent::Imm { imm } => {
                self.imms.arrive(imm, 1, fired);
                for d in fired.drain(..) {
                    push_delivery(&self.callbacks, d);
                }
            }
            DomainEvent::Received { token, len } => {
                if nic != 0 {
                    return;
                }
                if let Some((pool, _)) = &self.recv_pool {
                    let pool = pool.clone();
                    let queue = self.queue.clone();
                    let callbacks = self.callbacks.clone();
                    self.callbacks.push(Box::new(move || {
                        pool.deliver(token.0, len);
                        let _ = queue.push(Job::Repost(token.0), &callbacks);
                    }));
                }
            }
        }
    }

    fn start_recv_pool(&mut self, pool: Arc<RecvPool>) -> Result<()> {
        const CALL: &str = "start_recv_pool";
        if self.recv_pool.is_some() {
            return Err(TransferError::invalid(
                CALL,
                "a receive pool is already running",
            ));
        }
        let d = self
            .group
            .domain_mut(0)
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

    fn repost(&mut self, token: u64) {
        let Some((pool, mr)) = &self.recv_pool else {
            return;
        };
        let (Some(buf), len, mr) = (pool.buffer(token), pool.buf_len(), *mr) else {
            return;
        };
        if let Some(d) = self.group.domain_mut(0) {
            // A failed repost shrinks the pool; nothing else to do on this path.
            let _ = d.post_recv(RecvToken(token), mr, buf, len);
        }
    }
}

fn push_delivery(callbacks: &CallbackQueue, d: Delivery) {
    if let Delivery::Deferred(job) = d {
        callbacks.push(job);
    }
}
