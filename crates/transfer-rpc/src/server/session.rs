//! One client connection: read a frame, validate, execute, answer; any
//! error closes this connection only, with a logged reason.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use super::Shared;
use super::peer::{PeerConfig, PeerPool};
#[cfg(feature = "engine")]
use crate::engine_link::EngineSession;
use crate::error::{Result, RpcError};
use crate::protocol::frame::{REQUEST_HEADER_SIZE, encode_response};
use crate::protocol::{Command, Request, Response};
use crate::validate::ValidatedGraph;

/// Per-connection state.
pub struct Session {
    pub(super) id: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) hello_done: bool,
    pub(super) peers: PeerPool,
    pub(super) last_graph: HashMap<u32, Arc<ValidatedGraph>>,
    /// ENGINE_* state, when the server has an engine.
    #[cfg(feature = "engine")]
    pub(super) engine: Option<EngineSession>,
}

enum Next {
    Frame(Command, Vec<u8>),
    Closed,
}

impl Session {
    /// A new session for connection `id`.
    pub fn new(id: u64, shared: Arc<Shared>) -> Session {
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

    fn read_frame(&self, stream: &mut TcpStream) -> Result<Next> {
        let mut head = [0u8; REQUEST_HEADER_SIZE];
        match stream.read_exact(&mut head[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(Next::Closed),
            Err(e) => return Err(RpcError::io("read command", e)),
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
        stream
            .read_exact(&mut head[1..])
            .map_err(|e| RpcError::io("read size", e))?;
        let mut size = [0u8; 8];
        size.copy_from_slice(&head[1..]);
        let size = self
            .shared
            .config
            .limits
            .check(cmd.name(), u64::from_le_bytes(size))?;
        // Memory follows the bytes that actually arrive (fallibly).
        let payload = crate::io::read_payload(stream, size, cmd.name())?;
        Ok(Next::Frame(cmd, payload))
    }

    /// Serves the connection until it closes or sends something refused.
    pub fn run(&mut self, stream: &mut TcpStream) -> Result<()> {
        loop {
            let (cmd, payload) = match self.read_frame(stream)? {
                Next::Closed => return Ok(()),
                Next::Frame(c, p) => (c, p),
            };
            let req = match Request::decode(cmd, &payload) {
                Ok(r) => r,
                Err(e) => match engine_refusal(cmd) {
                    // A refused ENGINE_* payload was read whole: answer it
                    // with its failure status and keep the connection.
                    Some(resp) if self.hello_done => {
                        self.shared.log(&format!("session {}: {e}", self.id));
                        stream
                            .write_all(&encode_response(&resp.encode_payload()))
                            .map_err(|e| RpcError::io("write response", e))?;
                        continue;
                    }
                    _ => return Err(e),
                },
            };
            if self.shared.config.verbose {
                self.shared
                    .log(&format!("session {}: {}", self.id, cmd.name()));
            }
            if let Some(resp) = self.dispatch(req)? {
                stream
                    .write_all(&encode_response(&resp.encode_payload()))
                    .map_err(|e| RpcError::io("write response", e))?;
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
        let freed = self.shared.registry.free_all(self.id);
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
            allow: Vec::new(),
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
