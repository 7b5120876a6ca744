//! The engine's callback thread.
//!
//! Workers hand finished callbacks to it through an unbounded lock-free
//! queue, so a worker never blocks on user code and a slow callback never
//! stalls the NICs. Callbacks may submit new transfers: submits never wait on
//! this thread, so that cannot deadlock.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use crossbeam_queue::SegQueue;

use crate::completion::{Delivery, Notify};
use crate::error::Result;
use crate::spin_wait;

/// A unit of work for the callback thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct CallbackQueue {
    jobs: SegQueue<Job>,
    stop: AtomicBool,
    thread: std::sync::OnceLock<Thread>,
}

impl CallbackQueue {
    /// A queue without a thread, drained by [`CallbackQueue::run_pending`]
    /// (caller-driven engines run callbacks inside `progress`; the callback
    /// thread starts from one).
    pub(crate) fn inline() -> Arc<Self> {
        Arc::new(Self {
            jobs: SegQueue::new(),
            stop: AtomicBool::new(false),
            thread: std::sync::OnceLock::new(),
        })
    }

    /// Runs every queued callback on this thread; returns whether any ran.
    pub(crate) fn run_pending(&self) -> bool {
        let mut ran = false;
        while let Some(job) = self.jobs.pop() {
            ran = true;
            // As on the callback thread: a panicking user callback must not
            // take the engine's notifications down with it.
            let _ = catch_unwind(AssertUnwindSafe(job));
        }
        ran
    }

    pub(crate) fn push(&self, job: Job) {
        self.jobs.push(job);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Hands a finished notification's deferred part (a user callback) to
    /// the thread; inline deliveries are already done.
    pub(crate) fn deliver(&self, d: Delivery) {
        if let Delivery::Deferred(job) = d {
            self.push(job);
        }
    }

    /// Delivers every one of `fired`.
    pub(crate) fn deliver_all(&self, fired: impl IntoIterator<Item = Delivery>) {
        for d in fired {
            self.deliver(d);
        }
    }

    /// Reports `result` through `notify`.
    pub(crate) fn notify(&self, notify: Notify, result: Result<()>) {
        self.deliver(notify.deliver(result));
    }
}

/// Owns the callback thread; dropping it runs the remaining jobs and joins.
pub(crate) struct CallbackThread {
    queue: Arc<CallbackQueue>,
    handle: Option<JoinHandle<()>>,
}

impl CallbackThread {
    pub(crate) fn spawn(name: String) -> std::io::Result<Self> {
        let queue = CallbackQueue::inline();
        let q = queue.clone();
        let handle = thread::Builder::new().name(name).spawn(move || run(&q))?;
        let _ = queue.thread.set(handle.thread().clone());
        Ok(Self {
            queue,
            handle: Some(handle),
        })
    }

    pub(crate) fn queue(&self) -> Arc<CallbackQueue> {
        self.queue.clone()
    }
}

fn run(q: &CallbackQueue) {
    // Whether the last round ran callbacks: then the next idle round polls
    // for the spin window before parking (see [`crate::spin_wait`], off by
    // default): a receive callback that answers a message is one hand-off
    // per round trip, and parking after every one makes each a futex
    // wake-up. An idle engine parks at once.
    let mut active = false;
    loop {
        // A panicking callback is caught there; the default hook prints it.
        let ran = q.run_pending();
        if q.stop.load(Ordering::Acquire) && q.jobs.is_empty() {
            return;
        }
        if ran {
            active = true;
            continue;
        }
        if active
            && spin_wait::spin_until(spin_wait::window(), || {
                !q.jobs.is_empty() || q.stop.load(Ordering::Acquire)
            })
        {
            continue;
        }
        active = false;
        // Woken by push (park/unpark keeps a token, so no wake-up is
        // lost); the timeout is only a safety net.
        thread::park_timeout(Duration::from_millis(500));
    }
}

impl Drop for CallbackThread {
    fn drop(&mut self) {
        self.queue.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}
