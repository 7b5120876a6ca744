//! Server configuration.

use std::path::PathBuf;
#[cfg(feature = "engine")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "engine")]
use crate::engine_link::EngineLink;

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
    /// Alignment reported by GET_ALIGNMENT.
    pub alignment: u64,
    /// Most concurrent connections; further ones wait in the accept queue.
    pub max_connections: usize,
    /// Compute threads a backend may use.
    pub threads: usize,
    /// SET_TENSOR_HASH cache directory.
    pub cache_dir: Option<PathBuf>,
    /// Message size limits.
    pub limits: Limits,
    /// Graph size limits.
    pub graph_limits: GraphLimits,
    /// Serve the extension (EXT_QUERY, COPY_TENSOR_TO, PEER_BARRIER). When
    /// false the server behaves like upstream: those bytes close the
    /// connection.
    pub extensions: bool,
    /// Destinations COPY_TENSOR_TO may connect to (`host:port` as the client
    /// sends them); empty = any.
    pub peer_allow: Vec<String>,
    /// Timeout for connecting to a peer.
    pub peer_connect_timeout: Duration,
    /// Read/write timeout on peer connections.
    pub peer_io_timeout: Duration,
    /// Idle timeout of client connections (`None` = wait forever, like upstream).
    pub idle_timeout: Option<Duration>,
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
            alignment: 64,
            max_connections: 64,
            threads: 1,
            cache_dir: None,
            limits: Limits::default(),
            graph_limits: GraphLimits::default(),
            extensions: true,
            peer_allow: Vec::new(),
            peer_connect_timeout: Duration::from_secs(5),
            peer_io_timeout: Duration::from_secs(60),
            idle_timeout: None,
            verbose: false,
            #[cfg(feature = "engine")]
            engine: None,
        }
    }
}
