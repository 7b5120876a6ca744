//! The [`TransferEngine`]: the public API over one or more domain groups.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::addr::{BackendKind, EngineAddress, GroupAddress};
use crate::assist::Assist;
use crate::callbacks::{CallbackQueue, CallbackThread};
use crate::completion::{Delivery, Notify, Pending};
use crate::domain::Domain;
use crate::error::{Result, TransferError};
use crate::group::{DomainGroup, Sinks};
use crate::idle::IdlePolicy;
use crate::imm_counter::{ImmAction, ImmCounters};
use crate::job::{Job, SpanJob};
use crate::memory::{MemoryLocation, MemorySpan, RemoteRegion};
use crate::oneshot;
use crate::peer::{Peer, PeerGroup, PeerInner, RemoteTarget};
use crate::progress::{
    CallerProgress, InlineWorker, ProgressHandle, ProgressMode, Slot, drive_for, in_pass,
    poll_driving,
};
use crate::recv_pool::{RecvCallback, RecvPool};
use crate::region::{HostBuffer, LocalRegion, RegionInner};
use crate::request::{
    BarrierRequest, PagedWriteRequest, Request, ScatterItem, ScatterRequest, SendRequest, Slice,
    WriteRequest,
};
use crate::shard::{ShardPolicy, WriteShape, expected_imms};
use crate::topology;
use crate::worker::{Worker, WorkerQueue, run_shared};

/// Default capacity of each worker's request queue (fabric-lib uses 128;
/// a deeper queue absorbs bursts of paged writes from many API threads).
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// Default of [`EngineBuilder::max_unexpected_imms`]. Arrivals may precede
/// their expectation (EFA SRD reorders, and a receiver may set it late), so
/// some must be kept; this many distinct values cost a few MiB at most.
pub const DEFAULT_MAX_UNEXPECTED_IMMS: usize = 65_536;

type Spawner = Box<dyn FnOnce(&SpawnContext) -> Result<Spawned>>;

/// A started group: its address, its queue, and its worker state when
/// callers drive it (else a thread owns that state).
struct Spawned {
    addr: GroupAddress,
    handle: WorkerHandle,
    inline: Option<Box<dyn InlineWorker>>,
    /// The state a worker thread shares with assisting callers.
    shared: Option<Arc<Slot>>,
}

struct SpawnContext {
    index: usize,
    mode: ProgressMode,
    idle: IdlePolicy,
    policy: ShardPolicy,
    pin: bool,
    queue_capacity: usize,
    callbacks: Arc<CallbackQueue>,
    imms: Arc<ImmCounters>,
}

struct WorkerHandle {
    queue: Arc<WorkerQueue>,
    thread: Option<JoinHandle<()>>,
}

/// Configures and starts a [`TransferEngine`].
pub struct EngineBuilder {
    spawners: Vec<(BackendKind, Spawner)>,
    /// CUDA device of each group (same order as `spawners`).
    devices: Vec<Option<u32>>,
    idle: IdlePolicy,
    policy: ShardPolicy,
    pin: bool,
    queue_capacity: usize,
    max_unexpected_imms: usize,
    progress: ProgressMode,
    assist_window: Option<Duration>,
    errors: Vec<TransferError>,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            spawners: Vec::new(),
            devices: Vec::new(),
            idle: IdlePolicy::default(),
            policy: ShardPolicy::default(),
            pin: true,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            max_unexpected_imms: DEFAULT_MAX_UNEXPECTED_IMMS,
            progress: ProgressMode::Thread,
            assist_window: crate::assist::window_from_env(),
            errors: Vec::new(),
        }
    }
}

impl EngineBuilder {
    /// Adds a domain group; it gets its own worker thread. Group indices
    /// follow the order of calls.
    pub fn group<D: Domain>(self, domains: Vec<D>) -> Self {
        self.add_group(None, domains)
    }

    /// Adds the domain group of CUDA device `cuda_device` (its NICs): regions
    /// registered with [`TransferEngine::register`] in that device's memory
    /// are routed to it.
    pub fn group_on_device<D: Domain>(self, cuda_device: u32, domains: Vec<D>) -> Self {
        self.add_group(Some(cuda_device), domains)
    }

    fn add_group<D: Domain>(mut self, device: Option<u32>, domains: Vec<D>) -> Self {
        match DomainGroup::new(domains) {
            Ok(group) => {
                let backend = group.backend();
                self.spawners
                    .push((backend, Box::new(move |ctx| spawn_worker(group, ctx))));
                self.devices.push(device);
            }
            Err(e) => self.errors.push(e),
        }
        self
    }

