//! HELLO version negotiation and the extension query.
//!
//! This server always advertises upstream's 7.0.0, so every upstream 7.0
//! client accepts it. The extension (COPY_TENSOR_TO, PEER_BARRIER) is never
//! signalled inside HELLO: `conn_caps` bytes belong to upstream's RDMA
//! transport upgrade and a non-zero byte there could make an upstream peer
//! attempt that upgrade. Instead a client that wants the extension sends
//! `EXT_QUERY` (a command byte upstream never uses); our server answers with
//! [`ExtInfo`], an upstream server closes the connection, so our client probes
//! on a throwaway connection (or on a peer connection it is ready to drop).

use super::wire::{Reader, WireWrite, expect_len};
use crate::error::{Result, RpcError};

/// Upstream protocol major version spoken here.
pub const PROTO_MAJOR: u8 = 7;
/// Upstream protocol minor version spoken here.
pub const PROTO_MINOR: u8 = 0;
/// Upstream protocol patch version spoken here.
pub const PROTO_PATCH: u8 = 0;
/// Size of the `conn_caps` field.
pub const CONN_CAPS_SIZE: usize = 24;
/// HELLO request size.
pub const HELLO_REQUEST_SIZE: usize = CONN_CAPS_SIZE;
/// HELLO response size.
pub const HELLO_RESPONSE_SIZE: usize = 4 + CONN_CAPS_SIZE;

/// HELLO request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HelloRequest {
    /// Transport capabilities; all zero means plain TCP.
    pub conn_caps: [u8; CONN_CAPS_SIZE],
}

/// HELLO response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloResponse {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// Patch version.
    pub patch: u8,
    /// Transport capabilities; all zero means plain TCP.
    pub conn_caps: [u8; CONN_CAPS_SIZE],
}

impl HelloResponse {
    /// What this crate's server answers: 7.0.0 over plain TCP.
    pub fn ours() -> Self {
        HelloResponse {
            major: PROTO_MAJOR,
            minor: PROTO_MINOR,
            patch: PROTO_PATCH,
            conn_caps: [0; CONN_CAPS_SIZE],
        }
    }

    /// Encodes the 28-byte payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.major, self.minor, self.patch, 0];
        out.extend_from_slice(&self.conn_caps);
        out
    }

    /// Decodes the 28-byte payload.
    pub fn decode(payload: &[u8]) -> Result<Self> {
        expect_len("HELLO response", payload, HELLO_RESPONSE_SIZE)?;
        let mut r = Reader::new(payload, "HELLO response");
        let major = r.u8()?;
        let minor = r.u8()?;
        let patch = r.u8()?;
        let _pad = r.u8()?;
        let conn_caps = r.array()?;
        Ok(HelloResponse {
            major,
            minor,
            patch,
            conn_caps,
        })
    }

    /// The upstream client's rule: same major, minor not newer than ours,
    /// patch ignored; non-zero `conn_caps` (a transport upgrade we do not
    /// speak) is refused as well.
    pub fn check_compatible(&self) -> Result<()> {
        if self.major != PROTO_MAJOR || self.minor > PROTO_MINOR {
            return Err(RpcError::Version {
                call: "HELLO",
                major: self.major,
                minor: self.minor,
                patch: self.patch,
            });
        }
        if self.conn_caps.iter().any(|&b| b != 0) {
            return Err(RpcError::refused(
                "HELLO",
                "server offered a transport upgrade",
            ));
        }
        Ok(())
    }
}

