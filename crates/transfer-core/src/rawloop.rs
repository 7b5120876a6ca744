//! The raw write loop: writes posted straight on a bare [`Domain`] (no
//! engine, no worker thread, no queues), the baseline the engine's figures
//! stand next to. One loop for every user (transfer-bench's rows,
//! transfer-efa's tests), so every baseline is timed the same way:
//!
//! - each sample's clock starts *before* `submit_writes` and stops when its
//!   completion is seen: on tcp the data leaves inside the submit call, so a
//!   clock started after it timed half an 8 B write and only the
//!   acknowledgement of a 1 MiB one (issue 20: "7 µs, i.e. 143 GB/s over a
//!   socket");
//! - `warmup` untimed writes go first, so no sample includes connection
//!   set-up on a freshly opened domain;
//! - the sink side is driven by [`drive_sink`] with the same idle policy as
//!   the engine's worker ([`IdleState`], blocking on the domain's wait
//!   descriptor or parking), so the baseline's target sleeps and wakes as
//!   the engine's does, and a busy-polling one is asked for explicitly.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::domain::{Domain, DomainEvent, DomainMr, OpToken, PeerId, WriteOp};
use crate::error::{Result, TransferError};
use crate::idle::{IdlePolicy, IdleState};
use crate::memory::RemoteKey;

/// The source and destination of a raw loop, on any backend's bare domain.
pub struct RawPath<'a, D: Domain> {
    /// The bare domain the writes are posted on.
    pub domain: &'a mut D,
    /// The sink, resolved on `domain`.
    pub peer: PeerId,
    /// Registration of the source on `domain`.
    pub mr: DomainMr,
    /// First source byte (inside `mr`, at least `size` bytes long).
    pub src: *const u8,
    /// Remote address of the sink region's first byte.
    pub base: u64,
    /// Remote key of the sink region.
    pub key: u64,
}

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawParams {
    /// Bytes per write.
    pub size: usize,
    /// Timed writes.
    pub count: usize,
    /// Writes kept in flight (1: one sample per write).
    pub window: usize,
    /// Untimed writes before the timed ones (same size, window 1).
    pub warmup: usize,
    /// Immediate carried by every write.
    pub imm: Option<u32>,
    /// Failure guard: give up after this long (never a measurement).
    pub limit: Duration,
}

impl RawParams {
    /// `count` writes of `size` bytes, `window` in flight, one warm-up
    /// write, no immediate, a 120 s guard.
    pub fn new(size: usize, count: usize, window: usize) -> Self {
        Self {
            size,
            count,
            window,
            warmup: 1,
            imm: None,
            limit: Duration::from_secs(120),
        }
    }
}

/// What a raw loop measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRun {
    /// From the first timed submit call to the last completion.
    pub elapsed: Duration,
    /// Per-write times, submit call included (window 1 only).
    pub samples: Vec<Duration>,
    /// Bytes written by the timed writes.
    pub bytes: u64,
}