    /// How idle workers wait (default: spin 200 µs, then park up to 1 ms).
    pub fn idle_policy(mut self, idle: IdlePolicy) -> Self {
        self.idle = idle;
        self
    }

    /// How single writes are split over NICs.
    pub fn shard_policy(mut self, policy: ShardPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Pin each worker to the CPUs of its first NIC's NUMA node when known (default on).
    pub fn pin_workers(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// Capacity of each worker's request queue.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity;
        self
    }

    /// At most this many distinct immediate values are held with arrivals
    /// that no expectation waits for (default
    /// [`DEFAULT_MAX_UNEXPECTED_IMMS`]). Peers choose the values, so without
    /// a bound they could grow the engine's memory at will; an arrival that
    /// would need one more is dropped and counted by
    /// [`TransferEngine::imm_dropped`]. Expected values (an expectation is
    /// waiting) are always counted, and consuming the arrivals of a value
    /// frees its place.
    pub fn max_unexpected_imms(mut self, max: usize) -> Self {
        self.max_unexpected_imms = max;
        self
    }

    /// Who drives the NICs (default [`ProgressMode::Thread`]: a worker
    /// thread per group). [`ProgressMode::Caller`] starts no thread at all.
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.progress = mode;
        self
    }

    /// With worker threads: how long a thread waiting on a small transfer
    /// drives the NICs itself before it blocks; `None` hands everything to
    /// the worker. Default: `TRANSFER_ASSIST_US` (µs, `0` = off), else
    /// [`crate::assist::DEFAULT_WINDOW`]. See [`crate::assist`].
    pub fn assist(mut self, window: Option<Duration>) -> Self {
        self.assist_window = window.filter(|w| !w.is_zero());
        self
    }

    /// Starts the workers and the callback thread (none of either with
    /// [`ProgressMode::Caller`]).
    pub fn build(self) -> Result<TransferEngine> {
        const CALL: &str = "EngineBuilder::build";
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        let Some(&(backend, _)) = self.spawners.first() else {
            return Err(TransferError::invalid(
                CALL,
                "an engine needs at least one domain group",
            ));
        };
        if let Some(&(other, _)) = self.spawners.iter().find(|(b, _)| *b != backend) {
            return Err(TransferError::BackendMismatch {
                call: CALL,
                expected: backend,
                got: other,
            });
        }
        let (callbacks, callback_thread) = match self.progress {
            ProgressMode::Thread => {
                let t = CallbackThread::spawn("transfer-callbacks".into()).map_err(|e| {
                    TransferError::invalid(CALL, format!("spawning the callback thread: {e}"))
                })?;
                (t.queue(), Some(t))
            }
            ProgressMode::Caller => (CallbackQueue::inline(), None),
        };
        let imms = ImmCounters::with_cap(self.max_unexpected_imms);
        let mut parts = Parts {
            backend,
            groups: Vec::new(),
            workers: Vec::new(),
            inline: Vec::new(),
            shared: Vec::new(),
            assist_window: self.assist_window,
            callbacks,
            callback_thread,
            imms,
        };
        for (index, (_, spawn)) in self.spawners.into_iter().enumerate() {
            let ctx = SpawnContext {
                index,
                mode: self.progress,
                idle: self.idle,
                policy: self.policy,
                pin: self.pin,
                queue_capacity: self.queue_capacity,
                callbacks: parts.callbacks.clone(),
                imms: parts.imms.clone(),
            };
            // On failure, already started workers are stopped by the engine's Drop below.
            let spawned = match spawn(&ctx) {
                Ok(v) => v,
                Err(e) => {
                    drop(TransferEngine::assemble(parts));
                    return Err(e);
                }
            };
            parts.groups.push(spawned.addr);
            parts.inline.extend(spawned.inline);
            if let Some(slot) = spawned.shared {
                parts.shared.push((slot, spawned.handle.queue.clone()));
            }
            parts.workers.push(spawned.handle);
        }
        let mut engine = TransferEngine::assemble(parts);
        engine.devices = self.devices;
        Ok(engine)
    }
}

/// What an engine is assembled from.
struct Parts {
    backend: BackendKind,
    groups: Vec<GroupAddress>,
    workers: Vec<WorkerHandle>,
    /// Worker states of a caller-driven engine (empty with threads).
    inline: Vec<Box<dyn InlineWorker>>,
    /// Worker threads' states and queues, for assisting callers (thread
    /// mode with assisting on).
    shared: Vec<(Arc<Slot>, Arc<WorkerQueue>)>,
    assist_window: Option<Duration>,
    callbacks: Arc<CallbackQueue>,
    callback_thread: Option<CallbackThread>,
    imms: Arc<ImmCounters>,
}

