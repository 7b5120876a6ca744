//! `Transfer`: one operation in flight (a write, a send, an immediate
//! expectation) that Python can poll, block on (GIL released) or await.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use transfer_core::{Result as CoreResult, TransferError};

use crate::engine::Shared;
use crate::error::{invalid, py_err};
use crate::signal::{LoopWaker, Signal, lock};

/// An engine future: a `Pending` (writes, sends) or an `ImmFuture`.
pub(crate) type EngineFuture = Pin<Box<dyn Future<Output = CoreResult<()>> + Send>>;

/// Several engine futures as one: resolves when every one has, with the
/// first error among them (`Engine.write_batch` over several source
/// regions: one engine request per region, one `Transfer` for Python).
pub(crate) struct JoinAll {
    futs: Vec<Option<EngineFuture>>,
    err: Option<TransferError>,
}

impl JoinAll {
    pub(crate) fn new(futs: Vec<EngineFuture>) -> Self {
        Self {
            futs: futs.into_iter().map(Some).collect(),
            err: None,
        }
    }
}

impl Future for JoinAll {
    type Output = CoreResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut running = false;
        for slot in &mut this.futs {
            let Some(fut) = slot.as_mut() else { continue };
            match fut.as_mut().poll(cx) {
                Poll::Ready(r) => {
                    *slot = None;
                    if let Err(e) = r {
                        this.err.get_or_insert(e);
                    }
                }
                Poll::Pending => running = true,
            }
        }
        if running {
            Poll::Pending
        } else {
            Poll::Ready(this.err.take().map_or(Ok(()), Err))
        }
    }
}

/// How long a blocking wait keeps the GIL released before it looks for
/// signals (Ctrl-C) and goes on.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// The call a cancelled operation's error names (`kind == "cancelled"` in Python).
pub(crate) const CANCEL_CALL: &str = "Transfer.cancel";
const CANCELLED: &str = "cancelled before it finished";

/// The shared state of one operation.
pub(crate) struct Op {
    /// The engine future until it resolved.
    fut: Mutex<Option<EngineFuture>>,
    result: OnceLock<CoreResult<()>>,
    signal: Arc<Signal>,
    waker: Waker,
    /// The engine is caller-driven: polling the future drives its NICs,
    /// and a wait spins on this thread instead of waiting for a hand-off.
    driven: bool,
    /// The engine, for a thread-mode wait's first slice to drive its NICs
    /// (`TransferEngine::drive_while_waiting`); weak, so that an
    /// expectation the engine keeps does not keep the engine. Empty for a
    /// transfer larger than `transfer_core::assist::MAX_ASSISTED_BYTES`
    /// (the worker streams it).
    engine: Weak<Shared>,
}

/// What one slice of a blocking wait ended with.
pub(crate) enum Waited {
    Done(CoreResult<()>),
    TimedOut,
    /// The slice ended before the deadline: check signals, then go on.
    Slice,
}

impl Op {
    /// `assist`: a thread-mode wait may drive the NICs (small transfers
    /// and immediate expectations).
    pub(crate) fn new(fut: EngineFuture, shared: &Arc<Shared>, assist: bool) -> Arc<Self> {
        let driven = shared.caller;
        let signal = Signal::new();
        let op = Arc::new(Self {
            fut: Mutex::new(Some(fut)),
            result: OnceLock::new(),
            waker: Waker::from(signal.clone()),
            signal,
            driven,
            engine: if assist {
                Arc::downgrade(shared)
            } else {
                Weak::new()
            },
        });
        // The first poll registers the waker, so completion always notifies.
        op.poll();
        op
    }

