//! The backend contract.
//!
//! A [`Domain`] is one NIC opened by one backend. It is owned by exactly one
//! worker thread (inside a [`crate::DomainGroup`]), so it needs no locks and
//! no `Sync`. Submits return nothing: every outcome, failures included,
//! comes back from [`Domain::poll`] as a [`DomainEvent`], never as a panic.

use crate::addr::{BackendKind, NicAddress, Ordering};
use crate::error::Result;
use crate::memory::{MemorySpan, RemoteKey, RemoteNicRegion};

/// A region registered with one domain (the domain's own handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DomainMr(pub u64);

/// A peer NIC resolved by one domain (e.g. a libfabric `fi_addr_t`, a verbs
/// connection slot). Valid only for the domain that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(pub u64);

/// Names one submit call; the domain reports exactly one
/// [`DomainEvent::Completed`] for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpToken(pub u64);

/// Names one posted receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvToken(pub u64);

/// What a backend tells about the NIC it opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    /// NIC / domain name (e.g. `rdmap16s27`, `lo`).
    pub name: String,
    /// Provider or driver name (e.g. `efa`, `tcp;ofi_rxm`, `mlx5`).
    pub provider: String,
    /// Link speed in bits per second (0 when unknown).
    pub link_speed_bps: u64,
    /// NUMA node of the NIC, when the topology is known.
    pub numa_node: Option<u32>,
    /// Whether writes between two NICs land in posting order.
    pub ordering: Ordering,
    /// Largest single write the domain accepts, in bytes.
    pub max_write_size: u64,
}

/// The result of registering a span with one domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The domain's handle for local use.
    pub mr: DomainMr,
    /// What a peer needs to write into the span through this NIC.
    pub remote: RemoteNicRegion,
}

/// One RDMA write (optionally with a 32-bit immediate) as a domain posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOp {
    /// Registration of the local source bytes.
    pub local_mr: DomainMr,
    /// First local byte (inside `local_mr`).
    pub local: *const u8,
    /// Number of bytes (may be 0 for an immediate-only write).
    pub len: usize,
    /// Destination peer (resolved by this domain).
    pub peer: PeerId,
    /// Remote address: the descriptor's `base` plus the offset.
    pub remote_addr: u64,
    /// Remote key from the descriptor.
    pub remote_key: RemoteKey,
    /// Immediate delivered to the receiver once the write has landed.
    pub imm: Option<u32>,
}

// SAFETY: a WriteOp only describes memory (registered, kept alive by the
// engine until the op completes); it is moved between threads, never used to
// form references.
unsafe impl Send for WriteOp {}

/// Something a domain reports from [`Domain::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainEvent {
    /// Every operation of one submit call finished; the error, if any, is the first one seen.
    Completed {
        /// The submit call.
        op: OpToken,
        /// Its outcome.
        result: Result<()>,
    },
    /// A peer's write carrying this immediate has landed in local memory.
    Imm {
        /// The 32-bit immediate.
        imm: u32,
    },
    /// A message arrived in a posted receive buffer.
    Received {
        /// The buffer.
        token: RecvToken,
        /// Message length in bytes.
        len: usize,
    },
}

/// One NIC opened by a backend: the contract every backend implements.
///
/// Owned by one worker thread; `Send` but not required to be `Sync`.
pub trait Domain: Send + 'static {
    /// Which backend this is (tags addresses and descriptors).
    fn backend(&self) -> BackendKind;

    /// Static facts about the NIC.
    fn info(&self) -> DomainInfo;

    /// This NIC's address, as peers must resolve it.
    fn address(&self) -> NicAddress;

    /// Registers `span` for local use and remote writes.
    fn register(&mut self, span: MemorySpan) -> Result<Registration>;

    /// Releases a registration. The engine guarantees nothing in flight uses it.
    fn unregister(&mut self, mr: DomainMr) -> Result<()>;

    /// Resolves a peer NIC's address (e.g. inserts it into the address vector,
    /// or starts a connection handshake). Malformed addresses are errors.
    fn resolve_peer(&mut self, addr: &NicAddress) -> Result<PeerId>;

    /// Forgets a peer: releases its connection state so that a restarted peer
    /// at the same address can be resolved afresh.
    fn remove_peer(&mut self, peer: PeerId);

    /// Posts a receive buffer of `len` bytes at `buf` (inside `mr`).
    fn post_recv(&mut self, token: RecvToken, mr: DomainMr, buf: *mut u8, len: usize)
    -> Result<()>;

    /// Sends a message; the domain owns `data` until the send completed.
    fn submit_send(&mut self, op: OpToken, peer: PeerId, data: Vec<u8>);

    /// Posts a batch of writes (to one or several peers). Exactly one
    /// [`DomainEvent::Completed`] follows, once every write has finished.
    fn submit_writes(&mut self, op: OpToken, writes: &[WriteOp]);

    /// Makes progress and appends what happened to `events`.
    fn poll(&mut self, events: &mut Vec<DomainEvent>);

    /// Whether submitted operations are still outstanding.
    fn has_pending(&self) -> bool;

    /// A file descriptor that becomes readable when this domain has
    /// something to report or progress to make (libfabric `FI_WAIT_FD`, a
    /// verbs completion channel). With one on every NIC, an idle worker
    /// blocks on them instead of parking on a timer, so arrivals wake it at
    /// once and an idle engine costs nothing. `None`: timed parking.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// Called right before the worker blocks on [`Domain::wait_fd`]: arms
    /// the notification and returns false when the domain already has work
    /// and must be polled instead (libfabric `fi_trywait`, verbs
    /// `ibv_req_notify_cq` followed by a final poll).
    fn prepare_wait(&mut self) -> bool {
        true
    }

    /// Whether [`Domain::wait_fd`] also fires for the progress of work in
    /// flight (a socket that became writable, an acknowledgement that
    /// arrived), so that a worker may block on it with operations
    /// outstanding instead of spinning until they finish. False (the
    /// default): the provider moves bytes only when polled.
    fn wait_covers_in_flight(&self) -> bool {
        false
    }
}