fn spawn_worker<D: Domain>(mut group: DomainGroup<D>, ctx: &SpawnContext) -> Result<Spawned> {
    const CALL: &str = "EngineBuilder::build";
    group.set_shard_policy(ctx.policy);
    let addr = group.address(ctx.policy);
    let numa = group.domains().first().and_then(|d| d.info().numa_node);
    let queue = WorkerQueue::new(ctx.queue_capacity);
    let sinks = Sinks {
        callbacks: ctx.callbacks.clone(),
        imms: ctx.imms.clone(),
    };
    let worker = Worker::new(group, queue.clone(), sinks);
    if ctx.mode == ProgressMode::Caller {
        return Ok(Spawned {
            addr,
            handle: WorkerHandle {
                queue,
                thread: None,
            },
            inline: Some(worker.into_inline()),
            shared: None,
        });
    }
    let slot: Arc<Slot> = Arc::new(Mutex::new(Some(Box::new(worker))));
    let shared = slot.clone();
    let (idle, thread_queue) = (ctx.idle, queue.clone());
    let pin = if ctx.pin {
        numa.and_then(topology::numa_node_cpus)
    } else {
        None
    };
    let thread = std::thread::Builder::new()
        .name(format!("transfer-worker-{}", ctx.index))
        .spawn(move || {
            if let Some(cpus) = pin {
                // Pinning is an optimisation; an unpinned worker still works.
                let _ = topology::pin_current_thread(&cpus);
            }
            run_shared(slot, thread_queue, idle);
        })
        .map_err(|e| TransferError::invalid(CALL, format!("spawning a worker: {e}")))?;
    queue.set_thread(thread.thread().clone());
    Ok(Spawned {
        addr,
        handle: WorkerHandle {
            queue,
            thread: Some(thread),
        },
        inline: None,
        shared: Some(shared),
    })
}

/// The TransferEngine: registers memory, sends messages, writes into peers'
/// memory with optional immediates, and counts the immediates it receives.
///
/// All methods take `&self`; share the engine between threads with `Arc`.
/// Dropping it fails every transfer still in flight with
/// [`TransferError::Shutdown`], closes the NICs and joins every thread.
pub struct TransferEngine {
    address: EngineAddress,
    workers: Vec<WorkerHandle>,
    callbacks: Arc<CallbackQueue>,
    callback_thread: Option<CallbackThread>,
    imms: Arc<ImmCounters>,
    /// The groups' worker states when callers drive them.
    caller: Option<Arc<CallerProgress>>,
    /// Worker threads' states, for submitters and waiters to drive
    /// (assisted thread mode; `None` when off or caller-driven).
    assist: Option<Arc<Assist>>,
    peers: Mutex<HashMap<EngineAddress, Peer>>,
    next_id: AtomicU64,
    /// CUDA device of each group, if any.
    devices: Vec<Option<u32>>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("address", &self.address)
            .finish()
    }
}

