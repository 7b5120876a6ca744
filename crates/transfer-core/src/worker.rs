//! Worker threads: each owns one [`DomainGroup`] and everything it touches,
//! so the data path takes no locks. API threads feed it [`Job`]s through a
//! bounded lock-free queue ([`WorkerQueue`], the backpressure); the loop
//! hands jobs to the group, polls the NICs, and sleeps when idle. What the
//! group does with a job is in [`crate::group`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::callbacks::CallbackQueue;
use crate::domain::{Domain, DomainEvent, RecvToken};
use crate::error::{Result, TransferError};
use crate::group::{DomainGroup, Sinks};
use crate::idle::{IdlePolicy, IdleState, Sleep};
use crate::job::Job;
use crate::progress::{InlineWorker, run_user_callback};
use crate::wakeup::{EventFd, wait_readable};

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
    pub(crate) idle: IdlePolicy,
    pub(crate) queue: Arc<WorkerQueue>,
    pub(crate) sinks: Sinks,
    /// Scratch list of descriptors to block on.
    pub(crate) wait_fds: Vec<std::os::fd::RawFd>,
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
    pub(crate) fn new(
        group: DomainGroup<D>,
        idle: IdlePolicy,
        queue: Arc<WorkerQueue>,
        sinks: Sinks,
    ) -> Self {
        Self {
            group,
            idle,
            queue,
            sinks,
            wait_fds: Vec::new(),
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

    pub(crate) fn run(mut self) {
        let mut idle = IdleState::new(self.idle);
        loop {
            let busy = self.pass();
            if self.queue.stop.load(Ordering::Acquire) {
                break;
            }
            if busy {
                idle.active();
            } else if let Some(sleep) = idle.idle_at(Instant::now(), self.group.may_sleep()) {
                if self.sleep(sleep) == Woke::Traffic {
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
            } else {
                // Yield rather than a pure spin: where threads outnumber
                // cores (2-core machines, API threads polling flags) a
                // spinning worker otherwise holds the core the thread it
                // waits for needs; the bench's ping-pong went from ~500 us
                // to tens of us with it. With a free core, sched_yield
                // returns at once.
                std::thread::yield_now();
            }
        }
        self.shutdown();
    }

    /// Sleeps until work may be there: blocked on the NICs' wait
    /// descriptors and the submit eventfd when every NIC has one, else a
    /// timed park.
    /// Says whether NIC traffic ended it (a NIC refused to wait because it
    /// has work, or its descriptor became readable).
    fn sleep(&mut self, sleep: Sleep) -> Woke {
        let park = |q: &WorkerQueue| {
            q.parked.fetch_add(1, Ordering::Relaxed);
            std::thread::park_timeout(sleep.park);
            Woke::Quiet
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
            return Woke::Traffic;
        }
        self.queue.sleeping.store(true, Ordering::SeqCst);
        let mut woke = Woke::Quiet;
        if self.queue.jobs.is_empty() && !self.queue.stop.load(Ordering::SeqCst) {
            self.queue.blocked.fetch_add(1, Ordering::Relaxed);
            // Index 0 is the submit eventfd: a submit is counted by the pass.
            if wait_readable(&self.wait_fds, sleep.block, 1) {
                woke = Woke::Traffic;
            }
        }
        self.queue.sleeping.store(false, Ordering::SeqCst);
        event.drain();
        woke
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

    fn shutdown(self: Box<Self>) {
        Worker::shutdown(*self);
    }
}