    /// The outcome if the operation finished; polls the future otherwise.
    pub(crate) fn poll(&self) -> Option<&CoreResult<()>> {
        if let Some(r) = self.result.get() {
            return Some(r);
        }
        let mut slot = lock(&self.fut);
        if let Some(r) = self.result.get() {
            return Some(r);
        }
        let fut = slot.as_mut()?;
        if let Poll::Ready(r) = fut.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            let _ = self.result.set(r);
            // Dropping a resolved future has no effect on the engine.
            *slot = None;
        }
        drop(slot);
        self.result.get()
    }

    /// Waits until done, `deadline` or the end of one slice (GIL released
    /// by the caller). `first`: the wait's first slice, which polls for
    /// [`transfer_core::spin_wait::window`] before it blocks (see
    /// [`crate::signal::Signal::wait_past`]).
    pub(crate) fn wait_slice(&self, deadline: Option<Instant>, first: bool) -> Waited {
        let slice_end = Instant::now() + SIGNAL_CHECK;
        if self.driven {
            return self.spin_slice(deadline, slice_end);
        }
        if first {
            // Worker threads with assisting on: drive the NICs on this
            // thread for a while (the worker steps back) instead of waiting
            // for its two hand-offs; then block as below.
            if let Some(shared) = self.engine.upgrade() {
                let limit = deadline
                    .map_or(slice_end, |d| d.min(slice_end))
                    .saturating_duration_since(Instant::now());
                let done = shared
                    .with("Transfer.wait", |e| {
                        Ok(e.drive_while_waiting(limit, || self.poll().is_some()))
                    })
                    .unwrap_or(false);
                if done {
                    if let Some(r) = self.poll() {
                        return Waited::Done(r.clone());
                    }
                }
            }
        }
        let mut spin = if first {
            transfer_core::spin_wait::window()
        } else {
            Duration::ZERO
        };
        loop {
            let seen = self.signal.generation();
            if let Some(r) = self.poll() {
                return Waited::Done(r.clone());
            }
            let until = deadline.map_or(slice_end, |d| d.min(slice_end));
            let changed = self.signal.wait_past(seen, until, spin);
            spin = Duration::ZERO;
            if !changed {
                if let Some(r) = self.poll() {
                    return Waited::Done(r.clone());
                }
                return match deadline {
                    Some(d) if Instant::now() >= d => Waited::TimedOut,
                    _ => Waited::Slice,
                };
            }
        }
    }

    /// A caller-driven wait: every poll runs one progress pass on this
    /// thread (the engine's futures drive its NICs when polled), as NIXL's
    /// caller-driven mode spins in `checkXferReq` + `progress`.
    fn spin_slice(&self, deadline: Option<Instant>, slice_end: Instant) -> Waited {
        let mut rounds = 0u32;
        loop {
            if let Some(r) = self.poll() {
                return Waited::Done(r.clone());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Waited::TimedOut;
            }
            if now >= slice_end {
                return Waited::Slice;
            }
            rounds = rounds.wrapping_add(1);
            relax(rounds);
        }
    }

    /// Blocks (GIL released, Ctrl-C honoured) until done or `timeout`
    /// seconds passed (`None`: no limit). `Ok(None)` on timeout.
    pub(crate) fn block(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<CoreResult<()>>> {
        if let Some(r) = self.poll() {
            return Ok(Some(r.clone()));
        }
        let deadline = deadline(timeout)?;
        let mut first = true;
        loop {
            match py.detach(|| self.wait_slice(deadline, first)) {
                Waited::Done(r) => return Ok(Some(r)),
                Waited::TimedOut => return Ok(None),
                Waited::Slice => py.check_signals()?,
            }
            first = false;
        }
    }

    /// Makes `waker` receive `token` once the operation finished (at once
    /// if it already has).
    pub(crate) fn notify(&self, waker: &LoopWaker, token: u64) {
        self.signal.add_notifier(waker.inner.clone(), token);
        if self.poll().is_some() {
            waker.inner.push(token);
        }
    }

    /// Drops the engine future if the operation has not finished (for an
    /// immediate expectation: withdraws it) and resolves as cancelled.
    /// Returns whether it did.
    pub(crate) fn cancel(&self) -> bool {
        self.abandon(TransferError::invalid(CANCEL_CALL, CANCELLED))
    }

    /// Drops the engine future if the operation has not finished and
    /// resolves with `err`; returns whether it did.
    pub(crate) fn abandon(&self, err: TransferError) -> bool {
        if self.poll().is_some() {
            return false;
        }
        let mut slot = lock(&self.fut);
        if self.result.get().is_some() || slot.is_none() {
            return false;
        }
        // Dropping an `ImmFuture` withdraws its expectation.
        *slot = None;
        let _ = self.result.set(Err(err));
        drop(slot);
        self.signal.notify();
        true
    }
}

