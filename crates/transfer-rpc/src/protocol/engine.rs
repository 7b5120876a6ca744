//! The ENGINE_* extension: ids, immediates and the variable-length fields.
//!
//! | byte | command | request | response |
//! |---|---|---|---|
//! | 0xC3 | ENGINE_INFO | empty | `backend u8 \| address bytes` (rest; empty when backend = 0) |
//! | 0xC4 | ENGINE_OPEN_INBOUND | `buffer u64 \| offset u64 \| size u64 \| sender_len u32 \| sender address` | `ok u8 \| lane u32 \| descriptor bytes` (rest; empty when ok = 0) |
//! | 0xC5 | ENGINE_OPEN_OUTBOUND | `dst_len u32 \| destination address \| desc_len u32 \| descriptor \| lane u32` | `ok u8 \| outbound id u32` |
//! | 0xC6 | ENGINE_WRITE | `outbound u32 \| src rpc_tensor \| src_offset u64 \| size u64 \| dst_offset u64 \| seq u32` (328 B) | `ok u8` |
//! | 0xC7 | ENGINE_WAIT | `lane u32 \| seq u32 \| timeout_ms u32 \| size u64` (20 B) | `ok u8` |
//! | 0xC8 | ENGINE_CLOSE | `kind u8 (0 inbound, 1 outbound) \| id u32` (5 B) | `ok u8` |
//!
//! Addresses are `transfer_core::EngineAddress` bytes, descriptors lane
//! tickets (`engine_link::ticket`: the range's `RemoteRegion`, the lane's
//! slot ring and secret, which make a wait unforgeable); both are opaque
//! here and bounded by [`MAX_ENGINE_BYTES`] before anything is allocated
//! for them.
//!
//! ENGINE_WAIT carries the byte count of the write it waits for: on a
//! multi-NIC engine one write of `size` bytes is split into several shards,
//! each carrying the immediate, and the receiver computes how many to wait
//! for from the sender's address and that size (`expected_imms`).
//!
//! # Immediates
//! One write on lane `l` with sequence number `s` carries the 32-bit
//! immediate [`lane_imm`]`(l, s)` = `(l << 16) | (s & 0xFFFF)`. Lane ids are
//! therefore 1..=0xFFFF and unique per server (the immediate counters are
//! engine-wide); lane 0 is reserved ([`PROBE_LANE`]: the reachability probe
//! of ENGINE_OPEN_OUTBOUND). Sequence numbers wrap at 65536: a lane may have
//! at most 65536 writes not yet waited for.

use super::wire::{Reader, WireWrite};
use crate::error::{Result, RpcError};

/// Largest address or descriptor accepted (an EFA address of 32 NICs is
/// ~2 KiB; transfer-core's own decoders allow 64 KiB, which the wire does
/// not need).
pub const MAX_ENGINE_BYTES: usize = 16 * 1024;
/// Bits of the immediate that hold the sequence number.
pub const IMM_SEQ_BITS: u32 = 16;
/// Largest lane id (lanes live in the upper 16 bits of an immediate).
pub const MAX_LANE: u32 = 0xFFFF;
/// Lane reserved for the zero-byte reachability probe; never allocated.
pub const PROBE_LANE: u32 = 0;
/// ENGINE_WRITE request size.
pub const ENGINE_WRITE_SIZE: usize = 4 + super::RPC_TENSOR_SIZE + 8 + 8 + 8 + 4;
/// ENGINE_WAIT request size.
pub const ENGINE_WAIT_SIZE: usize = 4 + 4 + 4 + 8;
/// ENGINE_CLOSE request size.
pub const ENGINE_CLOSE_SIZE: usize = 1 + 4;
/// ENGINE_OPEN_OUTBOUND response size.
pub const ENGINE_OUTBOUND_RESPONSE_SIZE: usize = 1 + 4;

