//! Command handlers of a session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::compute::{StoredGraph, next_graph_key};
use super::fair::{check_work, graph_work};
use super::session::Session;
use crate::error::{Result, RpcError};
use crate::protocol::hello::{ExtInfo, HelloResponse};
use crate::protocol::{Request, Response, RpcTensor};
use crate::validate::{CheckedTensor, check_shape, check_tensor, validate_graph};

/// Longest MARK_WAIT (a client asks for less): the plugin's default answer
/// deadline.
const MAX_MARK_WAIT: Duration = Duration::from_secs(300);
/// A MARK_WAIT checks for a server shutdown this often.
const MARK_WAIT_SLICE: Duration = Duration::from_millis(250);

impl Session {
    fn check_device(&self, call: &'static str, device: u32) -> Result<()> {
        if device < self.shared.config.devices {
            Ok(())
        } else {
            Err(RpcError::refused(
                call,
                format!("device {device} of {}", self.shared.config.devices),
            ))
        }
    }

    /// The piece a copy of `total` bytes is staged in: at most
    /// `STREAM_CHUNK`, and never more than one address may hold.
    fn stage_chunk(&self, total: u64) -> u64 {
        total
            .min(super::session::STREAM_CHUNK as u64)
            .min(self.shared.budget.per_address())
            .max(1)
    }

    /// How long a command may wait for in-flight budget: the frame timeout.
    fn wait_until(&self) -> std::time::Instant {
        std::time::Instant::now() + self.shared.config.frame_timeout
    }

    fn tensor(&self, call: &'static str, t: &RpcTensor) -> Result<CheckedTensor> {
        check_tensor(call, t, self.shared.registry.as_ref())
    }

