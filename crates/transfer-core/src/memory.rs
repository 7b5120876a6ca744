//! Memory: where a region lives and the descriptor a peer needs to write it.

use serde::{Deserialize, Serialize};

use crate::addr::BackendKind;
use crate::error::{Result, TransferError};

/// Where a registered region lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryLocation {
    /// Ordinary host memory.
    Host,
    /// Memory of CUDA device `device` (registered through dma-buf or peer memory).
    Cuda {
        /// CUDA device ordinal.
        device: u32,
    },
}

/// A remote key as the backend issued it (libfabric `fi_mr_key`, verbs rkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteKey(pub u64);

/// How one remote NIC reaches a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteNicRegion {
    /// The address the remote NIC expects for byte 0 of the region: the
    /// virtual address on providers with `FI_MR_VIRT_ADDR` and on verbs, 0 on
    /// offset-addressed providers. The engine adds offsets to it.
    pub base: u64,
    /// The key that grants remote write access.
    pub key: RemoteKey,
}

/// A serialisable descriptor of a region registered for remote access:
/// what a peer needs to write into it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// The backend that registered it.
    pub backend: BackendKind,
    /// The domain group (index into the owner's [`crate::EngineAddress::groups`]).
    pub group: u32,
    /// Length of the region in bytes.
    pub len: u64,
    /// One entry per NIC of that group, in NIC order.
    pub nics: Vec<RemoteNicRegion>,
}

/// Upper bound on an encoded descriptor, so hostile bytes cannot make the
/// decoder allocate without limit.
pub const MAX_ENCODED_DESCRIPTOR: usize = 64 * 1024;

impl RemoteRegion {
    /// Serialises the descriptor (postcard).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        postcard::to_allocvec(self)
            .map_err(|e| TransferError::malformed("RemoteRegion::to_bytes", e.to_string()))
    }

    /// Decodes a descriptor received from a peer; never panics on bad bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const CALL: &str = "RemoteRegion::from_bytes";
        if bytes.len() > MAX_ENCODED_DESCRIPTOR {
            return Err(TransferError::malformed(
                CALL,
                format!(
                    "{} bytes exceeds the {MAX_ENCODED_DESCRIPTOR}-byte limit",
                    bytes.len()
                ),
            ));
        }
        let region: Self = postcard::from_bytes(bytes)
            .map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        if region.nics.is_empty() {
            return Err(TransferError::malformed(
                CALL,
                "descriptor has no NIC entry",
            ));
        }
        Ok(region)
    }

    /// Checks that `[offset, offset + len)` lies inside the region.
    pub fn check_range(&self, call: &'static str, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(TransferError::invalid(
                call,
                format!(
                    "remote range {offset}+{len} outside region of {} bytes",
                    self.len
                ),
            )),
        }
    }
}

/// A span of memory handed to [`crate::Domain::register`].
#[derive(Debug, Clone, Copy)]
pub struct MemorySpan {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// Where the bytes live.
    pub location: MemoryLocation,
    /// For device memory: a dma-buf file descriptor exported for the span,
    /// when the caller has one (backends fall back to plain registration).
    pub dmabuf_fd: Option<i32>,
}
