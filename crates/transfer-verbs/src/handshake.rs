//! The connection handshake's wire formats: a domain's address (what
//! peers resolve) and the hello datagrams exchanged over the UD QP.
//! postcard-encoded; decoding hostile bytes never panics.
//!
//! Protocol (both sides run it in `poll`, so either may start): each side
//! of a peer pair creates two RC QPs (a "connection", numbered by a
//! per-domain counter that only grows) and sends `Hello { conn, qpns,
//! psns, peer_conn: None }`, retransmitted with backoff because UD may drop
//! it. A side receiving a hello connects its QPs to the sender's (RTR/RTS)
//! and answers with `peer_conn = Some(sender's conn)`; a side that sees its
//! own `conn` echoed knows the remote QPs are ready and starts posting. A
//! hello naming a newer `conn` than the one recorded means the sender
//! rebuilt its QPs (after an error or `remove_peer`): the receiver rebuilds
//! too (or, if its QPs carried nothing yet, re-points them). Older `conn`s
//! are stale and ignored. See [`decide`].

use serde::{Deserialize, Serialize};
use transfer_core::{NicAddress, Result, TransferError};

/// Wire-format version of addresses and hellos.
pub const VERSION: u8 = 1;
/// First bytes of every hello datagram.
pub const MAGIC: [u8; 4] = *b"TVH1";
/// Largest encoded hello (fits any UD MTU).
pub const MAX_HELLO: usize = 256;

/// How peers reach one domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WireAddress {
    /// Format version ([`VERSION`]).
    pub version: u8,
    /// Port GID (RoCE / global routing); zeros when LID-routed.
    pub gid: [u8; 16],
    /// Whether the GRH (GID routing) is required to reach this port.
    pub global: bool,
    /// LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// QP number of the handshake UD QP.
    pub ud_qpn: u32,
    /// Q_Key of the handshake UD QP (random per domain).
    pub qkey: u32,
    /// Active MTU (`enum ibv_mtu`), to agree on the path MTU.
    pub mtu: u8,
    /// Random per domain incarnation: a restarted domain at the same
    /// QPN is a different peer.
    pub nonce: u64,
}

/// One handshake datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The sender's address.
    pub from: WireAddress,
    /// The receiver's nonce, as the sender knows it.
    pub to_nonce: u64,
    /// Whether the sender is tearing this connection down (`remove_peer`).
    pub bye: bool,
    /// The sender's connection number.
    pub conn: u64,
    /// The receiver's connection the sender's QPs are connected to, if any.
    pub peer_conn: Option<u64>,
    /// Whether the sender has seen its own `conn` echoed (it may post).
    pub confirmed: bool,
    /// The oldest receiver connection the sender accepts: after an error it
    /// rebuilt its QPs and refuses the receiver's current ones, which must
    /// be rebuilt too.
    pub min_peer_conn: u64,
    /// RC QP numbers: `[messages, writes]`.
    pub qpns: [u32; 2],
    /// Initial packet sequence numbers of those QPs (random).
    pub psns: [u32; 2],
}

/// Encodes an address.
pub fn encode_address(a: &WireAddress) -> Result<NicAddress> {
    postcard::to_allocvec(a)
        .map(NicAddress)
        .map_err(|e| TransferError::malformed("verbs address encode", e.to_string()))
}

/// Decodes an address; refuses other versions and trailing bytes.
pub fn decode_address(a: &NicAddress) -> Result<WireAddress> {
    const CALL: &str = "verbs address decode";
    let (w, rest): (WireAddress, _) = postcard::take_from_bytes(&a.0)
        .map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
    if !rest.is_empty() {
        return Err(TransferError::malformed(CALL, "trailing bytes"));
    }
    if w.version != VERSION {
        return Err(TransferError::malformed(
            CALL,
            format!(
                "address version {} (this build speaks {VERSION})",
                w.version
            ),
        ));
    }
    if w.ud_qpn == 0 || w.ud_qpn > 0x00ff_ffff {
        return Err(TransferError::malformed(CALL, "invalid UD QP number"));
    }
    Ok(w)
}

/// Encodes a hello datagram.
pub fn encode_hello(h: &Hello) -> Result<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    let body = postcard::to_allocvec(h)
        .map_err(|e| TransferError::malformed("hello encode", e.to_string()))?;
    out.extend_from_slice(&body);
    if out.len() > MAX_HELLO {
        return Err(TransferError::malformed("hello encode", "hello too long"));
    }
    Ok(out)
}