/// Between two fruitless passes of a spinning wait: give the core away
/// now and then, so that the peer process (or a worker) on a 2-core
/// machine gets to run, as transfer-core's own caller-driven waits do.
fn relax(rounds: u32) {
    if rounds % 64 == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Drives a caller-driven engine on this thread (GIL released by the
/// caller) until `ready()` holds or `until` passes; returns whether it held.
pub(crate) fn drive_until(
    shared: &crate::engine::Shared,
    until: Instant,
    ready: impl Fn() -> bool,
) -> bool {
    let mut rounds = 0u32;
    loop {
        let did = shared.progress();
        if ready() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        if !did {
            rounds = rounds.wrapping_add(1);
            relax(rounds);
        }
    }
}

/// `timeout` seconds from now; `None` for no limit.
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) => {
            let d = Duration::try_from_secs_f64(t).map_err(|_| {
                invalid(
                    "timeout",
                    format!("{t} is not a non-negative number of seconds"),
                )
            })?;
            // A limit too far to represent is no limit.
            Ok(Instant::now().checked_add(d))
        }
    }
}

/// The error of a wait that ran out of time.
pub(crate) fn timeout_error(call: &'static str, timeout: Option<f64>) -> TransferError {
    let millis = timeout.map_or(u64::MAX, |t| (t * 1000.0) as u64);
    TransferError::Timeout { call, millis }
}

/// One operation in flight: a write, a send, a barrier, or an immediate
/// expectation. `done()` polls, `wait(timeout)` blocks with the GIL
/// released, `await transfer` suspends an asyncio task. A failure raises
/// `TransferError` (or a subclass) from `wait()` / `await`.
#[pyclass(frozen, module = "transfer")]
pub struct Transfer {
    pub(crate) op: Arc<Op>,
    what: &'static str,
    /// An immediate expectation, which `cancel()` can withdraw.
    cancellable: bool,
    /// Objects kept alive until the transfer is dropped (the source region).
    _keep: Option<Py<PyAny>>,
}

impl Transfer {
    /// A write, send or barrier; `keep` stays referenced while the transfer lives.
    /// `shared`: the engine (a caller-driven one's waits drive it);
    /// `assist`: see [`Op::new`].
    pub(crate) fn new(
        fut: EngineFuture,
        what: &'static str,
        keep: Option<Py<PyAny>>,
        shared: &Arc<Shared>,
        assist: bool,
    ) -> Self {
        Self {
            op: Op::new(fut, shared, assist),
            what,
            cancellable: false,
            _keep: keep,
        }
    }

    /// An immediate expectation (cancellable).
    pub(crate) fn expectation(op: Arc<Op>) -> Self {
        Self {
            op,
            what: "expect_imm",
            cancellable: true,
            _keep: None,
        }
    }
}

#[pymethods]
impl Transfer {
    /// Whether the operation finished (successfully or not). With a
    /// caller-driven engine this runs one progress pass (GIL released).
    fn done(&self, py: Python<'_>) -> bool {
        if self.op.driven && self.op.result.get().is_none() {
            return py.detach(|| self.op.poll().is_some());
        }
        self.op.poll().is_some()
    }

    /// Blocks until the operation finished, with the GIL released; raises
    /// its error, or `TransferTimeout` when `timeout` seconds pass first
    /// (the operation goes on: wait again or await it).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        match self.op.block(py, timeout)? {
            Some(r) => r.map_err(py_err),
            None => Err(py_err(timeout_error("Transfer.wait", timeout))),
        }
    }

    /// The error the operation failed with (`None` while running or after success).
    fn exception(&self, py: Python<'_>) -> Option<PyErr> {
        match self.op.poll() {
            Some(Err(e)) => Some(crate::error::to_py(py, e)),
            _ => None,
        }
    }

    /// Withdraws an immediate expectation that has not been met yet (later
    /// arrivals go to later expectations) and returns True; the transfer
    /// then fails with kind "cancelled". Writes, sends and barriers cannot
    /// be called back once submitted: False, as for a finished transfer.
    fn cancel(&self) -> bool {
        self.cancellable && self.op.cancel()
    }

    /// Whether this is an immediate expectation (`Engine.expect_imm`).
    #[getter]
    fn cancellable(&self) -> bool {
        self.cancellable
    }

    /// Internal (asyncio): push `token` to `waker` once done.
    fn _notify(&self, waker: &LoopWaker, token: u64) {
        self.op.notify(waker, token);
    }

    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("transfer._aio")?
            .getattr("wait")?
            .call1((slf,))?
            .call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let state = match self.op.poll() {
            None => "running".to_owned(),
            Some(Ok(())) => "done".to_owned(),
            Some(Err(e)) => format!("failed: {e}"),
        };
        format!("<Transfer {} {state}>", self.what)
    }
}
