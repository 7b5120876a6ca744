//! Peers, remote targets and peer groups.

use std::sync::Arc;

use crate::addr::EngineAddress;
use crate::memory::RemoteRegion;

pub(crate) struct PeerInner {
    pub(crate) id: u64,
    pub(crate) addr: EngineAddress,
}

/// A peer engine, validated and interned by [`crate::TransferEngine::peer`].
/// Cheap to clone.
#[derive(Clone)]
pub struct Peer(pub(crate) Arc<PeerInner>);

impl Peer {
    /// The peer's address.
    pub fn address(&self) -> &EngineAddress {
        &self.0.addr
    }

    /// The engine-local id of this peer incarnation.
    pub fn id(&self) -> u64 {
        self.0.id
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("id", &self.0.id).finish()
    }
}

/// A peer's region, checked against the peer's address once (backend, group,
/// NIC count), so writes to it need no further validation of the descriptor.
#[derive(Clone, Debug)]
pub struct RemoteTarget {
    pub(crate) peer: Peer,
    pub(crate) region: Arc<RemoteRegion>,
}

impl RemoteTarget {
    /// The peer.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The region descriptor.
    pub fn region(&self) -> &RemoteRegion {
        &self.region
    }

    /// Number of NICs shared by the remote group and a local group of `local_nics` NICs.
    pub(crate) fn nics_with(&self, local_nics: usize) -> usize {
        self.region.nics.len().min(local_nics).max(1)
    }
}

/// A set of remote targets added once and reused for scatter and barrier.
#[derive(Clone, Debug)]
pub struct PeerGroup {
    pub(crate) members: Arc<[RemoteTarget]>,
}

impl PeerGroup {
    /// The members, in the order given.
    pub fn members(&self) -> &[RemoteTarget] {
        &self.members
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the group is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}
