//! One client connection: read a frame, validate, execute, answer; any
//! error closes this connection only, with a logged reason.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use super::Shared;
use super::peer::{PeerConfig, PeerPool};
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
        Session {
            id,
            shared,
            hello_done: false,
            peers,
            last_graph: HashMap::new(),
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
            let req = Request::decode(cmd, &payload)?;
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
        let freed = self.shared.registry.free_all(self.id);
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

    pub(super) fn respond(r: Response) -> Result<Option<Response>> {
        Ok(Some(r))
    }
}
