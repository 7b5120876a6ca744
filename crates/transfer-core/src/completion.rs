//! How a submitter learns that its transfer finished: a callback, an atomic
//! flag, or a [`Pending`] that can be blocked on or awaited.
//!
//! Flags and pendings are completed directly by the worker (a store and a
//! wake, no user code); callbacks run on the engine's callback thread, so a
//! slow callback never stalls a worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::assist::Assist;
use crate::error::{Result, TransferError};
use crate::oneshot;
use crate::progress::{CallerProgress, drive_for, poll_driving};

/// Who a waiter on the pending may drive.
enum Drive {
    /// A caller-driven engine: waiting must drive its NICs.
    Caller(Arc<CallerProgress>),
    /// A thread-mode engine with assisting on: waiting may drive them for
    /// a window before it blocks.
    Assist(Arc<Assist>),
}

/// Set when the pending's transfer went to an engine its waiter drives.
type Driver = Arc<OnceLock<Drive>>;

/// A completion callback; it receives the transfer's outcome.
pub type Callback = Box<dyn FnOnce(Result<()>) + Send + 'static>;

/// Where a submit reports its outcome.
pub enum Notify {
    /// Run on the engine's callback thread.
    Callback(Callback),
    /// Set an atomic flag that the submitter polls.
    Flag(Arc<DoneFlag>),
    /// Fill a [`Pending`] (created by [`Notify::pending`]).
    Pending(PendingSender),
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Notify::Callback(_) => "Notify::Callback",
            Notify::Flag(_) => "Notify::Flag",
            Notify::Pending(_) => "Notify::Pending",
        })
    }
}

impl Notify {
    /// A callback notification.
    pub fn callback(f: impl FnOnce(Result<()>) + Send + 'static) -> Self {
        Notify::Callback(Box::new(f))
    }

    /// A notification and the [`Pending`] it fills.
    pub fn pending() -> (Self, Pending) {
        let (tx, rx) = oneshot::channel();
        let driver = Driver::default();
        (
            Notify::Pending(PendingSender(Some(tx), driver.clone())),
            Pending(rx, driver),
        )
    }
}

/// The worker-side half of a [`Pending`].
pub struct PendingSender(Option<oneshot::Sender<Result<()>>>, Driver);

impl PendingSender {
    /// The transfer goes to a caller-driven engine.
    pub(crate) fn attach(&self, caller: &Arc<CallerProgress>) {
        let _ = self.1.set(Drive::Caller(caller.clone()));
    }

    /// The transfer goes to a thread-mode engine its waiter may assist
    /// (counted in flight there until this sender completes or drops).
    pub(crate) fn assist(&self, assist: &Arc<Assist>) {
        if self.1.set(Drive::Assist(assist.clone())).is_ok() {
            assist.track();
        }
    }

    /// Whether its waiter assists (see [`PendingSender::assist`]).
    pub(crate) fn assisted(&self) -> bool {
        matches!(self.1.get(), Some(Drive::Assist(_)))
    }
}

impl Drop for PendingSender {
    fn drop(&mut self) {
        if let Some(Drive::Assist(a)) = self.1.get() {
            a.untrack();
        }
    }
}

/// A transfer in flight: block on it ([`Pending::wait`]) or `.await` it
/// with any executor. With a caller-driven engine
/// ([`crate::ProgressMode::Caller`]) waiting and polling drive its NICs.
pub struct Pending(oneshot::Receiver<Result<()>>, Driver);

impl Pending {
    /// Whether the transfer finished.
    pub fn is_done(&self) -> bool {
        self.0.is_ready()
    }

    /// Blocks until the transfer finishes.
    pub fn wait(self) -> Result<()> {
        match self.1.get() {
            Some(Drive::Caller(c)) => {
                c.wait_until("Pending::wait", None, || self.0.is_settled())?;
            }
            Some(Drive::Assist(a)) => {
                a.drive(None, || self.0.is_settled());
            }
            None => {}
        }
        self.0.wait().unwrap_or(Err(TransferError::Shutdown {
            call: "Pending::wait",
        }))
    }

