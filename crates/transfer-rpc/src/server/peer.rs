//! Connections from this server to other servers for COPY_TENSOR_TO.
//!
//! One pool per session: peer connections are cached per destination and
//! closed when the session that asked ends. Every failure is recoverable
//! (the client falls back to the hub), so the pool answers `false` rather
//! than erroring.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::client::{Client, ClientConfig};
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;
use crate::protocol::hello::{FEATURE_PEER_BARRIER, HelloResponse};

/// Peer connection settings.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Allowed destinations; empty = any.
    pub allow: Vec<String>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Read/write timeout.
    pub io_timeout: Duration,
}

/// Cached peer connections of one session.
#[derive(Debug)]
pub struct PeerPool {
    config: PeerConfig,
    conns: HashMap<String, Client>,
    unsupported: HashSet<String>,
}

impl PeerPool {
    /// An empty pool.
    pub fn new(config: PeerConfig) -> Self {
        PeerPool {
            config,
            conns: HashMap::new(),
            unsupported: HashSet::new(),
        }
    }

    /// Refuses destinations outside the allow list.
    pub fn check_allowed(&self, endpoint: &str) -> Result<()> {
        if self.config.allow.is_empty() || self.config.allow.iter().any(|a| a == endpoint) {
            Ok(())
        } else {
            Err(RpcError::refused(
                "COPY_TENSOR_TO",
                format!("destination {endpoint} is not in the peer allow list"),
            ))
        }
    }

    fn connect(&self, endpoint: &str) -> Result<Client> {
        // The handshake gets the short timeout: an upstream destination
        // serves one connection at a time and would leave it unanswered.
        let cfg = ClientConfig {
            p2p: false,
            stats: false,
            connect_timeout: Some(self.config.connect_timeout),
            io_timeout: Some(self.config.connect_timeout),
            probe_extensions: false,
            ..ClientConfig::default()
        };
        let mut c = Client::connect_plain(endpoint, cfg)?;
        let ext = c.ext_query()?;
        c.set_io_timeout(Some(self.config.io_timeout))?;
        if !ext.has(FEATURE_PEER_BARRIER) {
            return Err(RpcError::ExtensionUnsupported {
                call: "COPY_TENSOR_TO",
            });
        }
        Ok(c)
    }

    /// Writes `data` into `dst` on `endpoint` and waits for PEER_BARRIER.
    /// Returns false (with the reason) on any failure; the connection is
    /// dropped so the next attempt starts fresh.
    pub fn copy(
        &mut self,
        endpoint: &str,
        dst: &RpcTensor,
        data: &[u8],
    ) -> std::result::Result<(), String> {
        if self.unsupported.contains(endpoint) {
            return Err(format!("{endpoint} does not support the extension"));
        }
        if !self.conns.contains_key(endpoint) {
            match self.connect(endpoint) {
                Ok(c) => {
                    self.conns.insert(endpoint.to_owned(), c);
                }
                Err(e) => {
                    if matches!(
                        e,
                        RpcError::ExtensionUnsupported { .. } | RpcError::Version { .. }
                    ) {
                        self.unsupported.insert(endpoint.to_owned());
                    }
                    return Err(e.to_string());
                }
            }
        }
        let Some(conn) = self.conns.get_mut(endpoint) else {
            return Err("peer connection vanished".into());
        };
        let result = conn
            .set_tensor(dst, 0, data)
            .and_then(|()| conn.peer_barrier());
        match result {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.conns.remove(endpoint);
                Err("peer barrier failed".into())
            }
            Err(e) => {
                self.conns.remove(endpoint);
                Err(format!("destination rejected or dropped the write: {e}"))
            }
        }
    }

    /// Number of cached connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no connection is cached.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Version of a cached peer, if connected.
    pub fn peer_version(&self, endpoint: &str) -> Option<HelloResponse> {
        self.conns.get(endpoint).map(Client::server_version)
    }
}
