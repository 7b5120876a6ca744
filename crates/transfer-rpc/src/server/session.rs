//! One client connection: read a frame, validate, execute, answer; any
//! error closes this connection only, with a logged reason.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use super::admission::SessionSlot;
use super::budget::Reservation;
use super::peer::{PeerAllow, PeerConfig, PeerPool};
#[cfg(feature = "engine")]
use crate::engine_link::EngineSession;
use crate::error::{Result, RpcError};
use crate::protocol::frame::{REQUEST_HEADER_SIZE, encode_response};
use crate::protocol::request::{
    SET_TENSOR_HEADER_SIZE, decode_set_tensor_header, max_request_payload,
};
use crate::protocol::{Command, Request, Response};

/// Per-connection state.
pub struct Session {
    pub(super) id: u64,
    /// The client's address (admission counts sessions per address).
    pub(super) peer_ip: IpAddr,
    /// The session slot, from the HELLO on (released on drop).
    pub(super) slot: Option<SessionSlot>,
    /// The read timeout the socket has now (set only when it changes).
    read_timeout: Option<Duration>,
    /// Budget held by the response being sent (GET_TENSOR data).
    pub(super) response_budget: Option<Reservation>,
    pub(super) shared: Arc<Shared>,
    pub(super) hello_done: bool,
    pub(super) peers: PeerPool,
    pub(super) last_graph: HashMap<u32, super::compute::StoredGraph>,
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
const STREAM_CHUNK: usize = 4 << 20;

impl Session {
    /// A new session for connection `id`.
    pub fn new(id: u64, peer_ip: IpAddr, shared: Arc<Shared>) -> Session {
        let c = &shared.config;
        let peers = PeerPool::new(PeerConfig {
            allow: c.peer_allow.clone(),
            connect_timeout: c.peer_connect_timeout,
            io_timeout: c.peer_io_timeout,
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
            read_timeout: Some(c.hello_timeout),
            response_budget: None,
            shared,
            hello_done: false,
            peers,
            last_graph: HashMap::new(),
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

    fn set_read_timeout(&mut self, stream: &TcpStream, t: Option<Duration>) -> Result<()> {
        if self.read_timeout != t {
            stream
                .set_read_timeout(t)
                .map_err(|e| RpcError::io("set_read_timeout", e))?;
            self.read_timeout = t;
        }
        Ok(())
    }

    fn read_frame(&mut self, stream: &mut TcpStream) -> Result<Next> {
        let cfg = &self.shared.config;
        // Between frames: the HELLO deadline, then the idle timeout.
        let between = if self.hello_done {
            cfg.idle_timeout
        } else {
            Some(cfg.hello_timeout)
        };
        let frame_timeout = cfg.frame_timeout;
        self.set_read_timeout(stream, between)?;
        let mut head = [0u8; REQUEST_HEADER_SIZE];
        match stream.read_exact(&mut head[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(Next::Closed),
            Err(e) => return Err(RpcError::io("read command", e)),
        }
        // Inside a frame every byte must come within the frame timeout (a
        // pending connection keeps its HELLO deadline).
        if self.hello_done {
            self.set_read_timeout(stream, Some(frame_timeout))?;
        }
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
        stream
            .read_exact(&mut head[1..])
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
        if cmd == Command::SetTensor {
            self.stream_set_tensor(stream, size)?;
            return Ok(Next::Streamed);
        }
        let held = self
            .shared
            .budget
            .reserve(cmd.name(), declared, cfg.frame_timeout)?;
        // Memory follows the bytes that actually arrive (fallibly).
        let payload = crate::io::read_payload(stream, size, cmd.name())?;
        Ok(Next::Frame(cmd, payload, held))
    }

    /// SET_TENSOR without holding its data: the destination is checked from
    /// the header before a data byte is read (a payload that does not fit
    /// its tensor is refused unread), then the data goes to the buffer in
    /// [`STREAM_CHUNK`] pieces (and to the hash cache, when asked).
    fn stream_set_tensor(&mut self, stream: &mut TcpStream, size: usize) -> Result<()> {
        const CALL: &str = "SET_TENSOR";
        let Some(len) = size.checked_sub(SET_TENSOR_HEADER_SIZE) else {
            return Err(RpcError::malformed(CALL, "shorter than its header"));
        };
        let mut head = [0u8; SET_TENSOR_HEADER_SIZE];
        stream
            .read_exact(&mut head)
            .map_err(|e| RpcError::io(CALL, e))?;
        let (tensor, cache_flag, offset) = decode_set_tensor_header(&head)?;
        let c = crate::validate::check_tensor(CALL, &tensor, self.shared.registry.as_ref())?;
        let (region, at) = c.range(CALL, offset, len as u64)?;
        if self.shared.config.verbose {
            self.shared
                .log(&format!("session {}: SET_TENSOR {len} bytes", self.id));
        }
        self.settle_before(Command::SetTensor);
        let chunk = len.min(STREAM_CHUNK);
        let _held =
            self.shared
                .budget
                .reserve(CALL, chunk as u64, self.shared.config.frame_timeout)?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(chunk)
            .map_err(|_| RpcError::refused(CALL, format!("cannot allocate {chunk} bytes")))?;
        buf.resize(chunk, 0);
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
            stream
                .read_exact(piece)
                .map_err(|e| RpcError::io(CALL, e))?;
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
        }
        self.dispatch(req)
    }

    /// Serves the connection until it closes or sends something refused.
    pub fn run(&mut self, stream: &mut TcpStream) -> Result<()> {
        loop {
            let (cmd, payload, _held) = match self.read_frame(stream)? {
                Next::Closed => return Ok(()),
                Next::Streamed => continue,
                Next::Frame(c, p, r) => (c, p, r),
            };
            if let Some(resp) = self.handle_frame(cmd, &payload)? {
                write_response(stream, &resp)?;
            }
            self.response_budget = None;
        }
    }

    /// Frees everything the session owns.
    pub fn close(&mut self) {
        #[cfg(feature = "engine")]
        if let Some(e) = self.engine.as_mut() {
            // Posted writes may still read this session's buffers.
            e.close(&self.shared);
        }
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
        self.peers = PeerPool::new(PeerConfig {
            allow: PeerAllow::default(),
            connect_timeout: self.shared.config.peer_connect_timeout,
            io_timeout: self.shared.config.peer_io_timeout,
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

/// Writes one response frame; data answers go out without another copy.
fn write_response(stream: &mut TcpStream, resp: &Response) -> Result<()> {
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
