//! The raw provider loop: writes posted straight on a bare domain (no
//! engine, no worker thread, no queues), between the same two processes as
//! the engine run. It is the figure the engine must approach.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use transfer::AnyDomain;
use transfer_core::{Domain, DomainEvent, DomainMr, OpToken, PeerId, RemoteKey, WriteOp};

use crate::backend::GUARD;
use crate::error::{Result, protocol};

/// The source and destination of a raw loop, on any backend's bare domain
/// (libfabric or verbs).
pub struct RawPath<'a, D: Domain = AnyDomain> {
    /// The bare domain.
    pub domain: &'a mut D,
    /// The sink, resolved on `domain`.
    pub peer: PeerId,
    /// Registration of the source on `domain`.
    pub mr: DomainMr,
    /// First source byte.
    pub src: *const u8,
    /// Remote base address of the sink region.
    pub base: u64,
    /// Remote key of the sink region.
    pub key: u64,
}

/// What a raw loop measured.
pub struct RawRun {
    /// Wall time from first post to last completion.
    pub elapsed: Duration,
    /// Per-operation times (only with window 1).
    pub samples: Vec<Duration>,
}

/// Posts `count` writes of `size` bytes, `window` in flight.
pub fn run<D: Domain>(
    p: &mut RawPath<'_, D>,
    size: usize,
    count: usize,
    window: usize,
    imm: Option<u32>,
) -> Result<RawRun> {
    let op = WriteOp {
        local_mr: p.mr,
        local: p.src,
        len: size,
        peer: p.peer,
        remote_addr: p.base,
        remote_key: RemoteKey(p.key),
        imm,
    };
    let window = window.max(1);
    let mut events = Vec::with_capacity(64);
    let mut inflight: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut samples = Vec::new();
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < count {
        while posted < count && inflight.len() < window {
            p.domain
                .submit_writes(OpToken(posted as u64), std::slice::from_ref(&op));
            inflight.push_back((posted as u64, Instant::now()));
            posted += 1;
        }
        events.clear();
        p.domain.poll(&mut events);
        for ev in events.drain(..) {
            if let DomainEvent::Completed { op, result } = ev {
                result?;
                if let Some(i) = inflight.iter().position(|(t, _)| *t == op.0) {
                    if let Some((_, t0)) = inflight.remove(i) {
                        if window == 1 {
                            samples.push(t0.elapsed());
                        }
                    }
                }
                done += 1;
            }
        }
        if start.elapsed() > GUARD {
            return Err(protocol("raw loop", "completions stopped arriving"));
        }
    }
    Ok(RawRun {
        elapsed: start.elapsed(),
        samples,
    })
}
