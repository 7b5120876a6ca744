//! How a server opens its engine.

use std::time::Duration;

/// Provider and limits of a server's engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLinkConfig {
    /// libfabric provider (`tcp`, `shm`, `efa`, or a raw libfabric name).
    pub provider: String,
    /// Source address the endpoints bind to (IP-based providers), e.g. the
    /// address of the interface other servers reach this one by; needed
    /// when servers live in different network namespaces.
    pub node: Option<String>,
    /// Only open the libfabric domain with this name (tcp: the interface,
    /// e.g. `eth0`; efa: the device, e.g. `rdmap16s27`).
    pub domain: Option<String>,
    /// NICs (domains) to use; 0 = every one the provider offers. Default 1:
    /// on tcp every interface is a domain, and NIC i pairs with the peer's
    /// NIC i, which only works when both hosts list the same interfaces.
    pub nics: usize,
    /// How long a write may stay incomplete before it fails and its peer is
    /// marked dead.
    pub peer_timeout: Duration,
    /// Longest ENGINE_WAIT a client may ask for (its timeout is capped).
    pub max_wait: Duration,
    /// Longest a session waits for its posted writes before a command that
    /// could overwrite or free their sources (then it logs and goes on; the
    /// memory itself stays safe, see the module docs).
    pub settle_timeout: Duration,
    /// Most inbound lanes one session may hold.
    pub max_lanes_per_session: usize,
    /// Most outbound targets one session may hold.
    pub max_outbound_per_session: usize,
    /// Most posted writes a session keeps in flight; one more first waits
    /// for the oldest.
    pub max_pending_writes: usize,
    /// Most distinct immediates that arrived on one session's lanes before
    /// its ENGINE_WAIT asked for them (each lane has at most 64 writes in
    /// flight). Beyond it that session's own arrivals are dropped; other
    /// sessions keep theirs (the engine's cap is per session, not shared).
    pub max_unexpected_imms_per_session: usize,
}

impl EngineLinkConfig {
    /// Defaults for `provider`.
    pub fn new(provider: impl Into<String>) -> Self {
        EngineLinkConfig {
            provider: provider.into(),
            node: None,
            domain: None,
            nics: 1,
            peer_timeout: transfer_efa::DEFAULT_PEER_TIMEOUT,
            max_wait: Duration::from_secs(60),
            settle_timeout: Duration::from_secs(30),
            max_lanes_per_session: 1024,
            max_outbound_per_session: 1024,
            max_pending_writes: 1024,
            max_unexpected_imms_per_session: 4096,
        }
    }

    /// Loopback defaults for tests: `provider` bound to 127.0.0.1.
    pub fn loopback(provider: impl Into<String>) -> Self {
        let mut c = EngineLinkConfig::new(provider);
        c.node = Some("127.0.0.1".into());
        c
    }
}