/// Magic at the start of an EXT_QUERY answer: "TRPC".
pub const EXT_MAGIC: u32 = u32::from_le_bytes(*b"TRPC");
/// Extension version (major).
pub const EXT_MAJOR: u16 = 1;
/// Extension version (minor).
pub const EXT_MINOR: u16 = 0;
/// Feature bit: COPY_TENSOR_TO is served.
pub const FEATURE_COPY_TENSOR_TO: u64 = 1 << 0;
/// Feature bit: PEER_BARRIER is served.
pub const FEATURE_PEER_BARRIER: u64 = 1 << 1;
/// Feature bit: the server has a TransferEngine and serves ENGINE_*
/// (0xC3..=0xC8); set only when it was started with an engine.
pub const FEATURE_ENGINE: u64 = 1 << 2;
/// Feature bit: MARK_OPEN, MARK_WAIT, PEER_MARK and COPY_TENSOR_TO_MARK
/// are served (0xC9..=0xCC).
pub const FEATURE_PEER_MARK: u64 = 1 << 3;
/// EXT_QUERY response size.
pub const EXT_INFO_SIZE: usize = 16;

/// Answer to EXT_QUERY: `magic u32 | major u16 | minor u16 | features u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtInfo {
    /// Extension major version.
    pub major: u16,
    /// Extension minor version.
    pub minor: u16,
    /// Feature bits (`FEATURE_*`).
    pub features: u64,
}

impl ExtInfo {
    /// What this crate's server answers.
    pub fn ours() -> Self {
        ExtInfo {
            major: EXT_MAJOR,
            minor: EXT_MINOR,
            features: FEATURE_COPY_TENSOR_TO | FEATURE_PEER_BARRIER | FEATURE_PEER_MARK,
        }
    }

    /// What a server with (`engine = true`) or without an engine answers.
    pub fn ours_with_engine(engine: bool) -> Self {
        let mut e = ExtInfo::ours();
        if engine {
            e.features |= FEATURE_ENGINE;
        }
        e
    }

    /// True when the feature bit is set and the major version is ours.
    pub fn has(&self, feature: u64) -> bool {
        self.major == EXT_MAJOR && self.features & feature == feature
    }

    /// Encodes the 16-byte payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(EXT_INFO_SIZE);
        out.put_u32(EXT_MAGIC);
        out.extend_from_slice(&self.major.to_le_bytes());
        out.extend_from_slice(&self.minor.to_le_bytes());
        out.put_u64(self.features);
        out
    }

    /// Decodes the 16-byte payload; refuses a wrong magic.
    pub fn decode(payload: &[u8]) -> Result<Self> {
        expect_len("EXT_QUERY response", payload, EXT_INFO_SIZE)?;
        let mut r = Reader::new(payload, "EXT_QUERY response");
        if r.u32()? != EXT_MAGIC {
            return Err(RpcError::malformed("EXT_QUERY response", "bad magic"));
        }
        let major = u16::from_le_bytes(r.array()?);
        let minor = u16::from_le_bytes(r.array()?);
        let features = r.u64()?;
        Ok(ExtInfo {
            major,
            minor,
            features,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_hello_response() {
        let b = HelloResponse::ours().encode();
        let mut want = vec![7, 0, 0, 0];
        want.extend_from_slice(&[0; 24]);
        assert_eq!(b, want);
        assert_eq!(HelloResponse::decode(&b).ok(), Some(HelloResponse::ours()));
    }

    #[test]
    fn version_rule_matches_upstream_client() {
        let mut h = HelloResponse::ours();
        assert!(h.check_compatible().is_ok());
        h.patch = 9;
        assert!(h.check_compatible().is_ok());
        h.minor = 1;
        assert!(h.check_compatible().is_err());
        h.minor = 0;
        h.major = 6;
        assert!(h.check_compatible().is_err());
        h.major = 7;
        h.conn_caps[0] = 1;
        assert!(h.check_compatible().is_err());
    }

    #[test]
    fn golden_ext_info() {
        let b = ExtInfo::ours().encode();
        assert_eq!(&b[..4], b"TRPC");
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[8..16], &11u64.to_le_bytes());
        let e = ExtInfo::decode(&b);
        assert!(e.is_ok_and(|e| e.has(FEATURE_COPY_TENSOR_TO) && e.has(FEATURE_PEER_BARRIER)));
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(ExtInfo::decode(&bad).is_err());
    }
}
