//! One client connection: read a frame, validate, execute, answer; any
//! error closes this connection only, with a logged reason.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::Shared;
use super::admission::SessionSlot;
use super::budget::Reservation;
use super::peer::{PeerAllow, PeerConfig, PeerPool};
use super::registry::Held;
#[cfg(feature = "engine")]
use crate::engine_link::EngineSession;
use crate::error::{Result, RpcError};
use crate::io::{Deadline, FrameReader};
use crate::protocol::frame::{REQUEST_HEADER_SIZE, encode_response};
use crate::protocol::request::{
    SET_TENSOR_HEADER_SIZE, decode_set_tensor_header, max_request_payload,
};
use crate::protocol::{Command, Request, Response};
use crate::validate::ValidatedGraph;

/// Per-connection state.
pub struct Session {
    pub(super) id: u64,
    /// The client's address (admission counts sessions per address).
    pub(super) peer_ip: IpAddr,
    /// The session slot, from the HELLO on (released on drop).
    pub(super) slot: Option<SessionSlot>,
    /// When the connection was accepted: its HELLO is due `hello_timeout`
    /// after it, however it trickles in.
    started: Instant,
    pub(super) shared: Arc<Shared>,
    pub(super) hello_done: bool,
    pub(super) peers: PeerPool,
    pub(super) last_graph: HashMap<u32, super::compute::StoredGraph>,
    /// What each retained graph of `last_graph` is charged against --mem
    /// (its bytes, released with it).
    pub(super) last_graph_held: HashMap<u32, Held>,
    /// ENGINE_* state, when the server has an engine.
    #[cfg(feature = "engine")]
    pub(super) engine: Option<EngineSession>,
}

enum Next {
    /// A whole payload, with the budget it holds until it is handled.
    Frame(Command, Vec<u8>, Reservation),
    /// A frame handled while it was read (SET_TENSOR streamed to its buffer).
    Streamed,
    Closed,
}

/// SET_TENSOR data is copied to its buffer in pieces of at most this many
/// bytes, so a session holds at most this much of a large upload.
pub(super) const STREAM_CHUNK: usize = 4 << 20;

/// GET_TENSOR answers up to this size go out in one write with their size.
const SMALL_ANSWER: u64 = 64 << 10;

impl Session {
    /// A new session for connection `id`.
    pub fn new(id: u64, peer_ip: IpAddr, shared: Arc<Shared>) -> Session {
        let c = &shared.config;
        let peers = PeerPool::new(PeerConfig {
            allow: c.peer_allow.clone(),
            connect_timeout: c.peer_connect_timeout,
            io_timeout: c.peer_io_timeout,
            max_connections: c.max_peer_connections_per_session,
        });
        #[cfg(feature = "engine")]
        let engine = c
            .engine
            .as_ref()
            .map(|link| EngineSession::new(Arc::clone(link), id));
        Session {
            id,
            peer_ip,
            slot: None,
            started: Instant::now(),
            shared,
            hello_done: false,
            peers,
            last_graph: HashMap::new(),
            last_graph_held: HashMap::new(),
            #[cfg(feature = "engine")]
            engine,
        }
    }

    /// True when this server serves ENGINE_* (has an engine and the extension).
    pub(super) fn has_engine(&self) -> bool {
        #[cfg(feature = "engine")]
        {
            self.shared.config.extensions && self.engine.is_some()
        }
        #[cfg(not(feature = "engine"))]
        {
            false
        }
    }

    /// True once the HELLO gave this connection a session slot.
    pub fn is_admitted(&self) -> bool {
        self.slot.is_some()
    }

    /// The deadline of a frame of `bytes` payload bytes started at `start`
    /// (before the HELLO: the HELLO's deadline, counted from accept).
    fn deadline(&self, start: Instant, bytes: u64) -> Instant {
        let c = &self.shared.config;
        if self.hello_done {
            crate::io::frame_deadline(start, c.frame_timeout, bytes, c.frame_min_rate)
        } else {
            self.started + c.hello_timeout
        }
    }

