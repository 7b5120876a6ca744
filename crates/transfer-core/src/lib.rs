//! # transfer-core
//!
//! The backend-independent TransferEngine: memory registration with
//! serialisable remote descriptors, two-sided messages, one-sided writes
//! with 32-bit immediates, peer groups, receiver-side immediate counters,
//! multi-NIC sharding and the worker threads that own the NICs.
//!
//! Backends implement [`Domain`]; see the `transfer-efa` and
//! `transfer-verbs` crates. Layering, bottom up: value types (`addr`,
//! `memory`, `request`) -> backend contract (`domain`, `group`) -> pure
//! arithmetic (`shard`) -> receiver counters (`imm_counter`) -> worker
//! threads (`worker`, `idle`, `topology`) -> public API (`engine`).

pub mod addr;
mod callbacks;
pub mod completion;
pub mod countdown;
pub mod domain;
pub mod engine;
pub mod error;
pub mod group;
pub mod idle;
mod imm_counter;
mod job;
pub mod memory;
mod oneshot;
pub mod peer;
mod plan;
mod recv_pool;
pub mod region;
pub mod request;
pub mod shard;
pub mod topology;
mod wakeup;
mod worker;

pub mod testing;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use addr::{BackendKind, EngineAddress, GroupAddress, NicAddress, Ordering};
pub use completion::{Callback, DoneFlag, Notify, Pending};
pub use countdown::{Countdown, Countdowns};
pub use domain::{
    Domain, DomainEvent, DomainInfo, DomainMr, OpToken, PeerId, RecvToken, Registration, WriteOp,
};
pub use engine::{EngineBuilder, ImmFuture, TransferEngine};
pub use error::{PeerLoss, Result, TransferError};
pub use group::DomainGroup;
pub use idle::{IdlePolicy, IdleState, Sleep};
pub use memory::{MemoryLocation, MemorySpan, RemoteKey, RemoteNicRegion, RemoteRegion};
pub use peer::{Peer, PeerGroup, RemoteTarget};
pub use region::{HostBuffer, LocalRegion};
pub use request::{
    BarrierRequest, PagedWriteRequest, Pages, Request, ScatterItem, ScatterRequest, SendRequest,
    Slice, WriteRequest,
};
pub use shard::{ShardPolicy, WriteShape};
