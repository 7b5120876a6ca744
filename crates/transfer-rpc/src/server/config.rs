//! Server configuration.

use std::path::PathBuf;
#[cfg(feature = "engine")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "engine")]
use crate::engine_link::EngineLink;

use super::peer::PeerAllow;
use crate::protocol::Limits;
use crate::validate::GraphLimits;

/// Everything a server needs to know at start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on, e.g. `127.0.0.1:50052` (port 0 = ephemeral).
    pub bind: String,
    /// Number of devices advertised (DEVICE_COUNT).
    pub devices: u32,
    /// Total bytes all buffers may take (GET_DEVICE_MEMORY total).
    pub memory_quota: u64,
    /// Largest single buffer (GET_MAX_SIZE).
    pub max_buffer_size: u64,
    /// Most live buffers one session may own (each costs a memfd, two
    /// mappings and at least a page, whatever its size).
    pub max_buffers_per_session: usize,
    /// Most live buffers of all sessions together; [`super::Server::bind`]
    /// lowers it to what the process's descriptor limit can hold.
    pub max_buffers: usize,
    /// Most bytes the graphs a session keeps for GRAPH_RECOMPUTE (its last
    /// graph per device) may take; they are charged against
    /// `memory_quota` too.
    pub max_graph_bytes_per_session: u64,
    /// Alignment reported by GET_ALIGNMENT.
    pub alignment: u64,
    /// Most concurrent sessions (connections past HELLO). A HELLO that finds
    /// them all taken waits up to `hello_timeout` for one, then is refused.
    pub max_connections: usize,
    /// Most sessions from one client address.
    pub max_connections_per_address: usize,
    /// Most connections waiting for their HELLO; beyond it the oldest
    /// waiting connection is closed to make room.
    pub max_pending: usize,
    /// Most connections from one address waiting for their HELLO; beyond it
    /// that address's oldest waiting connection is closed.
    pub max_pending_per_address: usize,
    /// Time a new connection has to send its HELLO.
    pub hello_timeout: Duration,
    /// Deadline of a frame, from its first byte to its last (requests) and
    /// from the first byte sent to the last taken by the client (answers),
    /// plus the frame's size at `frame_min_rate`. One deadline for the
    /// whole frame, not per read: a trickle cannot stretch it.
    pub frame_timeout: Duration,
    /// Bytes per second a frame is given on top of `frame_timeout` (0 =
    /// none): large uploads on slow links still fit.
    pub frame_min_rate: u64,
    /// Compute threads a backend may use.
    pub threads: usize,
    /// SET_TENSOR_HASH cache directory.
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache keeps on disk (least recently used evicted).
    pub cache_max_bytes: u64,
    /// Message size limits.
    pub limits: Limits,
    /// Graph size limits.
    pub graph_limits: GraphLimits,
    /// Most work one graph may ask for, in estimated element operations
    /// ([`super::fair::graph_work`]); larger graphs are refused.
    pub max_graph_work: u64,
    /// Longest a graph waits for its turn on a device (other sessions'
    /// graphs ahead of it) before it is refused.
    pub device_wait: Duration,
    /// Serve the extension (EXT_QUERY, COPY_TENSOR_TO, PEER_BARRIER). When
    /// false the server behaves like upstream: those bytes close the
    /// connection.
    pub extensions: bool,
    /// Destinations COPY_TENSOR_TO may connect to; empty (the default) =
    /// none. See [`PeerAllow::parse`] for the forms.
    pub peer_allow: PeerAllow,
    /// Timeout for connecting to a peer.
    pub peer_connect_timeout: Duration,
    /// Read/write timeout on peer connections.
    pub peer_io_timeout: Duration,
    /// Most peer connections (COPY_TENSOR_TO destinations) one session
    /// keeps open; one more closes the least recently used.
    pub max_peer_connections_per_session: usize,
    /// Idle timeout of sessions between frames (`None` = wait forever, like
    /// upstream: llama.cpp holds one connection for a model's lifetime, and
    /// closing it frees the model's buffers).
    pub idle_timeout: Option<Duration>,
    /// Bytes of request payloads that all sessions together may hold in
    /// memory at once (outside the buffer quota). A request that needs more
    /// than is free waits up to `frame_timeout`; one larger than the whole
    /// budget is refused.
    pub inflight_budget: u64,
    /// The part of `inflight_budget` the sessions of one client address may
    /// hold together (so that one address's slow or stalled frames cannot
    /// take all of it).
    pub inflight_per_address: u64,
    /// Log every command, not only refusals.
    pub verbose: bool,
    /// The server's TransferEngine: serves ENGINE_* and advertises the
    /// engine feature bit (only with `extensions`). `None`: ENGINE_* close
    /// the connection like an unknown command.
    #[cfg(feature = "engine")]
    pub engine: Option<Arc<EngineLink>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let quota = 4u64 << 30;
        ServerConfig {
            bind: "127.0.0.1:50052".into(),
            devices: 1,
            memory_quota: quota,
            max_buffer_size: quota,
            max_buffers_per_session: 256,
            max_buffers: 16384,
            max_graph_bytes_per_session: 64 << 20,
            alignment: 64,
            max_connections: 64,
            max_connections_per_address: 32,
            max_pending: 256,
            max_pending_per_address: 64,
            hello_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(60),
            frame_min_rate: 8 << 20,
            threads: 1,
            cache_dir: None,
            cache_max_bytes: 16 << 30,
            limits: Limits::default(),
            graph_limits: GraphLimits::default(),
            max_graph_work: super::fair::DEFAULT_MAX_GRAPH_WORK,
            device_wait: Duration::from_secs(600),
            extensions: true,
            peer_allow: PeerAllow::default(),
            peer_connect_timeout: Duration::from_secs(5),
            peer_io_timeout: Duration::from_secs(30),
            max_peer_connections_per_session: 8,
            idle_timeout: None,
            inflight_budget: 1 << 30,
            inflight_per_address: 512 << 20,
            verbose: false,
            #[cfg(feature = "engine")]
            engine: None,
        }
    }
}