    fn read_frame(&mut self, rd: &mut FrameReader<'_>) -> Result<Next> {
        let cfg = &self.shared.config;
        let mut head = [0u8; REQUEST_HEADER_SIZE];
        // Between frames: the HELLO deadline, then the idle timeout.
        rd.set(if self.hello_done {
            cfg.idle_timeout.and_then(|d| Instant::now().checked_add(d))
        } else {
            Some(self.deadline(self.started, 0))
        });
        match rd.read_exact(&mut head[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(Next::Closed),
            Err(e) => return Err(RpcError::io("read command", e)),
        }
        // From its first byte a frame has one deadline for all of it,
        // however its bytes are spread out (a pending connection keeps its
        // HELLO deadline).
        let start = Instant::now();
        rd.set(Some(self.deadline(start, 0)));
        let cmd = Command::from_byte(head[0])?;
        if cmd.is_extension() && !self.shared.config.extensions {
            return Err(RpcError::UnknownCommand(head[0]));
        }
        if cmd.is_engine() && !self.has_engine() {
            return Err(RpcError::refused(
                cmd.name(),
                "this server has no engine (start it with --engine PROVIDER, built with feature `engine`)",
            ));
        }
        if !self.hello_done && cmd != Command::Hello {
            return Err(RpcError::refused(cmd.name(), "HELLO must come first"));
        }
        rd.read_exact(&mut head[1..])
            .map_err(|e| RpcError::io("read size", e))?;
        let mut size = [0u8; 8];
        size.copy_from_slice(&head[1..]);
        let declared = u64::from_le_bytes(size);
        let cfg = &self.shared.config;
        let size = cfg.limits.check(cmd.name(), declared)?;
        let most = max_request_payload(
            cmd,
            cfg.max_buffer_size,
            cfg.graph_limits.max_nodes as u64,
            cfg.graph_limits.max_tensors as u64,
        );
        if declared > most {
            return Err(RpcError::refused(
                cmd.name(),
                format!("payload of {declared} bytes, the command carries at most {most}"),
            ));
        }
        let until = self.deadline(start, declared);
        rd.set(Some(until));
        if cmd == Command::SetTensor {
            self.set_tensor(rd, size, until)?;
            return Ok(Next::Streamed);
        }
        let held = self.reserve(cmd.name(), declared, until)?;
        // Memory follows the bytes that actually arrive (fallibly).
        let payload = crate::io::read_payload(rd, size, cmd.name())?;
        Ok(Next::Frame(cmd, payload, held))
    }

    /// Reserves `bytes` of the in-flight budget for this session's address,
    /// waiting for them at most until `until`.
    pub(super) fn reserve(
        &self,
        call: &'static str,
        bytes: u64,
        until: Instant,
    ) -> Result<Reservation> {
        let wait = until.saturating_duration_since(Instant::now());
        self.shared
            .budget
            .reserve_as(call, bytes, wait, Some(self.peer_ip))
    }

    /// GET_TENSOR, the one implementation (sockets stream the answer from
    /// it, [`Session::handle_frame`] collects it): after the checks, the
    /// answer (its size first when `header`) goes to `out` a piece of at
    /// most [`STREAM_CHUNK`] (and the address's share) at a time, so an
    /// answer of any size holds one piece of in-flight budget, waited for
    /// until `until`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn get_tensor(
        &mut self,
        tensor: &crate::protocol::RpcTensor,
        offset: u64,
        size: u64,
        out: &mut impl Write,
        header: bool,
        until: Instant,
    ) -> Result<()> {
        const CALL: &str = "GET_TENSOR";
        let c = crate::validate::check_tensor(CALL, tensor, self.shared.registry.as_ref())?;
        let (region, at) = c.range(CALL, offset, size)?;
        self.shared.config.limits.check(CALL, size)?;
        let chunk = size
            .min(STREAM_CHUNK as u64)
            .min(self.shared.budget.per_address())
            .max(1);
        let _held = self.reserve(CALL, chunk, until)?;
        let io = |e| RpcError::io("write response", e);
        if header && size <= SMALL_ANSWER && size <= chunk {
            // Size and data in one write: one system call and one TCP
            // segment (with TCP_NODELAY the size alone went out as its
            // own segment, and the client woke up for it).
            let mut answer = Vec::with_capacity(8 + size as usize);
            answer.extend_from_slice(&size.to_le_bytes());
            if size > 0 {
                let piece = self
                    .shared
                    .registry
                    .read_range(CALL, region.handle, at, size)?;
                answer.extend_from_slice(&piece);
            }
            return out.write_all(&answer).map_err(io);
        }
        if header {
            out.write_all(&size.to_le_bytes()).map_err(io)?;
        }
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(chunk);
            let piece = self
                .shared
                .registry
                .read_range(CALL, region.handle, at + done, n)?;
            out.write_all(&piece).map_err(io)?;
            done += n;
        }
        Ok(())
    }

    /// Charges the graph `graph` retained for GRAPH_RECOMPUTE on its device
    /// (replacing the one there) against the session's bound and --mem;
    /// refused when it does not fit.
    pub(super) fn hold_graph(&mut self, graph: &ValidatedGraph) -> Result<Held> {
        const CALL: &str = "GRAPH_COMPUTE";
        let bytes = retained_bytes(graph);
        let most = self.shared.config.max_graph_bytes_per_session;
        let others: u64 = self
            .last_graph_held
            .iter()
            .filter(|(d, _)| **d != graph.device)
            .map(|(_, h)| h.bytes())
            .sum();
        if others.saturating_add(bytes) > most {
            return Err(RpcError::refused(
                CALL,
                format!(
                    "the graph takes {bytes} bytes to keep, the session's graphs may take {most} \
                     (--max-graph-mib)"
                ),
            ));
        }
        // The graph it replaces is given back first.
        self.last_graph_held.remove(&graph.device);
        self.shared
            .registry
            .hold(bytes)
            .ok_or_else(|| RpcError::refused(CALL, format!("{bytes} bytes do not fit the quota")))
    }

    /// SET_TENSOR, the one implementation (sockets stream into it, whole
    /// frames from [`Session::handle_frame`] and the fuzzers pass their
    /// payload as `data`): `size` payload bytes, header first. The
    /// destination is checked from the header before a data byte is read (a
    /// payload that does not fit its tensor is refused unread), then the
    /// data goes to the buffer in [`STREAM_CHUNK`] pieces (and to the hash
    /// cache, when asked), holding at most one piece of in-flight budget,
    /// waited for until `until`.
    pub(super) fn set_tensor(
        &mut self,
        data: &mut impl Read,
        size: usize,
        until: Instant,
    ) -> Result<()> {
        const CALL: &str = "SET_TENSOR";
        let Some(len) = size.checked_sub(SET_TENSOR_HEADER_SIZE) else {
            return Err(RpcError::malformed(CALL, "shorter than its header"));
        };
        let mut head = [0u8; SET_TENSOR_HEADER_SIZE];
        data.read_exact(&mut head)
            .map_err(|e| RpcError::io(CALL, e))?;
        let (tensor, cache_flag, offset) = decode_set_tensor_header(&head)?;
        let c = crate::validate::check_tensor(CALL, &tensor, self.shared.registry.as_ref())?;
        let (region, at) = c.range(CALL, offset, len as u64)?;
        if self.shared.config.verbose {
            self.shared
                .log(&format!("session {}: SET_TENSOR {len} bytes", self.id));
        }
        self.settle_before(Command::SetTensor);
        let chunk = len
            .min(STREAM_CHUNK)
            .min(usize::try_from(self.shared.budget.per_address()).unwrap_or(usize::MAX));
        let _held = self.reserve(CALL, chunk as u64, until)?;
        let mut buf = crate::io::zeroed(chunk)
            .ok_or_else(|| RpcError::refused(CALL, format!("cannot allocate {chunk} bytes")))?;
        let mut cache = match (&self.shared.cache, cache_flag != 0) {
            (Some(cache), true) => cache.writer(len as u64),
            _ => None,
        };
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(chunk);
            let piece = buf
                .get_mut(..n)
                .ok_or_else(|| RpcError::refused(CALL, "chunk"))?;
            data.read_exact(piece).map_err(|e| RpcError::io(CALL, e))?;
            self.shared
                .registry
                .write(CALL, region.handle, at + done as u64, piece)?;
            if let Some(w) = cache.as_mut() {
                w.write(piece);
            }
            done += n;
        }
        if let Some(w) = cache {
            if let Err(e) = w.finish() {
                self.shared.log(&format!("session {}: {e}", self.id));
            }
        }
        Ok(())
    }

    /// Handles one whole request frame: decode, check, execute. This is the
    /// whole protocol without a socket (`run` adds reading, the streamed
    /// SET_TENSOR path and writing); an error means the connection would be
    /// closed. Fuzzers and tests drive sessions through it.
    pub fn handle_frame(&mut self, cmd: Command, payload: &[u8]) -> Result<Option<Response>> {
        if cmd == Command::SetTensor && self.hello_done {
            // The path sockets take, fed from the payload.
            let until = Instant::now() + self.shared.config.frame_timeout;
            self.set_tensor(&mut &payload[..], payload.len(), until)?;
            return Ok(None);
        }
        let req = match Request::decode(cmd, payload) {
            Ok(r) => r,
            Err(e) => match engine_refusal(cmd) {
                // A refused ENGINE_* payload was read whole: answer it with
                // its failure status and keep the connection.
                Some(resp) if self.hello_done => {
                    self.shared.log(&format!("session {}: {e}", self.id));
                    return Ok(Some(resp));
                }
                _ => return Err(e),
            },
        };
        if self.shared.config.verbose {
            self.shared
                .log(&format!("session {}: {}", self.id, cmd.name()));
            // The end too, into the timeline only (`TRANSFER_RPC_TRACE`;
            // stderr keeps one line per command, which tests count): with
            // the start, what a command held the session for (a graph's
            // compute, a copy to a peer, a wait).
            let r = self.dispatch(req);
            crate::client::trace::event(format_args!(
                "server session {}: {} done",
                self.id,
                cmd.name()
            ));
            return r;
        }
        self.dispatch(req)
    }

    /// Serves the connection until it closes or sends something refused.
    pub fn run(&mut self, stream: &mut TcpStream) -> Result<()> {
        let stream: &TcpStream = stream;
        let mut rd = FrameReader::new(stream);
        loop {
            let (cmd, payload, _held) = match self.read_frame(&mut rd)? {
                Next::Closed => return Ok(()),
                Next::Streamed => continue,
                Next::Frame(c, p, r) => (c, p, r),
            };
            if cmd == Command::GetTensor && self.hello_done {
                // Streamed from the buffer straight to the socket.
                if let Request::GetTensor {
                    tensor,
                    offset,
                    size,
                } = Request::decode(cmd, &payload)?
                {
                    if self.shared.config.verbose {
                        self.shared
                            .log(&format!("session {}: GET_TENSOR {size} bytes", self.id));
                    }
                    // The answer has one deadline too: a client that takes
                    // it a byte at a time would otherwise hold its piece of
                    // the in-flight budget for ever.
                    let mut io = Deadline::new(stream, self.deadline(Instant::now(), size));
                    let until = io.at();
                    self.get_tensor(&tensor, offset, size, &mut io, true, until)?;
                    continue;
                }
            }
            if let Some(resp) = self.handle_frame(cmd, &payload)? {
                let bytes = match &resp {
                    Response::Data(d) => d.len() as u64,
                    _ => 0,
                };
                let mut io = Deadline::new(stream, self.deadline(Instant::now(), bytes));
                write_response(&mut io, &resp)?;
            }
        }
    }

    /// Frees everything the session owns.
    pub fn close(&mut self) {
        #[cfg(feature = "engine")]
        if let Some(e) = self.engine.as_mut() {
            // Posted writes may still read this session's buffers.
            e.close(&self.shared);
        }
        self.shared.marks.close_session(self.id);
        let freed = self.shared.registry.free_all(self.id);
        if freed > 0 {
            self.shared.backend.buffers_freed();
        }
        #[cfg(feature = "engine")]
        if let Some(e) = self.engine.as_ref() {
            e.link().sweep(&self.shared.registry);
        }
        if freed > 0 && self.shared.config.verbose {
            self.shared
                .log(&format!("session {}: freed {freed} buffers", self.id));
        }
        self.last_graph.clear();
        self.last_graph_held.clear();
        self.peers = PeerPool::new(PeerConfig {
            allow: PeerAllow::default(),
            connect_timeout: self.shared.config.peer_connect_timeout,
            io_timeout: self.shared.config.peer_io_timeout,
            max_connections: 1,
        });
    }

    /// Settles this session's posted engine writes before `cmd` when it
    /// could overwrite or free a buffer they read from.
    pub(super) fn settle_before(&mut self, cmd: Command) {
        #[cfg(feature = "engine")]
        if matches!(
            cmd,
            Command::SetTensor
                | Command::SetTensorHash
                | Command::GraphCompute
                | Command::GraphRecompute
                | Command::BufferClear
                | Command::FreeBuffer
                | Command::MemsetTensor
                | Command::CopyTensor
        ) {
            if let Some(e) = self.engine.as_mut() {
                e.settle(&self.shared);
            }
        }
        #[cfg(not(feature = "engine"))]
        let _ = cmd;
    }

    pub(super) fn respond(r: Response) -> Result<Option<Response>> {
        Ok(Some(r))
    }
}

