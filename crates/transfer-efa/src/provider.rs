//! Which libfabric provider to open.

use std::fmt;

/// Environment variable that selects the provider (`efa`, `tcp`, `shm`,
/// `udp`, `sockets`, or a raw libfabric provider string such as `verbs;ofi_rxm`).
pub const PROVIDER_ENV: &str = "TRANSFER_PROVIDER";

/// A libfabric provider choice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Provider {
    /// AWS Elastic Fabric Adapter (SRD; the production target).
    Efa,
    /// `tcp;ofi_rxm`: reliable datagrams over TCP sockets.
    Tcp,
    /// `shm`: shared memory, same host only.
    Shm,
    /// `udp;ofi_rxd`: reliable datagrams over UDP.
    Udp,
    /// `sockets`: the legacy sockets provider.
    Sockets,
    /// Any other provider, by its libfabric name (e.g. `verbs;ofi_rxm`).
    Raw(String),
}

impl Provider {
    /// Parses a provider name as accepted by [`PROVIDER_ENV`]. Unknown names
    /// are passed to libfabric unchanged as [`Provider::Raw`].
    pub fn parse(name: &str) -> Self {
        match name.trim().to_ascii_lowercase().as_str() {
            "efa" => Self::Efa,
            "tcp" | "tcp;ofi_rxm" => Self::Tcp,
            "shm" => Self::Shm,
            "udp" | "udp;ofi_rxd" => Self::Udp,
            "sockets" => Self::Sockets,
            _ => Self::Raw(name.trim().to_owned()),
        }
    }

    /// The provider named by [`PROVIDER_ENV`], if set and non-empty.
    pub fn from_env() -> Option<Self> {
        std::env::var(PROVIDER_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(|s| Self::parse(&s))
    }

    /// The `fabric_attr->prov_name` hint handed to `fi_getinfo`.
    pub fn libfabric_name(&self) -> &str {
        match self {
            Self::Efa => "efa",
            Self::Tcp => "tcp;ofi_rxm",
            Self::Shm => "shm",
            Self::Udp => "udp;ofi_rxd",
            Self::Sockets => "sockets",
            Self::Raw(s) => s,
        }
    }

    /// Whether endpoints of this provider use IP addresses, so that a
    /// source node (e.g. `127.0.0.1`) restricts them to one interface.
    pub fn is_ip_based(&self) -> bool {
        matches!(self, Self::Tcp | Self::Udp | Self::Sockets)
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.libfabric_name())
    }
}
