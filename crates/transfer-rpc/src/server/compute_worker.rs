//! The compute worker process (`transfer-rpc-compute`): the other end of
//! [`super::isolated`]. It mirrors the server's buffers it is handed
//! (same handles and bases, mapped from their memfds), validates each
//! graph again against that view, and runs it on ggml-cpu. It trusts its
//! server and nothing else reaches it; if a kernel crashes it, the server
//! reports the error to the session that sent the graph and starts another.

use std::os::fd::{AsFd, OwnedFd};

use super::GgmlCpuBackend;
use super::compute::ComputeBackend;
use super::host_memory::HostMemory;
use super::registry::BufferRegistry;
use super::worker_ipc::{Receiver, TAG_COMPUTE, TAG_MAP, TAG_RESULT, TAG_UNMAP, send, u64_at};
use crate::error::{Result, RpcError};
use crate::protocol::GraphPayload;
use crate::validate::{GraphLimits, validate_graph};

/// Environment variable that arms [`CRASH_MARKER`] (tests only).
pub const CRASH_ENV: &str = "TRANSFER_RPC_TEST_CRASH";
/// With [`CRASH_ENV`]=1 in the worker's environment, a graph holding a
/// tensor of this name aborts the worker: how tests prove that a crash in
/// compute takes down neither the server nor other sessions, without
/// knowing a validator gap.
pub const CRASH_MARKER: &[u8] = b"transfer-rpc-test-crash";

fn io(call: &'static str, e: std::io::Error) -> RpcError {
    RpcError::io(call, e)
}

fn compute(
    body: &[u8],
    devices: u32,
    registry: &BufferRegistry,
    backend: &GgmlCpuBackend,
    limits: &GraphLimits,
    crash_armed: bool,
) -> Result<()> {
    let g = GraphPayload::decode(body)?;
    if crash_armed && g.tensors.iter().any(|t| t.name.starts_with(CRASH_MARKER)) {
        std::process::abort();
    }
    let graph = validate_graph(g, devices, registry, limits)?;
    backend.compute(&graph, registry)
}

/// Serves the server on `sock` until it closes the socket.
pub fn serve(sock: OwnedFd, devices: u32, threads: usize) -> Result<()> {
    let limits = GraphLimits::default();
    let registry = BufferRegistry::new(u64::MAX);
    let backend = GgmlCpuBackend::new(devices, threads, limits);
    let crash_armed = std::env::var(CRASH_ENV).is_ok_and(|v| v == "1");
    let mut rx = Receiver::default();
    loop {
        let (tag, body) = match rx.recv(sock.as_fd()) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io("compute worker: read", e)),
        };
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
                    registry.remove_mapped(h);
                }
            }
            TAG_COMPUTE => {
                let result = compute(&body, devices, &registry, &backend, &limits, crash_armed);
                let mut answer = vec![u8::from(result.is_ok())];
                if let Err(e) = result {
                    answer.extend_from_slice(e.to_string().as_bytes());
                }
                send(sock.as_fd(), TAG_RESULT, &answer, None)
                    .map_err(|e| io("compute worker: answer", e))?;
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