impl TransferEngine {
    /// A builder; add at least one domain group.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    fn assemble(parts: Parts) -> Self {
        let Parts {
            backend,
            groups,
            workers,
            inline,
            shared,
            assist_window,
            callbacks,
            callback_thread,
            imms,
        } = parts;
        let caller =
            (callback_thread.is_none()).then(|| CallerProgress::new(inline, callbacks.clone()));
        let assist = match assist_window {
            Some(window) if caller.is_none() && !shared.is_empty() => {
                Some(Assist::new(shared, window))
            }
            _ => None,
        };
        Self {
            address: EngineAddress { backend, groups },
            workers,
            callbacks,
            callback_thread,
            imms,
            caller,
            assist,
            peers: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            devices: Vec::new(),
        }
    }

    /// The group a region at `location` belongs to: the group added with
    /// [`EngineBuilder::group_on_device`] for that device, group 0 for host memory.
    pub fn group_of(&self, location: MemoryLocation) -> Result<usize> {
        match location {
            MemoryLocation::Host => Ok(0),
            MemoryLocation::Cuda { device } => self
                .devices
                .iter()
                .position(|d| *d == Some(device))
                .ok_or_else(|| {
                    TransferError::invalid(
                        "group_of",
                        format!("no domain group for CUDA device {device}"),
                    )
                }),
        }
    }

    /// Registers caller-owned memory with the NICs of the group its location
    /// routes to (see [`TransferEngine::group_of`]).
    ///
    /// # Safety
    /// As [`TransferEngine::register_raw`].
    pub unsafe fn register(&self, span: MemorySpan) -> Result<LocalRegion> {
        let group = self.group_of(span.location)?;
        self.register_span(span, group, None)
    }

    /// How each worker spent its idle time so far: `(blocked on NIC wait
    /// descriptors, parked on a timer)` counts, per domain group. The naps
    /// a worker takes while a waiter drives its group
    /// ([`crate::assist`]) are not idle sleeps and are not counted.
    pub fn idle_stats(&self) -> Vec<(u64, u64)> {
        self.workers.iter().map(|w| w.queue.idle_stats()).collect()
    }

    /// This engine's address, to hand to peers.
    pub fn address(&self) -> &EngineAddress {
        &self.address
    }

    /// Number of domain groups (workers).
    pub fn groups(&self) -> usize {
        self.workers.len()
    }

    fn worker(&self, call: &'static str, group: usize) -> Result<&WorkerHandle> {
        self.workers
            .get(group)
            .ok_or_else(|| TransferError::invalid(call, format!("no domain group {group}")))
    }

    /// Hands `job` to group `group`. `waited`: the submitter holds a
    /// [`Pending`] of it, whose wait drives the NICs (assisted thread mode;
    /// not a control job's reply, which blocks without driving).
    fn push(&self, group: usize, job: Job, waited: bool) -> Result<()> {
        let w = self.worker("submit", group)?;
        let Some(caller) = &self.caller else {
            return match &self.assist {
                Some(a) => a.push(group, job, waited, &self.callbacks),
                None => w.queue.push(job, &self.callbacks),
            };
        };
        let mut job = job;
        while let Some(back) = w.queue.try_push(job, &self.callbacks)? {
            if in_pass() {
                // Making room needs the pass this receive callback runs in.
                let err = TransferError::invalid(
                    "submit",
                    "the queue is full inside a receive callback of a caller-driven engine",
                );
                back.fail(err.clone(), &self.callbacks);
                return Err(err);
            }
            job = back;
            caller.progress();
        }
        // This thread is the worker: post now rather than at the next wait.
        caller.post(group);
        Ok(())
    }

    /// Waits for a worker's reply to a control job, driving progress when
    /// callers own the NICs.
    fn reply<T>(&self, call: &'static str, rx: oneshot::Receiver<Result<T>>) -> Result<T> {
        if let Some(caller) = &self.caller {
            caller.wait_until(call, None, || rx.is_settled())?;
        }
        rx.wait().unwrap_or(Err(TransferError::Shutdown { call }))
    }

    /// Who drives this engine's NICs.
    pub fn progress_mode(&self) -> ProgressMode {
        if self.caller.is_some() {
            ProgressMode::Caller
        } else {
            ProgressMode::Thread
        }
    }

    /// Drives a caller-driven engine once: queued submits are posted, every
    /// NIC is polled, immediates are counted, completions and receive
    /// callbacks run (on this thread). Returns whether anything happened.
    /// A no-op returning `false` with worker threads.
    ///
    /// Call it in any loop that polls a [`crate::DoneFlag`], `take_imm` or
    /// `imm_value`; blocking waits ([`Pending::wait`], `wait_imm`) call it
    /// themselves.
    pub fn progress(&self) -> bool {
        self.caller.as_ref().is_some_and(|c| c.progress())
    }

    /// Lets the calling thread move this engine's NICs while it waits for
    /// `ready()`, for at most `limit`; returns `ready()`. With worker
    /// threads and assisting on ([`EngineBuilder::assist`]) it drives them
    /// for up to the assist window while the workers step back (then the
    /// caller should block on its own signal); caller-driven engines are
    /// driven until `ready()` or `limit`; otherwise it only looks at
    /// `ready()`. For waiters outside [`Pending::wait`] (bindings that poll
    /// a future and block on their own signal).
    pub fn drive_while_waiting(&self, limit: Duration, ready: impl Fn() -> bool) -> bool {
        if let Some(a) = &self.assist {
            return a.drive(Some(limit), ready);
        }
        if let Some(c) = &self.caller {
            return c
                .wait_until("drive_while_waiting", Some(limit), &ready)
                .is_ok();
        }
        ready()
    }

    /// A handle that drives this caller-driven engine from another thread
    /// (`None` with worker threads).
    pub fn progress_handle(&self) -> Option<ProgressHandle> {
        self.caller.clone().map(ProgressHandle)
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    // ---- memory -------------------------------------------------------

    /// Allocates `len` bytes of page-aligned host memory and registers it
    /// with every NIC of `group`.
    pub fn alloc_host(&self, len: usize, group: usize) -> Result<LocalRegion> {
        let buf = HostBuffer::new(len)?;
        let span = MemorySpan {
            ptr: buf.as_ptr(),
            len,
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        self.register_span(span, group, Some(buf))
    }

    /// Registers caller-owned memory with every NIC of `group`.
    ///
    /// # Safety
    /// `span` must stay valid (allocated, not freed or unmapped) until
    /// [`TransferEngine::unregister`] succeeds or the engine is dropped:
    /// peers may write into it at any time while it is registered.
    pub unsafe fn register_raw(&self, span: MemorySpan, group: usize) -> Result<LocalRegion> {
        self.register_span(span, group, None)
    }

    fn register_span(
        &self,
        span: MemorySpan,
        group: usize,
        owned: Option<HostBuffer>,
    ) -> Result<LocalRegion> {
        const CALL: &str = "register";
        if span.len == 0 || span.ptr.is_null() {
            return Err(TransferError::invalid(CALL, "empty or null span"));
        }
        let (tx, rx) = oneshot::channel();
        self.push(
            group,
            Job::Register {
                span: SpanJob(span),
                reply: tx,
            },
            false,
        )?;
        let regs = self.reply(CALL, rx)?;
        let remote = RemoteRegion {
            backend: self.address.backend,
            group: u32::try_from(group).map_err(|_| TransferError::invalid(CALL, "group index"))?,
            len: span.len as u64,
            nics: regs.iter().map(|r| r.remote).collect(),
        };
        let inner = Arc::new(RegionInner::new(
            self.next_id(),
            span.ptr,
            span.len,
            span.location,
            group,
            regs.iter().map(|r| r.mr).collect(),
            remote,
            owned,
        ));
        self.push(group, Job::Adopt(inner.clone()), false)?;
        Ok(LocalRegion(inner))
    }

    /// Unregisters a region. Fails with [`TransferError::RegionBusy`] while
    /// transfers that use it are in flight (the region stays usable then).
    pub fn unregister(&self, region: &LocalRegion) -> Result<()> {
        region.0.try_unregister()?;
        let (tx, rx) = oneshot::channel();
        self.push(
            region.0.group,
            Job::Unregister {
                region: region.0.clone(),
                reply: tx,
            },
            false,
        )?;
        self.reply("unregister", rx)
    }

    // ---- peers --------------------------------------------------------

    /// Validates and interns a peer address.
    pub fn peer(&self, addr: &EngineAddress) -> Result<Peer> {
        const CALL: &str = "peer";
        if addr.backend != self.address.backend {
            return Err(TransferError::BackendMismatch {
                call: CALL,
                expected: self.address.backend,
                got: addr.backend,
            });
        }
        addr.validate(CALL)?;
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = peers.get(addr) {
            return Ok(p.clone());
        }
        let p = Peer(Arc::new(PeerInner {
            id: self.next_id(),
            addr: addr.clone(),
        }));
        peers.insert(addr.clone(), p.clone());
        Ok(p)
    }

    /// Forgets a peer's connection state on every NIC, so that a restarted
    /// peer at the same address is reached afresh by the next [`TransferEngine::peer`].
    pub fn forget_peer(&self, peer: &Peer) -> Result<()> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&peer.0.addr);
        for g in 0..self.workers.len() {
            self.push(g, Job::ForgetPeer(peer.0.id), false)?;
        }
        Ok(())
    }

    /// Checks a peer's region descriptor against the peer's address.
    pub fn remote(&self, peer: &Peer, region: RemoteRegion) -> Result<RemoteTarget> {
        const CALL: &str = "remote";
        if region.backend != self.address.backend {
            return Err(TransferError::BackendMismatch {
                call: CALL,
                expected: self.address.backend,
                got: region.backend,
            });
        }
        let g = peer.0.addr.group(CALL, region.group as usize)?;
        if region.nics.len() != g.nics.len() {
            return Err(TransferError::invalid(
                CALL,
                format!(
                    "descriptor has {} NIC entries, the peer's group {} has {}",
                    region.nics.len(),
                    region.group,
                    g.nics.len()
                ),
            ));
        }
        Ok(RemoteTarget {
            peer: peer.clone(),
            region: Arc::new(region),
        })
    }

    /// Adds a group of remote targets for repeated scatter and barrier.
    pub fn add_group(&self, members: Vec<RemoteTarget>) -> PeerGroup {
        PeerGroup {
            members: members.into(),
        }
    }

    // ---- transfers ----------------------------------------------------

    /// Submits any one transfer; `notify` hears its outcome. A request
    /// refused before it reaches a worker (a range outside its region, an
    /// unregistered source) is reported both through `notify` and as the
    /// return value.
    ///
    /// Every other submit method is a thin wrapper of this one:
    /// [`TransferEngine::start`] returns a [`Pending`] (block on it or
    /// `.await` it), [`TransferEngine::transfer`] blocks.
    pub fn submit<'a>(&self, request: impl Into<Request<'a>>, notify: Notify) -> Result<()> {
        let request = request.into();
        let admitted = request.check().and_then(|()| match request.source() {
            // Last: a refused request must not hold the region.
            Some(src) => src.0.acquire(request.call()),
            None => Ok(()),
        });
        if let Err(e) = admitted {
            return self.refuse(notify, e);
        }
        if let Notify::Pending(tx) = &notify {
            if let Some(caller) = &self.caller {
                // Waiting on this pending must drive the NICs.
                tx.attach(caller);
            } else if let Some(a) = self
                .assist
                .as_ref()
                .filter(|_| crate::assist::assists(request.bytes()))
            {
                // Waiting on it may drive them for a while.
                tx.assist(a);
            }
        }
        let waited = matches!(&notify, Notify::Pending(tx) if tx.assisted());
        let (group, job) = Job::for_request(request, notify);
        self.push(group, job, waited)
    }

    /// Submits a transfer and returns a [`Pending`] to wait on or await.
    pub fn start<'a>(&self, request: impl Into<Request<'a>>) -> Result<Pending> {
        let (n, p) = Notify::pending();
        self.submit(request, n)?;
        Ok(p)
    }

    /// Submits a transfer and blocks until it finished.
    pub fn transfer<'a>(&self, request: impl Into<Request<'a>>) -> Result<()> {
        self.start(request)?.wait()
    }

    /// Submits a single write; `notify` hears the outcome.
    pub fn submit_write(&self, req: WriteRequest<'_>, notify: Notify) -> Result<()> {
        self.submit(req, notify)
    }

    /// Submits a single write and returns a [`Pending`] to wait on or await.
    pub fn write(&self, req: WriteRequest<'_>) -> Result<Pending> {
        self.start(req)
    }

    /// Submits a paged write.
    pub fn submit_paged_write(&self, req: PagedWriteRequest<'_>, notify: Notify) -> Result<()> {
        self.submit(req, notify)
    }

    /// Submits a paged write and returns a [`Pending`].
    pub fn paged_write(&self, req: PagedWriteRequest<'_>) -> Result<Pending> {
        self.start(req)
    }

    /// Scatters slices of `src` to an ad-hoc list of targets (see [`ScatterRequest`]).
    pub fn submit_scatter(
        &self,
        src: &LocalRegion,
        items: Vec<ScatterItem>,
        imm: Option<u32>,
        notify: Notify,
    ) -> Result<()> {
        self.submit(ScatterRequest { src, items, imm }, notify)
    }

    /// Scatters one slice per member of `group` (`slices[i]` to member `i`).
    pub fn submit_group_scatter(
        &self,
        src: &LocalRegion,
        group: &PeerGroup,
        slices: &[Slice],
        imm: Option<u32>,
        notify: Notify,
    ) -> Result<()> {
        match ScatterRequest::to_peer_group(src, group, slices, imm) {
            Ok(req) => self.submit(req, notify),
            Err(e) => self.refuse(notify, e),
        }
    }

    /// Scatter returning a [`Pending`].
    pub fn scatter(
        &self,
        src: &LocalRegion,
        items: Vec<ScatterItem>,
        imm: Option<u32>,
    ) -> Result<Pending> {
        self.start(ScatterRequest { src, items, imm })
    }

    /// Barrier to an ad-hoc list of targets (see [`BarrierRequest`]).
    pub fn submit_barrier(&self, targets: &[RemoteTarget], imm: u32, notify: Notify) -> Result<()> {
        self.submit(BarrierRequest::to(targets, imm), notify)
    }

    /// Barrier to a [`PeerGroup`].
    pub fn submit_group_barrier(&self, group: &PeerGroup, imm: u32, notify: Notify) -> Result<()> {
        self.submit(BarrierRequest::to_peer_group(group, imm), notify)
    }

    /// Barrier returning a [`Pending`].
    pub fn barrier(&self, group: &PeerGroup, imm: u32) -> Result<Pending> {
        self.start(BarrierRequest::to_peer_group(group, imm))
    }

    // ---- two-sided ----------------------------------------------------

    /// Sends a message to `peer` (see [`SendRequest`]).
    pub fn submit_send(&self, peer: &Peer, data: &[u8], notify: Notify) -> Result<()> {
        self.submit(SendRequest { peer, data }, notify)
    }

    /// Sends a message and returns a [`Pending`].
    pub fn send(&self, peer: &Peer, data: &[u8]) -> Result<Pending> {
        self.start(SendRequest { peer, data })
    }

    /// Posts `count` receive buffers of `len` bytes; `callback` runs on the
    /// callback thread with each message, and the buffer is reposted after
    /// it returns. One pool per engine.
    pub fn start_recv_pool(
        &self,
        count: usize,
        len: usize,
        callback: impl Fn(&[u8]) + Send + Sync + 'static,
    ) -> Result<()> {
        const CALL: &str = "start_recv_pool";
        if count == 0 || len == 0 {
            return Err(TransferError::invalid(
                CALL,
                "count and len must be non-zero",
            ));
        }
        let total = count
            .checked_mul(len)
            .ok_or_else(|| TransferError::invalid(CALL, "count * len overflows"))?;
        let cb: RecvCallback = Box::new(callback);
        let pool = Arc::new(RecvPool::new(HostBuffer::new(total)?, count, len, cb));
        let (tx, rx) = oneshot::channel();
        self.push(0, Job::StartRecvPool { pool, reply: tx }, false)?;
        self.reply(CALL, rx)
    }

    // ---- immediates ---------------------------------------------------

    /// Runs `callback` (on the callback thread) once `count` immediates
    /// `imm` have arrived; those arrivals are consumed. Expectations on the
    /// same value are served in the order they were set.
    pub fn expect_imm(&self, imm: u32, count: u64, callback: impl FnOnce() + Send + 'static) {
        let mut fired = Vec::new();
        self.imms.add_expectation(
            imm,
            count,
            ImmAction::Callback(Box::new(callback)),
            &mut fired,
        );
        self.deliver_all(fired);
    }

    /// Arrivals of `imm` not consumed by an expectation yet.
    pub fn imm_value(&self, imm: u32) -> u64 {
        self.imms.value(imm)
    }

    /// Immediate arrivals dropped because [`EngineBuilder::max_unexpected_imms`]
    /// distinct values were already held unexpected: a peer sent more
    /// distinct values than anyone here waits for. Non-zero means lost
    /// arrivals (an expectation on a dropped value may never be met).
    pub fn imm_dropped(&self) -> u64 {
        self.imms.dropped()
    }

    /// Charges unexpected immediates (arrivals no expectation waits for) to
    /// accounts instead of the engine-wide cap
    /// ([`EngineBuilder::max_unexpected_imms`]): an immediate's partition is
    /// `imm >> shift`, each partition belongs to at most one account
    /// ([`TransferEngine::assign_imm_partition`]), and each account holds at
    /// most its cap of distinct unexpected values
    /// ([`TransferEngine::set_imm_account`]). Arrivals in a partition no
    /// account owns are dropped (and counted by
    /// [`TransferEngine::imm_dropped`]) unless an expectation waits for
    /// them. For engines shared by tenants: one that floods its own
    /// partitions fills its own account, not everyone's. Cannot be undone.
    pub fn account_imms(&self, shift: u32) {
        self.imms.enable_accounts(shift);
    }

    /// Creates account `id` with room for `cap` distinct unexpected
    /// immediates, or changes its cap (see [`TransferEngine::account_imms`]).
    pub fn set_imm_account(&self, id: u64, cap: usize) {
        self.imms.set_account(id, cap);
    }

    /// Charges partition `partition`'s unexpected immediates to account `id`.
    pub fn assign_imm_partition(&self, partition: u32, id: u64) {
        self.imms.assign_partition(partition, id);
    }

    /// Takes `partition` from its account and discards the unexpected
    /// arrivals it holds (values an expectation waits for stay); returns
    /// how many distinct values were discarded.
    pub fn release_imm_partition(&self, partition: u32) -> usize {
        self.imms.release_partition(partition)
    }

    /// Forgets account `id` and its partitions (release them first to
    /// discard what they hold).
    pub fn remove_imm_account(&self, id: u64) {
        self.imms.remove_account(id);
    }

    /// Distinct unexpected immediates account `id` holds now.
    pub fn imm_account_held(&self, id: u64) -> usize {
        self.imms.account_held(id)
    }

    /// Blocks until `count` immediates `imm` have arrived, then consumes them.
    pub fn wait_imm(&self, imm: u32, count: u64, timeout: Duration) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let mut fired = Vec::new();
        let id = self
            .imms
            .add_expectation(imm, count, ImmAction::Wake(tx), &mut fired);
        self.deliver_all(fired);
        // A caller-driven wait drives the NICs itself; its timeout is
        // handled by the withdrawal below like a blocking wait's, any other
        // refusal (a wait inside a receive callback) is returned after it.
        let (mut block, refused) = match drive_for(self.caller.as_deref(), "wait_imm", timeout, &rx)
        {
            Ok(block) => (block, None),
            Err(e) => (Duration::ZERO, Some(e)),
        };
        if let Some(a) = &self.assist {
            block = block.min(a.drive_within(timeout, || rx.is_settled()));
        }
        match rx.wait_timeout(block) {
            Ok(()) => Ok(()),
            Err(rx) => {
                let mut fired = Vec::new();
                let cancelled = self.imms.cancel(imm, id, &mut fired);
                self.deliver_all(fired);
                if let (true, Some(e)) = (cancelled, refused) {
                    Err(e)
                } else if cancelled || rx.wait_timeout(Duration::ZERO).is_err() {
                    Err(TransferError::Timeout {
                        call: "wait_imm",
                        millis: timeout.as_millis().try_into().unwrap_or(u64::MAX),
                    })
                } else {
                    Ok(())
                }
            }
        }
    }

    /// A future that resolves once `count` immediates `imm` have arrived
    /// (consuming them). Works with any executor.
    pub fn imm_future(&self, imm: u32, count: u64) -> ImmFuture {
        let (tx, rx) = oneshot::channel();
        let mut fired = Vec::new();
        let id = self
            .imms
            .add_expectation(imm, count, ImmAction::Wake(tx), &mut fired);
        self.deliver_all(fired);
        ImmFuture {
            rx,
            imm,
            id,
            done: false,
            imms: self.imms.clone(),
            callbacks: self.callbacks.clone(),
            caller: self.caller.clone(),
        }
    }

    /// Takes up to `count` pending arrivals of `imm` (when no expectation
    /// waits on it); returns how many were taken. For poll-style receivers.
    pub fn take_imm(&self, imm: u32, count: u64) -> u64 {
        self.imms.take(imm, count)
    }

    /// How many immediates one logical transfer of `shape` from `sender`
    /// (its group `sender_group`) delivers into this engine's group `my_group`.
    pub fn expected_imms(
        &self,
        sender: &EngineAddress,
        sender_group: usize,
        my_group: usize,
        shape: WriteShape,
    ) -> Result<u64> {
        const CALL: &str = "expected_imms";
        let s = sender.group(CALL, sender_group)?;
        let mine = self.address.group(CALL, my_group)?;
        Ok(expected_imms(s, mine.nics.len(), shape))
    }

    /// The sender's view of [`TransferEngine::expected_imms`]: how many
    /// immediates one transfer of `shape` from this engine's group
    /// `my_group` delivers into `target`.
    pub fn imms_delivered(
        &self,
        target: &RemoteTarget,
        my_group: usize,
        shape: WriteShape,
    ) -> Result<u64> {
        const CALL: &str = "imms_delivered";
        let mine = self.address.group(CALL, my_group)?;
        Ok(expected_imms(mine, target.region.nics.len(), shape))
    }

    fn deliver_all(&self, fired: Vec<Delivery>) {
        self.callbacks.deliver_all(fired);
    }

    /// Reports a refused submit through `notify` and as the return value.
    fn refuse(&self, notify: Notify, err: TransferError) -> Result<()> {
        self.callbacks.notify(notify, Err(err.clone()));
        Err(err)
    }
}