    /// Executes one request; `None` for commands without a response.
    pub(super) fn dispatch(&mut self, req: Request<'_>) -> Result<Option<Response>> {
        let reg = Arc::clone(&self.shared.registry);
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        match (&req, self.hello_done) {
            (Request::Hello(_), false) => {
                let slot = self
                    .shared
                    .admission
                    .promote(self.id, self.peer_ip, cfg.hello_timeout)
                    .map_err(|r| RpcError::refused("HELLO", r.to_string()))?;
                self.slot = Some(slot);
                self.hello_done = true;
                return Session::respond(Response::Hello(HelloResponse::ours()));
            }
            (Request::Hello(_), true) => {
                return Err(RpcError::refused("HELLO", "second HELLO on a connection"));
            }
            (_, false) => {
                return Err(RpcError::refused(
                    req.command().name(),
                    "HELLO must come first",
                ));
            }
            _ => {}
        }
        self.settle_before(req.command());
        match req {
            Request::Hello(_) => Err(RpcError::refused("HELLO", "unreachable")),
            Request::AllocBuffer { device, size } => {
                self.check_device("ALLOC_BUFFER", device)?;
                let buf = if size <= cfg.max_buffer_size {
                    reg.alloc_for(self.id, device, size)
                } else {
                    Err(format!(
                        "larger than the most one buffer may hold ({})",
                        cfg.max_buffer_size
                    ))
                };
                match buf {
                    Ok(b) => Session::respond(Response::AllocBuffer {
                        remote_ptr: b.handle,
                        remote_size: b.size,
                    }),
                    Err(why) => {
                        self.shared.log(&format!(
                            "session {}: ALLOC_BUFFER of {size} bytes refused: {why}",
                            self.id
                        ));
                        Session::respond(Response::AllocBuffer {
                            remote_ptr: 0,
                            remote_size: 0,
                        })
                    }
                }
            }
            Request::GetAlignment { device } => {
                self.check_device("GET_ALIGNMENT", device)?;
                Session::respond(Response::U64(cfg.alignment))
            }
            Request::GetMaxSize { device } => {
                self.check_device("GET_MAX_SIZE", device)?;
                Session::respond(Response::U64(cfg.max_buffer_size))
            }
            Request::BufferGetBase { remote_ptr } => match reg.get(remote_ptr) {
                Some(b) => Session::respond(Response::U64(b.base)),
                None => Err(RpcError::refused("BUFFER_GET_BASE", "unknown handle")),
            },
            Request::FreeBuffer { remote_ptr } => {
                reg.free(self.id, remote_ptr)?;
                self.shared.backend.buffers_freed();
                #[cfg(feature = "engine")]
                if let Some(e) = self.engine.as_ref() {
                    e.link().release(remote_ptr);
                }
                Ok(None)
            }
            Request::BufferClear { remote_ptr, value } => {
                let b = reg
                    .get(remote_ptr)
                    .ok_or_else(|| RpcError::refused("BUFFER_CLEAR", "unknown handle"))?;
                reg.fill("BUFFER_CLEAR", remote_ptr, 0, b.size, value)?;
                Ok(None)
            }
            req @ Request::SetTensor { .. } => {
                // Only reached by a caller of `dispatch` with a decoded
                // request: the one SET_TENSOR implementation takes bytes.
                let payload = req.encode_payload();
                self.set_tensor(&mut payload.as_slice(), payload.len(), self.wait_until())?;
                Ok(None)
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                let c = self.tensor("SET_TENSOR_HASH", &tensor)?;
                let room = c.nbytes.saturating_sub(offset);
                let Some(cache) = self.shared.cache.as_ref() else {
                    return Session::respond(Response::Status(0));
                };
                let Some(len) = cache.entry_len(hash).filter(|&l| l <= room) else {
                    return Session::respond(Response::Status(0));
                };
                // The entry is read whole into memory: that memory comes
                // from the in-flight budget like any payload. Without room
                // the client is told "not cached" and uploads it (streamed).
                let _held = match self.reserve("SET_TENSOR_HASH", len, self.wait_until()) {
                    Ok(h) => h,
                    Err(e) => {
                        self.shared.log(&format!("session {}: {e}", self.id));
                        return Session::respond(Response::Status(0));
                    }
                };
                let Some(data) = cache.get(hash, len) else {
                    return Session::respond(Response::Status(0));
                };
                let (region, at) = c.range("SET_TENSOR_HASH", offset, data.len() as u64)?;
                reg.write("SET_TENSOR_HASH", region.handle, at, &data)?;
                Session::respond(Response::Status(1))
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                // Sockets stream the answer (`Session::run`); a whole-frame
                // caller gets it collected, through the same code.
                let mut data = Vec::new();
                let len = usize::try_from(size)
                    .map_err(|_| RpcError::refused("GET_TENSOR", "size too large"))?;
                self.tensor("GET_TENSOR", &tensor)?
                    .range("GET_TENSOR", offset, size)?;
                data.try_reserve_exact(len).map_err(|_| {
                    RpcError::refused("GET_TENSOR", format!("cannot allocate {size} bytes"))
                })?;
                self.get_tensor(&tensor, offset, size, &mut data, false, self.wait_until())?;
                Session::respond(Response::Data(data))
            }
            Request::CopyTensor { src, dst } => {
                let s = self.tensor("COPY_TENSOR", &src)?;
                let d = self.tensor("COPY_TENSOR", &dst)?;
                let (sr, sat) = s.range("COPY_TENSOR", 0, s.nbytes)?;
                let Ok((dr, dat)) = d.range("COPY_TENSOR", 0, s.nbytes) else {
                    self.shared.log(&format!(
                        "session {}: COPY_TENSOR of {} bytes does not fit its destination",
                        self.id, s.nbytes
                    ));
                    return Session::respond(Response::Status(0));
                };
                // Staged a piece at a time: a copy of any size holds at
                // most one piece of in-flight budget.
                let chunk = self.stage_chunk(s.nbytes);
                let _held = self.reserve("COPY_TENSOR", chunk, self.wait_until())?;
                let mut done = 0;
                while done < s.nbytes {
                    let n = (s.nbytes - done).min(chunk);
                    let data = reg.read_range("COPY_TENSOR", sr.handle, sat + done, n)?;
                    reg.write("COPY_TENSOR", dr.handle, dat + done, &data)?;
                    done += n;
                }
                Session::respond(Response::Status(1))
            }
            Request::GraphCompute(g) => {
                // llama.cpp's client sends the same graph again whenever it
                // rebuilt it (each decode step it does not reuse): run the
                // graph the session keeps, as GRAPH_RECOMPUTE does, so the
                // backend reuses what it built for it (its ggml graph, the
                // worker's checked copy) instead of validating, sending and
                // building it again (`tests/graph_overhead.rs`, 300-node
                // graph sent again, isolated: +717 us over upstream before).
                if let Some(stored) = self.stored_if_same(&g) {
                    self.rerun_stored("GRAPH_COMPUTE", stored)?;
                    return Ok(None);
                }
                let removals = reg.removals();
                let graph = validate_graph(*g, cfg.devices, reg.as_ref(), &cfg.graph_limits)?;
                let work = graph_work(&graph);
                check_work("GRAPH_COMPUTE", work, cfg.max_graph_work)?;
                let stored = StoredGraph {
                    graph: Arc::new(graph),
                    key: next_graph_key(),
                    removals,
                    work,
                };
                // Kept for GRAPH_RECOMPUTE: counted before it runs.
                let held = self.hold_graph(&stored.graph)?;
                self.run_graph(&stored)?;
                self.last_graph_held.insert(stored.graph.device, held);
                self.last_graph.insert(stored.graph.device, stored);
                Ok(None)
            }
            Request::GraphRecompute { device } => {
                self.check_device("GRAPH_RECOMPUTE", device)?;
                let stored =
                    self.last_graph.get(&device).cloned().ok_or_else(|| {
                        RpcError::refused("GRAPH_RECOMPUTE", "no graph to recompute")
                    })?;
                self.rerun_stored("GRAPH_RECOMPUTE", stored)?;
                Ok(None)
            }
            Request::GetDeviceMemory { device } => {
                self.check_device("GET_DEVICE_MEMORY", device)?;
                let total = reg.quota();
                Session::respond(Response::DeviceMemory {
                    free: total.saturating_sub(reg.used()),
                    total,
                })
            }
            Request::InitTensor { tensor } => {
                let c = self.tensor("INIT_TENSOR", &tensor)?;
                if c.placement.is_none() {
                    return Err(RpcError::refused("INIT_TENSOR", "tensor has no buffer"));
                }
                Ok(None)
            }
            Request::GetAllocSize {
                device,
                tensor,
                srcs,
            } => {
                self.check_device("GET_ALLOC_SIZE", device)?;
                let (_, n) = check_shape("GET_ALLOC_SIZE", &tensor)?;
                for s in srcs.iter().filter(|s| s.id != 0) {
                    check_shape("GET_ALLOC_SIZE", s)?;
                }
                Session::respond(Response::U64(n))
            }
            Request::DeviceCount => Session::respond(Response::DeviceCount(cfg.devices)),
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                let c = self.tensor("MEMSET_TENSOR", &tensor)?;
                let (region, at) = c.range("MEMSET_TENSOR", offset, size)?;
                reg.fill("MEMSET_TENSOR", region.handle, at, size, value)?;
                Ok(None)
            }
            Request::ExtQuery => {
                Session::respond(Response::Ext(ExtInfo::ours_with_engine(self.has_engine())))
            }
            Request::EngineInfo
            | Request::EngineOpenInbound { .. }
            | Request::EngineOpenOutbound { .. }
            | Request::EngineWrite { .. }
            | Request::EngineWait { .. }
            | Request::EngineClose { .. } => self.dispatch_engine(req),
            Request::PeerBarrier => Session::respond(Response::Status(1)),
            Request::CopyTensorTo {
                src,
                dst,
                size,
                mark,
                endpoint,
            } => {
                let call = if mark.is_some() {
                    "COPY_TENSOR_TO_MARK"
                } else {
                    "COPY_TENSOR_TO"
                };
                self.copy_tensor_to(call, &src, &dst, size, &endpoint, mark)
            }
            Request::MarkOpen => {
                let key = self.shared.marks.open(self.id).unwrap_or(0);
                Session::respond(Response::U64(key))
            }
            Request::PeerMark { key, seq } => {
                let ok = self.shared.marks.mark(key, seq);
                Session::respond(Response::Status(u8::from(ok)))
            }
            Request::MarkWait {
                key,
                seq,
                timeout_ms,
            } => {
                let until = Instant::now()
                    + Duration::from_millis(u64::from(timeout_ms)).min(MAX_MARK_WAIT);
                // In slices, so that a server shutting down is not held
                // up by a wait.
                let ok = loop {
                    let slice = until.min(Instant::now() + MARK_WAIT_SLICE);
                    if self.shared.marks.wait(self.id, key, seq, slice) {
                        break true;
                    }
                    if Instant::now() >= until || self.shared.stopping() {
                        break false;
                    }
                };
                if !ok {
                    self.shared.log(&format!(
                        "session {}: MARK_WAIT for mark {seq} answered 0 (no such key, or the copy did not land within {timeout_ms} ms)",
                        self.id
                    ));
                }
                Session::respond(Response::Status(u8::from(ok)))
            }
        }
    }

    /// COPY_TENSOR_TO, and with `mark` COPY_TENSOR_TO_MARK (the peer
    /// connection then ends with PEER_MARK instead of PEER_BARRIER).
    fn copy_tensor_to(
        &mut self,
        call: &'static str,
        src: &RpcTensor,
        dst: &RpcTensor,
        size: u64,
        endpoint: &str,
        mark: Option<(u64, u64)>,
    ) -> Result<Option<Response>> {
        let shared = Arc::clone(&self.shared);
        let (cfg, reg) = (&shared.config, shared.registry.as_ref());
        let s = self.tensor(call, src)?;
        let (region, at) = s.range(call, 0, size)?;
        cfg.limits.check(call, size)?;
        check_shape(call, dst)?;
        if let Err(e) = self.peers.check_allowed(endpoint) {
            self.shared.log(&format!("session {}: {e}", self.id));
            return Session::respond(Response::Status(0));
        }
        let chunk = self.stage_chunk(size);
        let _held = self.reserve(call, chunk, self.wait_until())?;
        // A piece at a time; no lock is held while talking to the peer.
        let read = |off: u64, n: u64| {
            reg.read_range(call, region.handle, at + off, n)
                .map_err(|e| e.to_string())
        };
        match self.peers.copy(endpoint, dst, size, chunk, mark, read) {
            Ok(()) => Session::respond(Response::Status(1)),
            Err(reason) => {
                self.shared.log(&format!(
                    "session {}: {call} {endpoint} answered 0: {reason}",
                    self.id
                ));
                Session::respond(Response::Status(0))
            }
        }
    }

    #[cfg(feature = "engine")]
    fn dispatch_engine(&mut self, req: Request<'_>) -> Result<Option<Response>> {
        let call = req.command().name();
        let shared = Arc::clone(&self.shared);
        match self.engine.as_mut().and_then(|e| e.handle(&shared, req)) {
            Some(resp) => Session::respond(resp),
            None => Err(RpcError::refused(call, "this server has no engine")),
        }
    }

    #[cfg(not(feature = "engine"))]
    fn dispatch_engine(&mut self, req: Request<'_>) -> Result<Option<Response>> {
        Err(RpcError::refused(
            req.command().name(),
            "this server was built without the `engine` feature",
        ))
    }

    /// The graph this session keeps for `g.device` when `g` is that graph
    /// again: the same records in the same order and the same node list.
    /// Validation is a function of those, of the buffers the records name
    /// and of the limits, so `g` would validate to the same graph while its
    /// buffers are still there ([`Session::rerun_stored`] checks that).
    fn stored_if_same(&self, g: &crate::protocol::GraphPayload) -> Option<StoredGraph> {
        let stored = self.last_graph.get(&g.device)?;
        let v = stored.graph.as_ref();
        let same = v.device == g.device
            && v.nodes.len() == g.nodes.len()
            && v.tensors == g.tensors
            && v.nodes
                .iter()
                .zip(&g.nodes)
                .all(|(&i, &id)| v.tensors.get(i).is_some_and(|t| t.id == id));
        same.then(|| stored.clone())
    }

    /// Runs the session's stored graph again (GRAPH_RECOMPUTE, or a
    /// GRAPH_COMPUTE of the same graph).
    fn rerun_stored(&mut self, call: &'static str, mut stored: StoredGraph) -> Result<()> {
        // Buffers may have been freed since: re-check every tensor unless
        // none was (the compute then finds each buffer again under its
        // lock, and fails cleanly if one went meanwhile). A handle names
        // one buffer for its life, so a tensor still resolving lies where
        // it did when the graph was validated.
        let removals = self.shared.registry.removals();
        if removals != stored.removals {
            for t in &stored.graph.tensors {
                self.tensor(call, t)?;
            }
            // Checked against this generation: the next rerun need not.
            stored.removals = removals;
            if let Some(s) = self.last_graph.get_mut(&stored.graph.device) {
                if s.key == stored.key {
                    s.removals = removals;
                }
            }
        }
        self.run_graph(&stored)
    }

    fn run_graph(&self, stored: &StoredGraph) -> Result<()> {
        let graph = stored.graph.as_ref();
        let cfg = &self.shared.config;
        // GRAPH_RECOMPUTE replays a stored graph, which passed
        // `max_graph_work` at its GRAPH_COMPUTE.
        let queue = self
            .shared
            .device_queues
            .get(graph.device as usize)
            .ok_or_else(|| RpcError::refused("GRAPH_COMPUTE", "no such device"))?;
        let _turn = queue.acquire("GRAPH_COMPUTE", cfg.device_wait)?;
        self.shared
            .backend
            .compute_keyed(graph, self.shared.registry.as_ref(), stored.key)
    }
}
