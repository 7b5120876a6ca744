//! The receiver's "it has landed" signal and the workloads' other waits.
//!
//! On the host, a receiver blocks on the engine's own expectation
//! ([`TransferEngine::imm_future`]): the worker that counts the last
//! immediate wakes the waiting thread directly. The GPU form instead arms
//! transfer-cuda's `set_flag_on_imm` with a `GpuFlag` (GDRCopy or
//! host-mapped memory) and lets a kernel poll it; not built here (no GPU on
//! this machine). An earlier host form armed `set_flag_on_imm` with a host
//! flag and polled it with `yield_now`: each arrival then went worker ->
//! callback thread -> polling thread, and the 2-6 polling threads of the
//! ranks took the cores from the engine workers that had to move the bytes
//! (figures at [`progress_mode`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use transfer_core::{DoneFlag, ImmFuture, ProgressMode, TransferEngine};

use crate::backend::{BackendOpts, GUARD};
use crate::error::{Result, protocol};

/// Wakes the thread that blocks in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Blocks this thread (parked, not spinning) until `f` resolves or
/// `deadline` passes (`None`).
///
/// With caller-driven progress each poll drives the NICs and the future
/// wakes itself (a busy poll, as MPI's waits are) and every idle round
/// yields the core, as Open MPI does when oversubscribed (mpirun
/// --oversubscribe sets mpi_yield_when_idle): a shm write moves only while
/// its target polls, so 4-6 ranks on 2 cores must take turns quickly.
/// Yielding every 64th idle round instead left moe E=4 T=1 ranks ~180 µs
/// apart (a staircase 20/400/580/770 µs over the 4 ranks, shm, load ~5);
/// every round: 80/200/230/300 µs.
fn block_on<F: Future + Unpin>(f: &mut F, deadline: Instant) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = Pin::new(&mut *f).poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::yield_now();
        std::thread::park_timeout(deadline - now);
    }
}

/// One armed counter: met once `count` immediates `imm` arrived.
pub struct Armed {
    fut: ImmFuture,
    what: &'static str,
}

/// Arms a counter on `engine`: met once `count` immediates `imm` have
/// arrived (consumed, as expectations are; arrivals before the arming are
/// held by the engine and count).
pub fn arm(engine: &TransferEngine, imm: u32, count: u64, what: &'static str) -> Armed {
    Armed {
        fut: engine.imm_future(imm, count),
        what,
    }
}

impl Armed {
    /// Blocks until the counter reached its target or `deadline` passed.
    pub fn wait(&mut self, deadline: Instant) -> Result<()> {
        match block_on(&mut self.fut, deadline) {
            Some(r) => Ok(r?),
            None => Err(protocol(
                "workloads: wait",
                format!("{} never arrived", self.what),
            )),
        }
    }
}

/// Waits until `n` immediates `imm` arrived (blocking), consuming them.
pub fn wait_imms(
    engine: &TransferEngine,
    imm: u32,
    n: u64,
    deadline: Instant,
    what: &'static str,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    arm(engine, imm, n, what).wait(deadline)
}

/// Waits for local completions. Caller-driven: drives the engine (nothing
/// else does), yielding on every idle pass. Worker threads: a few yields, then
/// sleeps growing to 200 µs, so the waiter does not take the cores from the
/// workers that still move bytes (only buffer reuse waits on these; no
/// metric ends here).
pub fn wait_flags(engine: &TransferEngine, flags: &[Arc<DoneFlag>]) -> Result<()> {
    let deadline = Instant::now() + GUARD;
    let caller = engine.progress_mode() == ProgressMode::Caller;
    for f in flags {
        let mut nap = Duration::from_micros(5);
        let mut rounds = 0u32;
        while !f.is_done() {
            if Instant::now() > deadline {
                return Err(protocol("workloads: wait", "completion never arrived"));
            }
            rounds = rounds.wrapping_add(1);
            if caller {
                if !engine.progress() {
                    std::thread::yield_now();
                }
            } else if rounds < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_micros(200));
            }
        }
        f.result().unwrap_or(Ok(()))?;
    }
    Ok(())
}

/// How the workloads' engines make progress: caller-driven on shm, worker
/// threads elsewhere; `TRANSFER_WORKLOADS_PROGRESS=thread|caller` forces one
/// (for comparison).
///
/// Measured with both, interleaved with Open MPI (`--quick`, release,
/// 2 cores, load 4-5): on shm caller-driven progress took kv's
/// time-to-last-layer from 6.4 ms to 0.79 ms (kv_gbps 1.7 -> 2.3) and moe
/// T=1 dispatch from 250-660 µs to 300-350 µs; libfabric's shm moves a
/// write only while its target polls, and with worker threads every
/// arrival crossed worker -> waiter on cores shared by 4-6 ranks. On tcp
/// it made things worse (kv ttll 27 -> 73 ms, moe T=32 dispatch 10 -> 19
/// ms): the sockets then drain only while a rank is inside a wait, while
/// the worker keeps them moving in the background.
pub fn progress_mode(opts: &BackendOpts) -> Result<ProgressMode> {
    Ok(
        match std::env::var("TRANSFER_WORKLOADS_PROGRESS").as_deref() {
            Ok("thread") => ProgressMode::Thread,
            Ok("caller") => ProgressMode::Caller,
            _ if opts.provider()?.starts_with("shm") => ProgressMode::Caller,
            _ => ProgressMode::Thread,
        },
    )
}
