//! Options for opening libfabric domains.

use std::time::Duration;

use crate::provider::Provider;

/// Writes posted per [`transfer_core::Domain::poll`] pass from the queue.
///
/// 32, as fabric-lib posts on EFA (see docs/anchors.md): enough to keep a
/// NIC's send queue full between two passes, small enough that one pass
/// does not starve completion processing. Measured here on loopback (2
/// shared cores, debug build, `tests/raw.rs::measure_post_batch`: 4 submits
/// of 512 x 64 KiB writes): batch 1/8/32/128 gave 0.88/0.82/0.59/0.94 GB/s
/// on tcp and 2.10/2.52/1.76/2.19 GB/s on shm, i.e. no trend above the
/// noise: the software provider is the bottleneck, so the EFA value stays
/// until it is measured on EFA hardware.
pub const DEFAULT_POST_BATCH: usize = 32;

/// How long an operation may stay incomplete before it fails and its peer
/// is marked dead.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// How [`crate::open_domains`] opens NICs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibfabricConfig {
    /// Provider to open; `None` means [`Provider::from_env`], else EFA when
    /// present, else `tcp` (see [`crate::default_provider`]).
    pub provider: Option<Provider>,
    /// Source node (address or host name) to bind endpoints to, e.g.
    /// `127.0.0.1` for loopback tests. Ignored by non-IP providers.
    pub node: Option<String>,
    /// Source service (port) to bind to; `None` picks an ephemeral one.
    pub service: Option<String>,
    /// Only open the domain (NIC) with this name (e.g. `lo`, `rdmap16s27`).
    pub domain_name: Option<String>,
    /// Ask for device-memory (FI_HMEM) support.
    pub hmem: bool,
    /// Queued writes posted per poll pass.
    pub post_batch: usize,
    /// Bound on the lifetime of a pending operation.
    pub peer_timeout: Duration,
    /// Completion queue depth.
    pub cq_size: usize,
    /// Number of registered bounce slots for sends (FI_MR_LOCAL providers).
    pub send_slots: usize,
    /// Size of one send bounce slot in bytes; larger messages are
    /// registered on the fly.
    pub send_slot_size: usize,
    /// Ask for FI_DELIVERY_COMPLETE on writes that carry data: a write
    /// completes only once its bytes are placed in the target's memory, and
    /// target-side failures (wrong key, range outside the region) come back
    /// to the writer as error completions. Without it, tcp completes a write
    /// once it left the sender, so a wrong key goes unnoticed and
    /// `Completed` does not mean the data is visible at the peer.
    ///
    /// `None` (default): on. Zero-byte writes never ask for it (1.17 shm
    /// never completes a zero-byte delivery-complete write; an immediate
    /// needs no placement guarantee). Measured on 1.17: shm and
    /// udp;ofi_rxd never complete a write the target refused, with or
    /// without it, so there only the peer timeout reports the refusal (on
    /// shm the domain then replaces its wedged transmit endpoint, see
    /// `domain/connection.rs`).
    pub delivery_complete: Option<bool>,
    /// Open the CQ with an FI_WAIT_FD wait object, so that an idle worker
    /// blocks on it ([`transfer_core::Domain::wait_fd`]) instead of
    /// parking on a timer; falls back to no wait object where the provider
    /// has none. On shm (whose CQ has none) the wait object is this crate's
    /// same-host doorbell (`doorbell.rs`): `false` leaves it out, and idle
    /// workers park on timers as before it existed.
    pub wait_fd: bool,
}

impl Default for LibfabricConfig {
    fn default() -> Self {
        Self {
            provider: None,
            node: None,
            service: None,
            domain_name: None,
            hmem: false,
            post_batch: DEFAULT_POST_BATCH,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            cq_size: 4096,
            send_slots: 64,
            send_slot_size: 64 * 1024,
            delivery_complete: None,
            wait_fd: true,
        }
    }
}

impl LibfabricConfig {
    /// A config for `provider` with defaults elsewhere.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider: Some(provider),
            ..Self::default()
        }
    }

    /// A config for `provider` bound to loopback (`127.0.0.1` for IP-based
    /// providers), for tests and single-host benchmarks.
    pub fn loopback(provider: Provider) -> Self {
        let node = provider.is_ip_based().then(|| "127.0.0.1".to_owned());
        Self {
            provider: Some(provider),
            node,
            ..Self::default()
        }
    }

    /// Sets the provider.
    pub fn with_provider(mut self, provider: Provider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Sets the source node.
    pub fn with_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    /// Sets the source service (port).
    pub fn with_service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Sets the peer timeout.
    pub fn with_peer_timeout(mut self, timeout: Duration) -> Self {
        self.peer_timeout = timeout;
        self
    }

    /// Sets the number of queued writes posted per poll pass (at least 1).
    pub fn with_post_batch(mut self, batch: usize) -> Self {
        self.post_batch = batch.max(1);
        self
    }

    /// Asks for FI_HMEM.
    pub fn with_hmem(mut self, hmem: bool) -> Self {
        self.hmem = hmem;
        self
    }
}
