//! Opened NICs of either backend: a group for an engine ([`Domains`]) or a
//! single bare domain of either kind ([`AnyDomain`]) for code written
//! against [`transfer_core::Domain`] (raw baselines, tools).

use transfer_core::{
    BackendKind, Domain, DomainEvent, DomainInfo, DomainMr, EngineBuilder, MemorySpan, NicAddress,
    OpToken, PeerId, RecvToken, Registration, Result as CoreResult, WriteOp,
};
#[cfg(feature = "libfabric")]
use transfer_efa::LibfabricDomain;
#[cfg(feature = "verbs")]
use transfer_verbs::VerbsDomain;

/// The domains one [`crate::Backend`] opened: one engine group. Kept per
/// backend type so that the engine's worker is monomorphic (no dispatch on
/// the data path).
pub enum Domains {
    /// libfabric NICs (or endpoints).
    #[cfg(feature = "libfabric")]
    Libfabric(Vec<LibfabricDomain>),
    /// Native verbs domains.
    #[cfg(feature = "verbs")]
    Verbs(Vec<VerbsDomain>),
}

impl Domains {
    /// How many domains (NICs) there are.
    pub fn len(&self) -> usize {
        match self {
            #[cfg(feature = "libfabric")]
            Self::Libfabric(v) => v.len(),
            #[cfg(feature = "verbs")]
            Self::Verbs(v) => v.len(),
        }
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds them to `builder` as one group (one worker thread).
    pub fn add_to(self, builder: EngineBuilder) -> EngineBuilder {
        match self {
            #[cfg(feature = "libfabric")]
            Self::Libfabric(v) => builder.group(v),
            #[cfg(feature = "verbs")]
            Self::Verbs(v) => builder.group(v),
        }
    }

    /// Adds them to `builder` as the group of CUDA device `cuda_device`.
    pub fn add_to_device(self, builder: EngineBuilder, cuda_device: u32) -> EngineBuilder {
        match self {
            #[cfg(feature = "libfabric")]
            Self::Libfabric(v) => builder.group_on_device(cuda_device, v),
            #[cfg(feature = "verbs")]
            Self::Verbs(v) => builder.group_on_device(cuda_device, v),
        }
    }

    /// Each domain on its own, behind one type.
    pub fn into_any(self) -> Vec<AnyDomain> {
        match self {
            #[cfg(feature = "libfabric")]
            Self::Libfabric(v) => v.into_iter().map(AnyDomain::Libfabric).collect(),
            #[cfg(feature = "verbs")]
            Self::Verbs(v) => v.into_iter().map(AnyDomain::Verbs).collect(),
        }
    }
}

/// One domain of either backend, itself a [`Domain`]: for code that drives
/// a bare domain (no engine) whatever the backend.
// Both variants are about a kilobyte and a program holds a handful of
// these: boxing would only add a pointer chase on every data-path call.
#[allow(clippy::large_enum_variant)]
pub enum AnyDomain {
    /// A libfabric domain.
    #[cfg(feature = "libfabric")]
    Libfabric(LibfabricDomain),
    /// A native verbs domain.
    #[cfg(feature = "verbs")]
    Verbs(VerbsDomain),
}

// Hand-written: VerbsDomain has no Debug (its verbs objects are raw handles).
impl std::fmt::Debug for Domains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domains")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AnyDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyDomain")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

/// Forwards a [`Domain`] call to the domain inside.
macro_rules! forward {
    ($self:ident, $d:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "libfabric")]
            AnyDomain::Libfabric($d) => $call,
            #[cfg(feature = "verbs")]
            AnyDomain::Verbs($d) => $call,
        }
    };
}

impl Domain for AnyDomain {
    fn backend(&self) -> BackendKind {
        forward!(self, d => d.backend())
    }

    fn info(&self) -> DomainInfo {
        forward!(self, d => d.info())
    }

    fn address(&self) -> NicAddress {
        forward!(self, d => d.address())
    }

    fn register(&mut self, span: MemorySpan) -> CoreResult<Registration> {
        forward!(self, d => d.register(span))
    }

    fn unregister(&mut self, mr: DomainMr) -> CoreResult<()> {
        forward!(self, d => d.unregister(mr))
    }

    fn resolve_peer(&mut self, addr: &NicAddress) -> CoreResult<PeerId> {
        forward!(self, d => d.resolve_peer(addr))
    }

    fn remove_peer(&mut self, peer: PeerId) {
        forward!(self, d => d.remove_peer(peer))
    }

    fn post_recv(
        &mut self,
        token: RecvToken,
        mr: DomainMr,
        buf: *mut u8,
        len: usize,
    ) -> CoreResult<()> {
        forward!(self, d => d.post_recv(token, mr, buf, len))
    }

    fn submit_send(&mut self, op: OpToken, peer: PeerId, data: Vec<u8>) {
        forward!(self, d => d.submit_send(op, peer, data))
    }

    fn submit_writes(&mut self, op: OpToken, writes: &[WriteOp]) {
        forward!(self, d => d.submit_writes(op, writes))
    }

    fn poll(&mut self, events: &mut Vec<DomainEvent>) {
        forward!(self, d => d.poll(events))
    }

    fn has_pending(&self) -> bool {
        forward!(self, d => d.has_pending())
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        forward!(self, d => d.wait_fd())
    }

    fn prepare_wait(&mut self) -> bool {
        forward!(self, d => d.prepare_wait())
    }
}