    /// Blocks up to `timeout`; a timeout is an error (the transfer goes on).
    pub fn wait_timeout(self, timeout: Duration) -> Result<()> {
        let block = match self.1.get() {
            Some(Drive::Assist(a)) => a.drive_within(timeout, || self.0.is_settled()),
            d => drive_for(
                d.and_then(Drive::caller),
                "Pending::wait_timeout",
                timeout,
                &self.0,
            )?,
        };
        match self.0.wait_timeout(block) {
            Ok(r) => r,
            Err(_) => Err(TransferError::Timeout {
                call: "Pending::wait_timeout",
                millis: timeout.as_millis().try_into().unwrap_or(u64::MAX),
            }),
        }
    }
}

impl Future for Pending {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // A future is woken by the worker: only a caller-driven engine
        // needs its poller to drive.
        poll_driving(
            this.1.get().and_then(Drive::caller),
            Pin::new(&mut this.0),
            cx,
        )
        .map(|r| {
            r.unwrap_or(Err(TransferError::Shutdown {
                call: "Pending::poll",
            }))
        })
    }
}

impl Drive {
    fn caller(&self) -> Option<&CallerProgress> {
        match self {
            Drive::Caller(c) => Some(c),
            Drive::Assist(_) => None,
        }
    }
}

const FLAG_PENDING: u8 = 0;
const FLAG_OK: u8 = 1;
const FLAG_ERR: u8 = 2;

/// An atomic completion flag, for submitters that poll (e.g. a GPU-adjacent
/// thread spinning on many transfers).
#[derive(Debug, Default)]
pub struct DoneFlag {
    state: AtomicU8,
    error: OnceLock<TransferError>,
}

impl DoneFlag {
    /// A new flag, not done.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether the transfer finished (successfully or not).
    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) != FLAG_PENDING
    }

    /// The outcome, once done.
    pub fn result(&self) -> Option<Result<()>> {
        match self.state.load(Ordering::Acquire) {
            FLAG_OK => Some(Ok(())),
            FLAG_ERR => Some(Err(self.error.get().cloned().unwrap_or(
                TransferError::Shutdown {
                    call: "DoneFlag::result",
                },
            ))),
            _ => None,
        }
    }

    fn set(&self, result: Result<()>) {
        match result {
            Ok(()) => self.state.store(FLAG_OK, Ordering::Release),
            Err(e) => {
                let _ = self.error.set(e);
                self.state.store(FLAG_ERR, Ordering::Release);
            }
        }
    }
}

/// What the worker does with a finished notification.
pub(crate) enum Delivery {
    /// Done inline.
    Done,
    /// A callback to run on the callback thread.
    Deferred(Box<dyn FnOnce() + Send>),
}

impl Notify {
    /// Delivers `result`: flags and pendings inline, callbacks deferred.
    pub(crate) fn deliver(self, result: Result<()>) -> Delivery {
        match self {
            Notify::Flag(flag) => {
                flag.set(result);
                Delivery::Done
            }
            Notify::Pending(mut tx) => {
                let sender = tx.0.take();
                // Out of the in-flight count before the waiter wakes.
                drop(tx);
                if let Some(sender) = sender {
                    sender.send(result);
                }
                Delivery::Done
            }
            Notify::Callback(cb) => Delivery::Deferred(Box::new(move || cb(result))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::worker::WorkerQueue;
    use std::sync::Mutex;

    #[test]
    fn an_assisted_pending_counts_in_flight_until_delivered_or_dropped() {
        let slot: Arc<crate::progress::Slot> = Arc::new(Mutex::new(None));
        let a = Assist::new(vec![(slot, WorkerQueue::new(4))], Duration::from_millis(1));
        let (n, p) = Notify::pending();
        let (m, q) = Notify::pending();
        for notify in [&n, &m] {
            if let Notify::Pending(tx) = notify {
                tx.assist(&a);
                // Set once: a second call neither drives twice nor counts twice.
                tx.assist(&a);
            }
        }
        assert_eq!(a.in_flight(), 2);
        // Delivered: out of the count by the time its waiter sees it.
        assert!(matches!(n.deliver(Ok(())), Delivery::Done));
        assert_eq!(a.in_flight(), 1);
        assert!(p.wait().is_ok());
        // Dropped unfinished (a refused or abandoned job): out as well.
        drop(m);
        assert_eq!(a.in_flight(), 0);
        assert!(q.wait().is_err());
    }
}
