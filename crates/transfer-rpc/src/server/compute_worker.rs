//! The compute worker process (`transfer-rpc-compute`): the other end of
//! [`super::isolated`]. It mirrors the server's buffers it is handed
//! (same handles and bases, mapped from their memfds), checks each graph
//! the server validated against that view (every tensor inside a mapped
//! buffer: [`super::worker_graph`]), and runs it on ggml-cpu. It trusts its
//! server and nothing else reaches it; if a kernel crashes it, the server
//! reports the error to the session that sent the graph and starts another.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::GgmlCpuBackend;
use super::compute::{ComputeBackend, KeyedCache};
use super::host_memory::HostMemory;
use super::registry::BufferRegistry;
use super::worker_graph;
use super::worker_ipc::{
    Pace, RESULT_ERROR, RESULT_NOT_HELD, RESULT_OK, Receiver, TAG_COMPUTE, TAG_MAP, TAG_RESULT,
    TAG_RUN, TAG_UNMAP, TIMED_WAIT_MAX, core_spare, poll_readable, poll_readable_around, send,
    u64_at,
};
use crate::error::{Result, RpcError};
use crate::validate::{GraphLimits, ValidatedGraph};

/// Environment variable that arms [`CRASH_MARKER`] (tests only).
pub const CRASH_ENV: &str = "TRANSFER_RPC_TEST_CRASH";
/// With [`CRASH_ENV`]=1 in the worker's environment, a graph holding a
/// tensor of this name aborts the worker: how tests prove that a crash in
/// compute takes down neither the server nor other sessions, without
/// knowing a validator gap.
pub const CRASH_MARKER: &[u8] = b"transfer-rpc-test-crash";

/// How long the worker looks for its next message before it blocks
/// (CPU spent per graph at most; yielding between looks).
const NEXT_POLL: std::time::Duration = std::time::Duration::from_micros(100);

fn io(call: &'static str, e: std::io::Error) -> RpcError {
    RpcError::io(call, e)
}

/// A graph the worker validated, kept for RUN.
struct Kept {
    graph: ValidatedGraph,
    /// The worker registry's `removals` when validated.
    removals: u64,
}

struct Worker<'a> {
    devices: u32,
    registry: &'a BufferRegistry,
    backend: &'a GgmlCpuBackend,
    limits: &'a GraphLimits,
    crash_armed: bool,
    kept: KeyedCache<Kept>,
}

impl Worker<'_> {
    /// COMPUTE: `key u64 |` the validated graph ([`worker_graph`]).
    fn compute(&mut self, body: &[u8]) -> Result<()> {
        let key = u64_at(body, 0)
            .ok_or_else(|| RpcError::malformed("compute worker: COMPUTE", "short"))?;
        let removals = self.registry.removals();
        let graph = worker_graph::decode(
            body.get(8..).unwrap_or_default(),
            self.devices,
            self.registry,
            self.limits,
        )?;
        if self.crash_armed
            && graph
                .tensors
                .iter()
                .any(|t| t.name.starts_with(CRASH_MARKER))
        {
            std::process::abort();
        }
        self.backend.compute_keyed(&graph, self.registry, key)?;
        if key != 0 {
            let n = graph.tensors.len();
            self.kept
                .put(key, Kept { graph, removals }, n, self.limits.max_tensors);
        }
        Ok(())
    }

    /// RUN: `key u64`; `None` when the graph is not kept (any more).
    fn run(&mut self, body: &[u8]) -> Option<Result<()>> {
        let key = u64_at(body, 0)?;
        let kept = self.kept.take(key)?;
        // A buffer unmapped or replaced since: validate again (COMPUTE).
        if kept.removals != self.registry.removals() {
            return None;
        }
        let result = self.backend.compute_keyed(&kept.graph, self.registry, key);
        if result.is_ok() {
            let n = kept.graph.tensors.len();
            self.kept.put(key, kept, n, self.limits.max_tensors);
        }
        Some(result)
    }
}

fn answer(sock: BorrowedFd<'_>, result: Option<Result<()>>) -> Result<()> {
    let answer = match result {
        Some(Ok(())) => vec![RESULT_OK],
        Some(Err(e)) => {
            let mut a = vec![RESULT_ERROR];
            a.extend_from_slice(e.to_string().as_bytes());
            a
        }
        None => vec![RESULT_NOT_HELD],
    };
    send(sock, TAG_RESULT, &answer, None).map_err(|e| io("compute worker: answer", e))
}

/// Serves the server on `sock` until it closes the socket. `limits` are
/// the server's graph limits (the worker validates with the same).
pub fn serve(sock: OwnedFd, devices: u32, threads: usize, limits: GraphLimits) -> Result<()> {
    let registry = BufferRegistry::new(u64::MAX);
    let backend = GgmlCpuBackend::new(devices, threads, limits);
    let mut worker = Worker {
        devices,
        registry: &registry,
        backend: &backend,
        limits: &limits,
        crash_armed: std::env::var(CRASH_ENV).is_ok_and(|v| v == "1"),
        kept: KeyedCache::default(),
    };
    let mut rx = Receiver::default();
    let spare_core = core_spare(threads);
    // When the last answer went, and how long after an answer the next
    // message came last time.
    let mut answered: Option<std::time::Instant> = None;
    let mut gaps = Pace::default();
    loop {
        if !rx.has_read_ahead() {
            match (answered, gaps.expected()) {
                // A client's decode steps come at a steady pace: the next
                // graph is due about as long after this answer as the last
                // one was.
                (Some(_), Some(gap)) if spare_core && gap < TIMED_WAIT_MAX => {
                    poll_readable_around(sock.as_fd(), gap);
                }
                // The next graph of a stream of graphs (llama.cpp's
                // test-backend-ops perf mode, a client's back-to-back
                // steps) comes right after the answer: looking for it
                // briefly spares this process the wake-up of a blocked
                // read (see `isolated::ANSWER_POLL_MAX` for what one costs
                // here).
                _ => {
                    poll_readable(sock.as_fd(), NEXT_POLL);
                }
            }
        }
        let (tag, body) = match rx.recv(sock.as_fd()) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io("compute worker: read", e)),
        };
        if let Some(at) = answered.take() {
            gaps.observe(at.elapsed());
        }
        match tag {
            TAG_MAP => {
                let (Some(handle), Some(base), Some(size)) =
                    (u64_at(&body, 0), u64_at(&body, 8), u64_at(&body, 16))
                else {
                    return Err(RpcError::malformed("compute worker: MAP", "short"));
                };
                let fd = rx
                    .take_fd()
                    .ok_or_else(|| RpcError::malformed("compute worker: MAP", "no descriptor"))?;
                let len = usize::try_from(size)
                    .map_err(|_| RpcError::malformed("compute worker: MAP", "size"))?;
                let mem = HostMemory::map_shared(fd, len)
                    .ok_or_else(|| RpcError::refused("compute worker: MAP", "mmap failed"))?;
                registry.remove_mapped(handle);
                registry.insert_mapped(handle, base, size, mem);
            }
            TAG_UNMAP => {
                if let Some(h) = u64_at(&body, 0) {
                    if registry.remove_mapped(h) {
                        backend.buffers_freed();
                    }
                }
            }
            TAG_COMPUTE => {
                answer(sock.as_fd(), Some(worker.compute(&body)))?;
                answered = Some(std::time::Instant::now());
            }
            TAG_RUN => {
                answer(sock.as_fd(), worker.run(&body))?;
                answered = Some(std::time::Instant::now());
            }
            other => {
                return Err(RpcError::malformed(
                    "compute worker",
                    format!("message tag {other}"),
                ));
            }
        }
    }
}
