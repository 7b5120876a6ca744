//! Per-peer connection state: two RC QPs (messages, writes), their queues
//! of work requests, and the handshake bookkeeping.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use transfer_core::{OpToken, TransferError};

use crate::handshake::WireAddress;
use crate::rdma_op::Work;
use crate::resources::Qp;

/// Channel index of the message QP (sends, on the message SRQ).
pub(crate) const MSG: usize = 0;
/// Channel index of the write QP (writes with immediate, on the RMA SRQ).
pub(crate) const RMA: usize = 1;

/// One signalled WR in flight and the unsignalled ones it covers.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) seq: u64,
    pub(crate) wrs: usize,
    /// The op whose share on this QP this WR completes.
    pub(crate) done: Option<OpToken>,
    /// The send buffer to release.
    pub(crate) release: Option<u64>,
}

/// One RC QP and its queues.
pub(crate) struct Channel {
    pub(crate) qp: Qp,
    pub(crate) psn: u32,
    pub(crate) pending: VecDeque<Work>,
    pub(crate) outstanding: VecDeque<Entry>,
    /// Posted WRs not yet covered by a reaped signalled completion.
    pub(crate) sq_used: usize,
    /// Posted unsignalled WRs since the last signalled one.
    pub(crate) run: usize,
    /// Completions with a smaller `wr_id` belong to an older QP.
    pub(crate) first_seq: u64,
    /// An op with some WRs posted and its last one still pending.
    pub(crate) partial: Option<OpToken>,
}

/// Where a peer's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// No QPs (the peer said goodbye); the next operation reconnects.
    Idle,
    /// QPs created; waiting for the remote side to confirm.
    Connecting,
    /// Both sides connected: work is posted.
    Ready,
    /// Unreachable: operations fail fast with this error until the peer
    /// says hello with a newer connection or is removed.
    Dead(TransferError),
}

/// One remote domain.
pub(crate) struct Peer {
    pub(crate) addr: WireAddress,
    pub(crate) state: State,
    /// `[MSG, RMA]`; `None` when Idle or Dead.
    pub(crate) chans: Option<[Channel; 2]>,
    /// Our connection number.
    pub(crate) conn: u64,
    /// The remote connection our QPs are connected to.
    pub(crate) remote_conn: Option<u64>,
    /// Hellos naming an older remote connection are stale.
    pub(crate) min_remote_conn: u64,
    /// The remote side has echoed our `conn`: its QPs are ready.
    pub(crate) confirmed: bool,
    /// Remote QP numbers and PSNs (for repeated hellos).
    pub(crate) started: Instant,
    pub(crate) next_hello: Instant,
    pub(crate) backoff: Duration,
    /// Whether the local user resolved this peer (vs. a passive entry
    /// created by the remote's hello).
    pub(crate) resolved: bool,
}