/// Bytes a validated graph keeps in memory while it is retained for
/// GRAPH_RECOMPUTE: its tensor records with their checked layouts and
/// links, and its node and check lists.
pub fn retained_bytes(g: &ValidatedGraph) -> u64 {
    use std::mem::size_of;
    let per_tensor = size_of::<crate::protocol::RpcTensor>()
        + size_of::<crate::validate::CheckedTensor>()
        + size_of::<[Option<usize>; crate::protocol::tensor::MAX_SRC]>()
        + size_of::<Option<usize>>();
    let lists = g.nodes.len()
        + g.upfront_index_checks.len()
        + g.deferred_index_checks.len()
        + g.deferred_index_positions.len();
    (size_of::<ValidatedGraph>() + per_tensor * g.tensors.len() + size_of::<usize>() * lists) as u64
}

/// Writes one response frame; data answers go out without another copy.
fn write_response(stream: &mut impl Write, resp: &Response) -> Result<()> {
    let io = |e| RpcError::io("write response", e);
    match resp {
        Response::Data(d) => {
            stream
                .write_all(&(d.len() as u64).to_le_bytes())
                .map_err(io)?;
            stream.write_all(d).map_err(io)
        }
        r => stream
            .write_all(&encode_response(&r.encode_payload()))
            .map_err(io),
    }
}

/// The failure answer of an ENGINE_* command whose payload was refused
/// (`None` for every other command: a refused payload closes the connection).
fn engine_refusal(cmd: Command) -> Option<Response> {
    use crate::protocol::engine::{LaneId, OutboundId};
    match cmd {
        Command::EngineOpenInbound => Some(Response::EngineInbound {
            ok: 0,
            lane: LaneId(0),
            descriptor: Vec::new(),
        }),
        Command::EngineOpenOutbound => Some(Response::EngineOutbound {
            ok: 0,
            id: OutboundId(0),
        }),
        Command::EngineWrite | Command::EngineWait | Command::EngineClose => {
            Some(Response::Status(0))
        }
        _ => None,
    }
}