/// Decodes a hello datagram (payload after the 40-byte GRH).
pub fn decode_hello(bytes: &[u8]) -> Result<Hello> {
    const CALL: &str = "hello decode";
    let body = bytes
        .strip_prefix(&MAGIC[..])
        .ok_or_else(|| TransferError::malformed(CALL, "bad magic"))?;
    let (h, _): (Hello, _) = postcard::take_from_bytes(body)
        .map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
    if h.from.version != VERSION {
        return Err(TransferError::malformed(CALL, "version mismatch"));
    }
    if h.qpns.iter().any(|&q| q == 0 || q > 0x00ff_ffff) && !h.bye {
        return Err(TransferError::malformed(CALL, "invalid QP number"));
    }
    Ok(h)
}

/// Where one side's connection to a peer stands, as the hello logic sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No QPs (the peer said goodbye); a hello or new work rebuilds them.
    Idle,
    /// QPs exist; waiting for the peer to echo our connection number.
    Connecting,
    /// Confirmed by the peer: work is posted.
    Ready,
    /// Unreachable (retries exhausted, handshake timed out): no QPs.
    Dead,
}

/// One side's view of its connection to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnView {
    /// Our connection number (of our current QPs).
    pub conn: u64,
    /// The peer connection our QPs are connected to.
    pub remote_conn: Option<u64>,
    /// Hellos from older peer connections are stale.
    pub min_remote_conn: u64,
    /// Whether the peer echoed our `conn`.
    pub confirmed: bool,
    /// Phase.
    pub phase: Phase,
}

/// What to do with one received hello; the steps apply in field order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HelloAction {
    /// Stale or foreign: do nothing else.
    pub ignore: bool,
    /// The peer closed our current connection: drop the QPs, become Idle.
    pub close: bool,
    /// Build new QPs with a new connection number (fails posted work).
    pub rebuild: bool,
    /// Reset our unused QPs to INIT (keeping our connection number).
    pub repoint: bool,
    /// Connect our QPs to the hello's (RTR/RTS); `remote_conn = hello.conn`.
    pub connect: bool,
    /// The peer echoed our connection: become Ready.
    pub confirm: bool,
    /// Answer with our current hello.
    pub reply: bool,
}

/// The handshake's decision for a received hello `h` (pure; see the module
/// documentation). Two rules keep both sides converging under lost,
/// duplicated and reordered datagrams (tests/handshake_sim.rs): a side
/// whose QPs carried nothing yet re-points them to a rebuilt peer instead
/// of rebuilding itself (otherwise both sides can rebuild in turn forever),
/// and a side told that its connection is refused (`min_peer_conn`, sent by
/// a peer that rebuilt after an error) rebuilds. A hello whose `peer_conn`
/// names an older connection of ours is *not* ignored: both sides may be
/// connected to each other's previous QPs, and only answering lets them
/// converge.
pub fn decide(v: &ConnView, h: &Hello) -> HelloAction {
    let ignore = HelloAction {
        ignore: true,
        ..Default::default()
    };
    if h.conn < v.min_remote_conn {
        return ignore;
    }
    if h.bye {
        return if v.remote_conn == Some(h.conn) {
            HelloAction {
                close: true,
                ..Default::default()
            }
        } else {
            ignore
        };
    }
    // The sender rebuilt after an error and refuses our current QPs.
    let refused = v.conn < h.min_peer_conn;
    let mut a = HelloAction::default();
    match v.remote_conn {
        Some(rc) if h.conn < rc => return ignore,
        Some(rc) if h.conn == rc => {}
        Some(_) if v.phase == Phase::Connecting && !refused => a.repoint = true,
        Some(_) => a.rebuild = true,
        None => {}
    }
    if refused || matches!(v.phase, Phase::Idle | Phase::Dead) {
        a.rebuild = true;
        a.repoint = false;
    }
    let remote_after = if a.rebuild || a.repoint {
        None
    } else {
        v.remote_conn
    };
    a.connect = remote_after.is_none();
    // After a rebuild our connection number is new: the hello cannot name it.
    let echoed = !a.rebuild && h.peer_conn == Some(v.conn);
    a.confirm = echoed && !v.confirmed;
    a.reply = !echoed || !h.confirmed;
    a
}
