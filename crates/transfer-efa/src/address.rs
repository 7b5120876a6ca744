//! The NIC address format of this backend, and its validation.
//!
//! A [`NicAddress`] made here is `b"LF"`, a format version byte, the
//! provider name (length byte + bytes), the libfabric `addr_format` (u32
//! little endian) and the raw `fi_getname` bytes. Decoding checks every
//! part against the local endpoint before anything reaches `fi_av_insert`,
//! so bytes from the wire cannot make the provider read past a buffer or
//! mix providers.

use transfer_core::{NicAddress, Result, TransferError};

use crate::sys;

const MAGIC: &[u8; 2] = b"LF";
const VERSION: u8 = 1;
/// Largest raw provider address accepted.
pub const MAX_RAW_ADDRESS: usize = 1024;

/// What the local endpoint's addresses look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddressFormat {
    pub(crate) provider: String,
    pub(crate) addr_format: u32,
    pub(crate) raw_len: usize,
}

/// Encodes a local raw address.
pub(crate) fn encode(format: &AddressFormat, raw: &[u8]) -> NicAddress {
    let prov = format.provider.as_bytes();
    let prov = &prov[..prov.len().min(255)];
    let mut out = Vec::with_capacity(4 + prov.len() + 4 + raw.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(prov.len() as u8);
    out.extend_from_slice(prov);
    out.extend_from_slice(&format.addr_format.to_le_bytes());
    out.extend_from_slice(raw);
    NicAddress(out)
}

/// Decodes and validates a peer's address against the local format;
/// returns the raw bytes to insert into the AV.
pub(crate) fn decode<'a>(format: &AddressFormat, addr: &'a NicAddress) -> Result<&'a [u8]> {
    const CALL: &str = "resolve_peer";
    let bad = |reason: String| TransferError::malformed(CALL, reason);
    let b = addr.0.as_slice();
    if b.len() < 4 || &b[..2] != MAGIC {
        return Err(bad("not a libfabric NIC address".into()));
    }
    if b[2] != VERSION {
        return Err(bad(format!("unknown address version {}", b[2])));
    }
    let prov_len = usize::from(b[3]);
    let rest = &b[4..];
    let (prov, rest) = rest
        .split_at_checked(prov_len)
        .ok_or_else(|| bad("truncated provider name".into()))?;
    if prov != format.provider.as_bytes() {
        return Err(bad(format!(
            "address of provider {:?}, this domain is {:?}",
            String::from_utf8_lossy(prov),
            format.provider
        )));
    }
    let (af, raw) = rest
        .split_at_checked(4)
        .ok_or_else(|| bad("truncated address format".into()))?;
    let af = u32::from_le_bytes([af[0], af[1], af[2], af[3]]);
    if af != format.addr_format {
        return Err(bad(format!(
            "address format {af}, this domain uses {}",
            format.addr_format
        )));
    }
    if raw.is_empty() || raw.len() > MAX_RAW_ADDRESS {
        return Err(bad(format!("raw address of {} bytes", raw.len())));
    }
    match af {
        // Names: one NUL-terminated string, no interior NUL.
        sys::FI_ADDR_STR => {
            if raw.iter().position(|&c| c == 0) != Some(raw.len() - 1) {
                return Err(bad("string address not NUL-terminated".into()));
            }
        }
        _ => {
            if raw.len() != format.raw_len {
                return Err(bad(format!(
                    "raw address of {} bytes, expected {}",
                    raw.len(),
                    format.raw_len
                )));
            }
            let family = u16::from_ne_bytes([raw[0], raw.get(1).copied().unwrap_or(0)]);
            let want = match af {
                sys::FI_SOCKADDR_IN => Some(libc::AF_INET as u16),
                sys::FI_SOCKADDR_IN6 => Some(libc::AF_INET6 as u16),
                _ => None,
            };
            if want.is_some_and(|w| w != family) {
                return Err(bad(format!("socket address family {family}")));
            }
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt() -> AddressFormat {
        AddressFormat {
            provider: "tcp;ofi_rxm".into(),
            addr_format: sys::FI_SOCKADDR_IN,
            raw_len: 16,
        }
    }

    #[test]
    fn roundtrip_and_rejects() {
        let mut raw = vec![0u8; 16];
        raw[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        let a = encode(&fmt(), &raw);
        assert_eq!(decode(&fmt(), &a).ok(), Some(raw.as_slice()));
        for cut in 0..a.0.len() {
            assert!(decode(&fmt(), &NicAddress(a.0[..cut].to_vec())).is_err());
        }
        let mut longer = a.0.clone();
        longer.push(0);
        assert!(decode(&fmt(), &NicAddress(longer)).is_err());
        let mut fam = a.0.clone();
        let at = a.0.len() - 16;
        fam[at] = 99;
        assert!(decode(&fmt(), &NicAddress(fam)).is_err());
        let other = AddressFormat {
            provider: "sockets".into(),
            ..fmt()
        };
        assert!(decode(&other, &a).is_err());
    }
}
