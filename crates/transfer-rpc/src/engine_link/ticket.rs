//! The lane ticket: what ENGINE_OPEN_INBOUND hands out (in the
//! response's `descriptor` bytes) and ENGINE_OPEN_OUTBOUND takes back.
//!
//! An immediate only names a lane (16 bits) and a sequence number, and the
//! receiving engine cannot tell which sender or region an immediate came
//! with: a client with a session on the *sending* server could otherwise
//! name another tenant's lane and complete that tenant's ENGINE_WAIT
//! before its data landed. So every lane also has a random 64-bit secret
//! and a ring of [`SLOTS`] 16-byte slots on the destination, registered
//! beside the lane's range. Before each data write the sender writes
//! `secret | seq` into slot `seq % SLOTS`; ENGINE_WAIT succeeds only when
//! the immediates arrived *and* that slot holds this lane's secret and this
//! sequence number. Only whoever holds the ticket (the client that opened
//! the lane, and the server it handed it to) knows the secret and can
//! reach the slots; a stray immediate can delay a wait (it then times
//! out), never complete it early.
//!
//! Layout: `magic "TRL1" | secret u64 | data_len u32 | data RemoteRegion |
//! slots_len u32 | slots RemoteRegion`.

use transfer_core::RemoteRegion;

/// Slots per lane: a lane may have at most this many writes posted and
/// not yet waited for (a later write reuses the slot of `seq - SLOTS`).
pub const SLOTS: u64 = 64;
/// Bytes per slot: `secret u64 | seq u64`.
pub const SLOT_BYTES: u64 = 16;

const MAGIC: &[u8; 4] = b"TRL1";
/// Largest ticket accepted (two descriptors of many NICs).
const MAX_TICKET: usize = 16 * 1024;

/// A lane's ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneTicket {
    /// The lane's byte range.
    pub data: RemoteRegion,
    /// The lane's slot ring.
    pub slots: RemoteRegion,
    /// The lane's secret.
    pub secret: u64,
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    out.extend_from_slice(&u32::try_from(bytes.len()).ok()?.to_le_bytes());
    out.extend_from_slice(bytes);
    Some(())
}

fn take<'a>(b: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let len = u32::from_le_bytes(b.get(*at..*at + 4)?.try_into().ok()?) as usize;
    let s = b.get(*at + 4..(*at + 4).checked_add(len)?)?;
    *at += 4 + len;
    Some(s)
}

impl LaneTicket {
    /// The wire bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let data = self.data.to_bytes().map_err(|e| e.to_string())?;
        let slots = self.slots.to_bytes().map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(16 + data.len() + slots.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.secret.to_le_bytes());
        put(&mut out, &data).ok_or("descriptor too large")?;
        put(&mut out, &slots).ok_or("descriptor too large")?;
        Ok(out)
    }

    /// Parses ticket bytes (untrusted: from a client).
    pub fn from_bytes(b: &[u8]) -> Result<LaneTicket, String> {
        if b.len() > MAX_TICKET || b.get(..4) != Some(&MAGIC[..]) {
            return Err("not a lane ticket (from ENGINE_OPEN_INBOUND)".into());
        }
        let secret = b
            .get(4..12)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or("short lane ticket")?;
        let mut at = 12;
        let data = take(b, &mut at).ok_or("short lane ticket")?;
        let slots = take(b, &mut at).ok_or("short lane ticket")?;
        if at != b.len() {
            return Err("trailing bytes after the lane ticket".into());
        }
        let data = RemoteRegion::from_bytes(data).map_err(|e| e.to_string())?;
        let slots = RemoteRegion::from_bytes(slots).map_err(|e| e.to_string())?;
        if slots.len < SLOTS * SLOT_BYTES {
            return Err("lane ticket with a short slot ring".into());
        }
        Ok(LaneTicket {
            data,
            slots,
            secret,
        })
    }
}

/// Offset of the slot of write `seq`.
pub fn slot_offset(seq: u32) -> u64 {
    (u64::from(seq) % SLOTS) * SLOT_BYTES
}

/// The slot contents of write `seq` on a lane with `secret`.
pub fn slot_value(secret: u64, seq: u32) -> [u8; SLOT_BYTES as usize] {
    let mut v = [0u8; SLOT_BYTES as usize];
    v[..8].copy_from_slice(&secret.to_le_bytes());
    v[8..].copy_from_slice(&u64::from(seq).to_le_bytes());
    v
}

/// A fresh secret from the OS.
pub fn new_secret() -> Option<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_core::{BackendKind, RemoteKey, RemoteNicRegion};

    fn region(len: u64) -> RemoteRegion {
        RemoteRegion {
            backend: BackendKind::Libfabric,
            group: 0,
            len,
            nics: vec![RemoteNicRegion {
                base: 0,
                key: RemoteKey(7),
            }],
        }
    }

    #[test]
    fn round_trip_and_refusals() -> Result<(), String> {
        let t = LaneTicket {
            data: region(4096),
            slots: region(SLOTS * SLOT_BYTES),
            secret: 0xdead_beef,
        };
        let b = t.to_bytes()?;
        assert_eq!(LaneTicket::from_bytes(&b)?, t);
        assert!(LaneTicket::from_bytes(&b[..b.len() - 1]).is_err());
        let mut extra = b.clone();
        extra.push(0);
        assert!(LaneTicket::from_bytes(&extra).is_err());
        assert!(LaneTicket::from_bytes(b"TRL0").is_err());
        let short = LaneTicket {
            slots: region(16),
            ..t
        };
        assert!(LaneTicket::from_bytes(&short.to_bytes()?).is_err());
        assert_eq!(slot_offset(65), 16);
        assert_eq!(&slot_value(1, 2)[8..], &2u64.to_le_bytes());
        Ok(())
    }
}