/// Resolves when an immediate expectation is met (see [`TransferEngine::imm_future`]).
///
/// Dropping it before it resolved (given up, or cut short by an executor's
/// timeout) withdraws the expectation, as [`TransferEngine::wait_imm`] does on
/// timeout: otherwise it would stay at the head of the queue of its
/// immediate, silently consume the next `count` arrivals and hold back every
/// later expectation on that value. Arrivals it consumed in a race with the
/// drop (the expectation was met just before) are gone with it.
pub struct ImmFuture {
    rx: oneshot::Receiver<()>,
    imm: u32,
    id: u64,
    /// Resolved: nothing to withdraw.
    done: bool,
    imms: Arc<ImmCounters>,
    callbacks: Arc<CallbackQueue>,
    /// Set for caller-driven engines: polling drives the NICs.
    caller: Option<Arc<CallerProgress>>,
}

impl std::future::Future for ImmFuture {
    type Output = Result<()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        let polled = poll_driving(this.caller.as_deref(), std::pin::Pin::new(&mut this.rx), cx);
        if polled.is_ready() {
            this.done = true;
        }
        polled.map(|r| r.ok_or(TransferError::Shutdown { call: "imm_future" }))
    }
}

impl Drop for ImmFuture {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut fired = Vec::new();
        // False when it was met meanwhile: then there is nothing to undo.
        self.imms.cancel(self.imm, self.id, &mut fired);
        // Withdrawing a head expectation may let the next one fire.
        self.callbacks.deliver_all(fired);
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        if let Some(c) = &self.caller {
            c.shutdown();
        }
        for w in &self.workers {
            w.queue.request_stop();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        // Workers are gone; the callback thread drains what they delivered.
        drop(self.callback_thread.take());
    }
}