impl RawRun {
    /// Bytes per second over the timed writes.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs `p.warmup` untimed writes, then `p.count` timed writes of `p.size`
/// bytes with `p.window` in flight. `also` runs once per polling round:
/// an in-process sink drives its own domain there (manual-progress
/// providers move data only while both sides poll); across processes it
/// does nothing.
///
/// The domain must have nothing else in flight: every completion it
/// reports belongs to this loop.
pub fn run<D: Domain>(
    path: &mut RawPath<'_, D>,
    p: &RawParams,
    mut also: impl FnMut(),
) -> Result<RawRun> {
    const CALL: &str = "rawloop::run";
    // What a fresh domain still has in flight (a verbs connection's
    // handshake with the sink, its events) finishes here, untimed; then
    // every completion the loop sees is its own.
    let settle = Instant::now() + p.limit;
    let mut events = Vec::new();
    while path.domain.has_pending() {
        if Instant::now() >= settle {
            return Err(TransferError::invalid(
                CALL,
                "the domain must be idle (work still in flight after the run's limit)",
            ));
        }
        path.domain.poll(&mut events);
        events.clear();
        also();
    }
    let op = WriteOp {
        local_mr: path.mr,
        local: path.src,
        len: p.size,
        peer: path.peer,
        remote_addr: path.base,
        remote_key: RemoteKey(path.key),
        imm: p.imm,
    };
    let deadline = Instant::now() + p.limit;
    let mut next = 0u64;
    writes(
        path.domain,
        &op,
        p.warmup,
        1,
        &mut next,
        deadline,
        &mut also,
    )?;
    let start = Instant::now();
    let samples = writes(
        path.domain,
        &op,
        p.count,
        p.window.max(1),
        &mut next,
        deadline,
        &mut also,
    )?;
    Ok(RawRun {
        elapsed: start.elapsed(),
        samples: if p.window <= 1 { samples } else { Vec::new() },
        bytes: p.size as u64 * p.count as u64,
    })
}

/// `count` writes, `window` in flight; returns each write's time from
/// right before its submit call to the poll that reported it.
fn writes<D: Domain>(
    domain: &mut D,
    op: &WriteOp,
    count: usize,
    window: usize,
    next: &mut u64,
    deadline: Instant,
    also: &mut impl FnMut(),
) -> Result<Vec<Duration>> {
    let mut events = Vec::with_capacity(64);
    let mut inflight: VecDeque<(u64, Instant)> = VecDeque::with_capacity(window);
    let mut samples = Vec::with_capacity(if window == 1 { count } else { 0 });
    let (mut posted, mut done) = (0usize, 0usize);
    let mut first_error = None;
    let mut idle_rounds = 0u32;
    while done < posted || (posted < count && first_error.is_none()) {
        while first_error.is_none() && posted < count && inflight.len() < window {
            let token = *next;
            *next += 1;
            // The clock starts before the call: a provider may move the
            // whole write inside it.
            let t0 = Instant::now();
            domain.submit_writes(OpToken(token), std::slice::from_ref(op));
            inflight.push_back((token, t0));
            posted += 1;
        }
        events.clear();
        domain.poll(&mut events);
        if events.is_empty() {
            idle_rounds = idle_rounds.wrapping_add(1);
            if idle_rounds % YIELD_EVERY == 0 {
                std::thread::yield_now();
            }
        }
        let now = Instant::now();
        for ev in events.drain(..) {
            let DomainEvent::Completed { op, result } = ev else {
                continue;
            };
            let Some(i) = inflight.iter().position(|(t, _)| *t == op.0) else {
                continue;
            };
            if let Some((_, t0)) = inflight.remove(i) {
                samples.push(now.saturating_duration_since(t0));
            }
            done += 1;
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        also();
        // Writes still in flight after a failure are waited for (their
        // buffers must outlive the provider's use), up to the guard.
        if Instant::now() > deadline {
            return Err(first_error.unwrap_or(TransferError::Timeout {
                call: "rawloop::run",
                millis: 0,
            }));
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(samples),
    }
}

/// Drives a sink's bare domain until `stop` is set, the way the engine's
/// worker drives its NICs under `policy`: poll while busy, spin for
/// `policy.spin` after the last event, then block on the domain's wait
/// descriptor (when it has one and [`Domain::prepare_wait`] agrees) or
/// park for the policy's park time. [`IdlePolicy::busy_poll`] polls
/// without pause (as a caller-driven engine's target does).
///
/// A blocked sink notices `stop` within 10 ms.
pub fn drive_sink<D: Domain>(domain: &mut D, policy: IdlePolicy, stop: &Arc<AtomicBool>) {
    let busy = policy.spin == Duration::MAX;
    let mut idle_rounds = 0u32;
    let mut idle = IdleState::new(policy);
    let mut events = Vec::new();
    while !stop.load(Ordering::Acquire) {
        events.clear();
        domain.poll(&mut events);
        if !events.is_empty() {
            idle.active();
            continue;
        }
        let Some(sleep) = idle.idle_at(Instant::now(), !domain.has_pending()) else {
            // As the engine's targets spin: a worker yields every round
            // (see `worker::run_shared`), a caller-driven engine every 64 idle
            // rounds (`Progress::wait_until`).
            idle_rounds = idle_rounds.wrapping_add(1);
            if !busy || idle_rounds % YIELD_EVERY == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        };
        match domain.wait_fd() {
            Some(fd) => {
                // An arrival is activity, as in the engine's worker.
                if !domain.prepare_wait()
                    || crate::wakeup::wait_readable(&[fd], sleep.block.min(STOP_CHECK), 0)
                {
                    idle.active();
                }
            }
            None => std::thread::sleep(sleep.park.min(STOP_CHECK)),
        }
    }
}

/// Polling threads give their core away every this many idle rounds, as
/// a caller-driven engine's waits do. Where threads outnumber cores (this
/// 2-core VM at load 8-10), a source and a sink that both spin without
/// yielding took 16 ms per 8 B write on shm and on tcp (each waits for the
/// other's time slice); yielding every 64 rounds: 25 µs (shm), 77 µs (tcp).
const YIELD_EVERY: u32 = 64;

/// Longest a [`drive_sink`] sleeps between looks at its stop flag.
const STOP_CHECK: Duration = Duration::from_millis(10);

#[cfg(all(test, feature = "test-domain"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::domain::Domain;
    use crate::memory::{MemoryLocation, MemorySpan};
    use crate::testing::{TestFabric, TestFabricConfig};

    fn span(buf: &mut [u8]) -> MemorySpan {
        MemorySpan {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        }
    }

    /// Samples and elapsed time of `count` 8 B writes, window `window`, on
    /// a fabric whose submit calls sleep `delay`.
    fn measure(delay: Duration, count: usize, window: usize) -> RawRun {
        let fabric = TestFabric::new(TestFabricConfig {
            submit_delay: delay,
            ..TestFabricConfig::default()
        });
        let (mut a, mut b) = (fabric.domain(), fabric.domain());
        let (mut src, mut dst) = (vec![7u8; 64], vec![0u8; 64]);
        let mr = a.register(span(&mut src)).unwrap().mr;
        let remote = b.register(span(&mut dst)).unwrap().remote;
        let peer = a.resolve_peer(&b.address()).unwrap();
        let mut path = RawPath {
            domain: &mut a,
            peer,
            mr,
            src: src.as_ptr(),
            base: remote.base,
            key: remote.key.0,
        };
        let mut sink = Vec::new();
        let r = run(&mut path, &RawParams::new(8, count, window), || {
            sink.clear();
            b.poll(&mut sink);
        })
        .unwrap();
        assert_eq!(&dst[..8], &[7u8; 8]);
        r
    }

    #[test]
    fn no_sample_is_shorter_than_the_submit_call() {
        let delay = Duration::from_millis(2);
        let r = measure(delay, 5, 1);
        assert_eq!(r.samples.len(), 5);
        for s in &r.samples {
            assert!(*s >= delay, "a sample of {s:?} under the 2 ms submit");
        }
        assert!(r.elapsed >= delay * 5);
        assert_eq!(r.bytes, 40);
    }

    #[test]
    fn windows_give_no_samples_and_count_every_write() {
        let r = measure(Duration::ZERO, 40, 8);
        assert!(r.samples.is_empty());
        assert_eq!(r.bytes, 320);
    }

    #[test]
    fn a_failed_write_is_reported_after_its_window_drained() {
        let fabric = TestFabric::new(TestFabricConfig::default());
        let (mut a, b) = (fabric.domain(), fabric.domain());
        let mut src = vec![1u8; 8];
        let mr = a.register(span(&mut src)).unwrap().mr;
        let peer = a.resolve_peer(&b.address()).unwrap();
        let mut path = RawPath {
            domain: &mut a,
            peer,
            mr,
            src: src.as_ptr(),
            base: 0,
            key: 0xdead,
        };
        assert!(run(&mut path, &RawParams::new(8, 4, 2), || {}).is_err());
        assert!(!a.has_pending());
    }

    #[test]
    fn a_sink_driven_like_a_worker_stops_when_asked() {
        let fabric = TestFabric::new(TestFabricConfig::default());
        let mut d = fabric.domain();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let t = std::thread::spawn(move || drive_sink(&mut d, IdlePolicy::default(), &flag));
        std::thread::sleep(Duration::from_millis(30));
        stop.store(true, Ordering::Release);
        assert!(t.join().is_ok());
    }
}