/// Backend tag of ENGINE_INFO: the server has no engine.
pub const BACKEND_NONE: u8 = 0;
/// Backend tag of ENGINE_INFO: libfabric (EFA, tcp, shm, ...).
pub const BACKEND_LIBFABRIC: u8 = 1;
/// Backend tag of ENGINE_INFO: ibverbs.
pub const BACKEND_VERBS: u8 = 2;
/// Backend tag of ENGINE_INFO: transfer-core's in-memory test domain.
pub const BACKEND_TEST: u8 = 3;

/// An inbound lane: where one sender's writes to one buffer range land
/// and which immediates announce them. Unique on its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u32);

/// An outbound target of one session (a resolved remote region and lane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutboundId(pub u32);

/// Which kind of id ENGINE_CLOSE closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseKind {
    /// An inbound lane (on the destination server).
    Inbound,
    /// An outbound target (on the source server).
    Outbound,
}

impl CloseKind {
    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            CloseKind::Inbound => 0,
            CloseKind::Outbound => 1,
        }
    }

    /// Decodes the byte; anything but 0 and 1 is refused.
    pub fn from_byte(call: &'static str, b: u8) -> Result<CloseKind> {
        match b {
            0 => Ok(CloseKind::Inbound),
            1 => Ok(CloseKind::Outbound),
            _ => Err(RpcError::malformed(call, format!("close kind {b}"))),
        }
    }
}

/// The immediate of write `seq` on `lane`: `(lane << 16) | (seq & 0xFFFF)`.
/// `lane` must be at most [`MAX_LANE`] (higher bits are dropped).
pub fn lane_imm(lane: LaneId, seq: u32) -> u32 {
    ((lane.0 & MAX_LANE) << IMM_SEQ_BITS) | (seq & ((1 << IMM_SEQ_BITS) - 1))
}

/// Reads `len u32 | bytes`, refusing an empty or oversized field before
/// looking at the bytes.
pub(crate) fn read_bounded<'a>(
    r: &mut Reader<'a>,
    call: &'static str,
    what: &str,
) -> Result<&'a [u8]> {
    let len = r.u32()? as usize;
    if len == 0 || len > MAX_ENGINE_BYTES || len > r.remaining() {
        return Err(RpcError::malformed(
            call,
            format!(
                "{what} length {len} (1..={MAX_ENGINE_BYTES}, {} bytes follow)",
                r.remaining()
            ),
        ));
    }
    r.bytes(len)
}

/// Appends `len u32 | bytes`.
pub(crate) fn put_bounded(o: &mut Vec<u8>, bytes: &[u8]) {
    o.put_u32(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
    o.extend_from_slice(bytes);
}

/// Checks a trailing variable field of a response against the bound.
pub(crate) fn check_rest(call: &'static str, what: &str, rest: &[u8]) -> Result<()> {
    if rest.len() > MAX_ENGINE_BYTES {
        return Err(RpcError::malformed(
            call,
            format!("{what} of {} bytes exceeds {MAX_ENGINE_BYTES}", rest.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_layout() {
        assert_eq!(lane_imm(LaneId(1), 0), 0x0001_0000);
        assert_eq!(lane_imm(LaneId(0xFFFF), 0x1_0002), 0xFFFF_0002);
        assert_eq!(lane_imm(LaneId(7), 0xFFFF), 0x0007_FFFF);
        assert_eq!(ENGINE_WRITE_SIZE, 328);
        assert_eq!(ENGINE_WAIT_SIZE, 20);
    }

    #[test]
    fn bounded_fields() {
        let mut o = Vec::new();
        put_bounded(&mut o, b"abc");
        let mut r = Reader::new(&o, "t");
        assert_eq!(read_bounded(&mut r, "t", "x").ok(), Some(&b"abc"[..]));
        let big = (MAX_ENGINE_BYTES as u32 + 1).to_le_bytes();
        assert!(read_bounded(&mut Reader::new(&big, "t"), "t", "x").is_err());
        let empty = 0u32.to_le_bytes();
        assert!(read_bounded(&mut Reader::new(&empty, "t"), "t", "x").is_err());
        assert!(CloseKind::from_byte("t", 2).is_err());
    }
}
