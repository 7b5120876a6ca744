//! Addresses: what a peer needs to reach this engine.
//!
//! Addresses are opaque bytes per NIC, tagged with the backend that made
//! them, so a verbs address is never fed to libfabric. They are serialised
//! with postcard; decoding bytes from the wire never panics.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TransferError};
use crate::shard::ShardPolicy;

/// Which backend produced an address or descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BackendKind {
    /// The in-memory test domain of transfer-core's own tests.
    Test,
    /// libfabric (EFA, tcp, shm, udp, verbs providers).
    Libfabric,
    /// ibverbs (ConnectX, RoCE, soft-RoCE).
    Verbs,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Test => "test",
            BackendKind::Libfabric => "libfabric",
            BackendKind::Verbs => "verbs",
        })
    }
}

/// Whether writes from one NIC to another land in the order they were posted.
///
/// ConnectX RC delivers in order; EFA SRD does not. The engine uses this to
/// decide whether one immediate per shard suffices (ordered) or every page
/// write must carry it (unordered), and the receiver reads it from the
/// sender's address to know how many immediates to expect.
///
/// What the engine relies on is narrower than placement order: a write
/// carrying an immediate is not delivered to the receiver before the
/// writes posted ahead of it in the same [`crate::Domain::submit_writes`]
/// call have landed. RC guarantees it by placement order; transfer-efa's
/// tcp and shm domains by holding such a write until the others were
/// delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Ordering {
    /// A write's immediate arrives only after the writes posted before it
    /// in its submit call have landed.
    InOrder,
    /// Writes may be placed in any order.
    Unordered,
}

/// The opaque address of one NIC (one domain), as its backend encodes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NicAddress(pub Vec<u8>);

/// The NICs of one domain group (one worker), in NIC order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupAddress {
    /// One address per NIC; index i pairs with the peer's NIC i.
    pub nics: Vec<NicAddress>,
    /// Delivery order of the group's backend.
    pub ordering: Ordering,
    /// How this group splits single writes (receivers need it to count immediates).
    pub shard_policy: ShardPolicy,
    /// Largest write any NIC of the group accepts (the smallest
    /// [`crate::DomainInfo::max_write_size`]; 0 means no limit). The group
    /// splits longer writes, and an unordered group's receivers count the
    /// pieces' immediates (see [`crate::shard::expected_imms`]).
    pub max_write_size: u64,
}

/// An engine's main address: everything a peer needs to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EngineAddress {
    /// The backend every NIC address belongs to.
    pub backend: BackendKind,
    /// One entry per domain group (usually one per GPU).
    pub groups: Vec<GroupAddress>,
}

/// Upper bound on decoded address sizes, so hostile bytes cannot make the
/// decoder allocate without limit.
pub const MAX_ENCODED_ADDRESS: usize = 64 * 1024;

impl EngineAddress {
    /// Serialises the address (postcard).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        postcard::to_allocvec(self)
            .map_err(|e| TransferError::malformed("EngineAddress::to_bytes", e.to_string()))
    }

    /// Decodes an address received from a peer; never panics on bad bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const CALL: &str = "EngineAddress::from_bytes";
        if bytes.len() > MAX_ENCODED_ADDRESS {
            return Err(TransferError::malformed(
                CALL,
                format!(
                    "{} bytes exceeds the {MAX_ENCODED_ADDRESS}-byte limit",
                    bytes.len()
                ),
            ));
        }
        let addr: Self = postcard::from_bytes(bytes)
            .map_err(|e| TransferError::malformed(CALL, e.to_string()))?;
        addr.validate(CALL)?;
        Ok(addr)
    }

    /// Checks structural invariants (at least one group, each with at least one NIC).
    pub fn validate(&self, call: &'static str) -> Result<()> {
        if self.groups.is_empty() {
            return Err(TransferError::malformed(
                call,
                "address has no domain group",
            ));
        }
        if let Some(i) = self.groups.iter().position(|g| g.nics.is_empty()) {
            return Err(TransferError::malformed(
                call,
                format!("group {i} has no NIC"),
            ));
        }
        Ok(())
    }

    /// The group at `index`, or an error naming `call`.
    pub fn group(&self, call: &'static str, index: usize) -> Result<&GroupAddress> {
        self.groups.get(index).ok_or_else(|| {
            TransferError::invalid(call, format!("peer has no domain group {index}"))
        })
    }
}
