//! Worker threads: each owns one [`DomainGroup`] and everything it touches,
//! so the data path takes no locks. API threads feed it [`Job`]s through a
//! bounded lock-free queue ([`WorkerQueue`], the backpressure); the loop
//! hands jobs to the group, polls the NICs, and sleeps when idle. What the
//! group does with a job is in [`crate::group`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::callbacks::CallbackQueue;
use crate::domain::{Domain, DomainEvent, RecvToken};
use crate::error::{Result, TransferError};
use crate::group::{DomainGroup, Sinks};
use crate::idle::{IdlePolicy, IdleState, Sleep};
use crate::job::Job;
use crate::progress::{InlineWorker, Slot, run_user_callback};
use crate::wakeup::{EventFd, wait_readable};

/// The queue into one worker.
pub(crate) struct WorkerQueue {
    jobs: ArrayQueue<Job>,
    thread: std::sync::OnceLock<Thread>,
    stop: AtomicBool,
    stopped: AtomicBool,
    /// How the worker sleeps now ([`Asleep`] as a `u8`; `wake` signals
    /// `event` unless it is awake).
    sleeping: AtomicU8,
    /// Threads driving this group while they wait ([`crate::assist`]): the
    /// worker steps back (sleeps) instead of spinning against them.
    pub(crate) assisting: AtomicUsize,
    event: Option<EventFd>,
    /// Times the idle worker blocked on wait descriptors / parked on a
    /// timer (its naps for a driving waiter not counted).
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
            sleeping: AtomicU8::new(Asleep::Awake as u8),
            assisting: AtomicUsize::new(0),
            // Without an eventfd the worker parks on timers instead of blocking.
            event: EventFd::new().ok(),
            blocked: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        })
    }

    pub(crate) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    pub(crate) fn wake(&self) {
        // SeqCst pairs with the worker's store of `sleeping` before its last
        // look at the queue: either it sees the job, or we see it sleeping.
        if self.sleeping.load(Ordering::SeqCst) != Asleep::Awake as u8 {
            if let Some(e) = &self.event {
                e.signal();
            }
        }
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// How the worker thread sleeps now: a job handed to a sleeping one
    /// waits for a wake-up to be scheduled.
    pub(crate) fn asleep(&self) -> Asleep {
        match self.sleeping.load(Ordering::SeqCst) {
            x if x == Asleep::Stepped as u8 => Asleep::Stepped,
            x if x == Asleep::OnNics as u8 => Asleep::OnNics,
            x if x == Asleep::Parked as u8 => Asleep::Parked,
            _ => Asleep::Awake,
        }
    }

    /// Hands a job to the worker. A full queue is backpressure: the caller
    /// waits (the worker never waits on API threads, so this cannot deadlock).
    pub(crate) fn push(&self, mut job: Job, callbacks: &CallbackQueue) -> Result<()> {
        let mut spins = 0u32;
        loop {
            match self.try_push(job, callbacks)? {
                None => {
                    self.wake();
                    return Ok(());
                }
                Some(j) => {
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

    /// Hands a job over without waiting: `Ok(Some(job))` gives it back when
    /// the queue is full (caller-driven engines make room by progressing).
    pub(crate) fn try_push(&self, job: Job, callbacks: &CallbackQueue) -> Result<Option<Job>> {
        if self.stopped.load(Ordering::Acquire) {
            job.fail(TransferError::Shutdown { call: "submit" }, callbacks);
            return Err(TransferError::Shutdown { call: "submit" });
        }
        Ok(self.jobs.push(job).err())
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

/// Everything a worker thread owns.
pub(crate) struct Worker<D: Domain> {
    pub(crate) group: DomainGroup<D>,
    pub(crate) queue: Arc<WorkerQueue>,
    pub(crate) sinks: Sinks,
    /// Scratch space of one pass.
    scratch: Vec<DomainEvent>,
    events: Vec<(usize, DomainEvent)>,
    fired: Vec<crate::completion::Delivery>,
    /// Driven by callers ([`crate::ProgressMode::Caller`]): receive-pool
    /// callbacks run inside the pass and buffers are reposted at once.
    inline: bool,
}

/// How a worker's sleep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// A NIC has work or signalled its descriptor.
    Traffic,
    /// A timeout, a submit, or a stop.
    Quiet,
}

/// Jobs taken per loop pass before the NICs are polled again, so a flood of
/// submits cannot starve completions.
const JOBS_PER_PASS: usize = 64;

impl<D: Domain> Worker<D> {
    pub(crate) fn new(group: DomainGroup<D>, queue: Arc<WorkerQueue>, sinks: Sinks) -> Self {
        Self {
            group,
            queue,
            sinks,
            scratch: Vec::with_capacity(64),
            events: Vec::with_capacity(64),
            fired: Vec::new(),
            inline: false,
        }
    }

    /// The same worker, driven by callers instead of its own thread.
    pub(crate) fn into_inline(mut self) -> Box<dyn InlineWorker> {
        self.inline = true;
        Box::new(self)
    }

    /// One round: up to [`JOBS_PER_PASS`] queued jobs, then one poll of
    /// every NIC and its events. Returns whether anything happened.
    fn pass(&mut self) -> bool {
        let mut busy = false;
        for _ in 0..JOBS_PER_PASS {
            let Some(job) = self.queue.jobs.pop() else {
                break;
            };
            busy = true;
            self.handle(job);
        }
        let mut events = std::mem::take(&mut self.events);
        self.group.poll(&mut self.scratch, &mut events);
        busy |= !events.is_empty();
        for (nic, ev) in events.drain(..) {
            match ev {
                DomainEvent::Received { token, len } => self.received(nic, token, len),
                ev => self.group.on_event(ev, &self.sinks, &mut self.fired),
            }
        }
        self.events = events;
        busy
    }

    /// What an idle worker may block on, looked at while it holds its
    /// state (the domains' `prepare_wait` needs it); the blocking itself
    /// happens after the state is released ([`sleep_released`]), so that a
    /// waiting caller can drive the group meanwhile.
    fn prepare_sleep(&mut self) -> SleepPlan {
        let Some(event) = &self.queue.event else {
            return SleepPlan::Park;
        };
        let mut fds = vec![event.raw()];
        for d in self.group.domains() {
            match d.wait_fd() {
                Some(fd) => fds.push(fd),
                None => return SleepPlan::Park,
            }
        }
        if !self
            .group
            .domains_mut()
            .iter_mut()
            .all(|d| d.prepare_wait())
        {
            return SleepPlan::Traffic;
        }
        SleepPlan::Block(fds)
    }

    fn shutdown(self) {
        self.queue.stopped.store(true, Ordering::Release);
        let Worker {
            group,
            queue,
            sinks,
            ..
        } = self;
        group.close(&sinks);
        while let Some(job) = queue.jobs.pop() {
            job.fail(
                TransferError::Shutdown {
                    call: "engine drop",
                },
                &sinks.callbacks,
            );
        }
    }

    fn handle(&mut self, job: Job) {
        let sinks = &self.sinks;
        let group = &mut self.group;
        match job {
            Job::Register { span, reply } => reply.send(group.register(span.0)),
            Job::Adopt(region) => group.adopt(region),
            Job::Unregister { region, reply } => reply.send(group.unregister(&region)),
            Job::Write(j) => group.write(j, sinks),
            Job::Paged(j) => group.paged(j, sinks),
            Job::Scatter(j) => group.scatter(j, sinks),
            Job::Barrier(j) => group.barrier(j, sinks),
            Job::Send { peer, data, notify } => group.send(&peer, data, notify, sinks),
            Job::StartRecvPool { pool, reply } => reply.send(group.start_recv_pool(pool)),
            Job::Repost(token) => group.repost(token),
            Job::ForgetPeer(id) => group.forget_peer(id),
        }
    }

    /// A message landed in receive buffer `token`: the user callback runs
    /// on the callback thread, then the buffer comes back through this
    /// worker's queue to be posted again.
    fn received(&mut self, nic: usize, token: RecvToken, len: usize) {
        if nic != 0 {
            return;
        }
        let Some(pool) = self.group.recv_pool() else {
            return;
        };
        if self.inline {
            // The caller drives this pass: run the user callback here (no
            // thread hop, the point of caller progress) and repost at once.
            let pool = pool.clone();
            run_user_callback(|| pool.deliver(token.0, len));
            self.group.repost(token.0);
            return;
        }
        let pool = pool.clone();
        let queue = self.queue.clone();
        let callbacks = self.sinks.callbacks.clone();
        self.sinks.callbacks.push(Box::new(move || {
            pool.deliver(token.0, len);
            let _ = queue.push(Job::Repost(token.0), &callbacks);
        }));
    }
}

impl<D: Domain> InlineWorker for Worker<D> {
    fn pass(&mut self) -> bool {
        Worker::pass(self)
    }

    fn is_quiet(&self) -> bool {
        self.queue.jobs.is_empty() && self.group.is_quiet()
    }

    fn may_sleep(&self) -> bool {
        self.group.may_sleep()
    }

    fn prepare_sleep(&mut self) -> SleepPlan {
        Worker::prepare_sleep(self)
    }

    fn shutdown(self: Box<Self>) {
        Worker::shutdown(*self);
    }
}

/// How an idle worker sleeps ([`Worker::prepare_sleep`]).
pub(crate) enum SleepPlan {
    /// Block on these descriptors (the submit eventfd first, then every NIC's).
    Block(Vec<std::os::fd::RawFd>),
    /// No descriptor for some NIC: a timed park.
    Park,
    /// A NIC has work already: do not sleep.
    Traffic,
}

/// The worker thread of a group whose state lives in `slot`, shared with
/// the threads that wait on its transfers ([`crate::assist`]): each round
/// takes the state, runs one pass and releases it, so that a waiter that
/// finds it free can run a pass itself instead of waiting for this thread
/// to be scheduled. Uncontended, taking the state is one atomic swap.
pub(crate) fn run_shared(slot: Arc<Slot>, queue: Arc<WorkerQueue>, policy: IdlePolicy) {
    let mut idle = IdleState::new(policy);
    loop {
        if queue.assisting.load(Ordering::Acquire) > 0 && !queue.stop.load(Ordering::Acquire) {
            // A waiter drives the group (it may have woken us by a submit
            // just before its wait): step back at once, without taking the
            // state from it.
            step_back(&queue);
            continue;
        }
        let mut guard = lock_slot(&slot);
        let Some(worker) = guard.as_mut() else {
            return;
        };
        let busy = worker.pass();
        if queue.stop.load(Ordering::Acquire) {
            break;
        }
        if busy {
            idle.active();
            continue;
        }
        if queue.assisting.load(Ordering::Acquire) > 0 {
            // A waiter drives the group: step back rather than spin
            // against it (or be woken by every arrival it handles); it
            // wakes this thread when it leaves.
            drop(guard);
            step_back(&queue);
            continue;
        }
        let plan = idle
            .idle_at(Instant::now(), worker.may_sleep())
            .map(|sleep| (worker.prepare_sleep(), sleep));
        drop(guard);
        match plan {
            Some((plan, sleep)) => {
                if sleep_released(&queue, plan, sleep, false) == Woke::Traffic {
                    // A NIC had work without reporting an event (data placed
                    // by a manual-progress provider), or its descriptor woke
                    // us: traffic is flowing, so spin again rather than
                    // block between arrivals. Counting only events as
                    // activity made an engine that is the target of plain
                    // writes (no event on its side) block and be woken
                    // once per write: tcp 8 B writes from Python took a
                    // kernel wake-up of the target each (1.1 blocks/op).
                    idle.active();
                }
            }
            // Yield rather than a pure spin: where threads outnumber
            // cores (2-core machines, API threads polling flags) a
            // spinning worker otherwise holds the core the thread it
            // waits for needs; the bench's ping-pong went from ~500 us
            // to tens of us with it. With a free core, sched_yield
            // returns at once.
            None => std::thread::yield_now(),
        }
    }
    let taken = lock_slot(&slot).take();
    if let Some(worker) = taken {
        worker.shutdown();
    }
}

/// How long a worker sleeps while a waiter drives its group: the waiter
/// wakes it when it leaves with work in flight, so this bounds only what a
/// submit made without a wake-up ([`crate::assist`]) may wait for it.
const ASSISTED_NAP: Duration = Duration::from_millis(1);

/// A stepped-back worker's nap of at most [`ASSISTED_NAP`]: on the submit
/// eventfd alone (not the NICs, whose arrivals the waiter handles), else a
/// timed park. Never ends as traffic (no NIC descriptor is watched).
fn step_back(queue: &WorkerQueue) {
    let plan = queue
        .event
        .as_ref()
        .map_or(SleepPlan::Park, |e| SleepPlan::Block(vec![e.raw()]));
    let nap = Sleep {
        park: ASSISTED_NAP,
        block: ASSISTED_NAP,
    };
    sleep_released(queue, plan, nap, true);
}

/// How a worker thread sleeps, as its submitters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Asleep {
    /// Running or spinning: it takes a job within one round.
    Awake = 0,
    /// Stepped back while a waiter drives: a nap of at most [`ASSISTED_NAP`].
    Stepped = 1,
    /// Blocked on the submit eventfd and every NIC's wait descriptor.
    OnNics = 2,
    /// Parked on a timer (some NIC has no wait descriptor).
    Parked = 3,
}

/// The slot, waiting for a waiter's pass to end (a pass never blocks).
fn lock_slot(slot: &Slot) -> std::sync::MutexGuard<'_, Option<Box<dyn InlineWorker>>> {
    match slot.lock() {
        Ok(g) => g,
        // Nothing in a thread-mode pass runs user code; a poisoned slot
        // still holds consistent state.
        Err(p) => p.into_inner(),
    }
}

/// Sleeps as `plan` says, without the group's state: blocked on the
/// descriptors (the submit eventfd and every NIC's) or a timed park;
/// `stepped`: a short nap while a waiter drives. Says whether NIC traffic
/// ended it.
fn sleep_released(queue: &WorkerQueue, plan: SleepPlan, sleep: Sleep, stepped: bool) -> Woke {
    let fds = match plan {
        SleepPlan::Traffic => return Woke::Traffic,
        SleepPlan::Park => {
            // A stepped-back nap is no idle sleep (it naps for a waiter
            // whatever the NICs offer): the counters say how the idle
            // policy slept (a nap counted as "blocked" made an engine
            // without wait descriptors look as if it had blocked on them:
            // engine_behaviour's idle_workers_block_on_wait_fds_when_offered
            // failed about one run in six).
            if !stepped {
                queue.parked.fetch_add(1, Ordering::Relaxed);
            }
            let state = if stepped {
                Asleep::Stepped
            } else {
                Asleep::Parked
            };
            queue.sleeping.store(state as u8, Ordering::SeqCst);
            if queue.jobs.is_empty() && !queue.stop.load(Ordering::SeqCst) {
                std::thread::park_timeout(sleep.park);
            }
            queue.sleeping.store(Asleep::Awake as u8, Ordering::SeqCst);
            return Woke::Quiet;
        }
        SleepPlan::Block(fds) => fds,
    };
    let state = if stepped {
        Asleep::Stepped
    } else {
        Asleep::OnNics
    };
    queue.sleeping.store(state as u8, Ordering::SeqCst);
    let mut woke = Woke::Quiet;
    if queue.jobs.is_empty() && !queue.stop.load(Ordering::SeqCst) {
        if !stepped {
            queue.blocked.fetch_add(1, Ordering::Relaxed);
        }
        // Index 0 is the submit eventfd: a submit is counted by the pass.
        if wait_readable(&fds, sleep.block, 1) {
            woke = Woke::Traffic;
        }
    }
    queue.sleeping.store(Asleep::Awake as u8, Ordering::SeqCst);
    if let Some(event) = &queue.event {
        event.drain();
    }
    woke
}
