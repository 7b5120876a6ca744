//! # transfer-core
//!
//! The backend-independent TransferEngine: memory registration with
//! serialisable remote descriptors, two-sided messages, one-sided writes
//! with 32-bit immediates, peer groups, receiver-side immediate counters,
//! multi-NIC sharding and the worker threads that own the NICs.
//!
//! Backends implement [`Domain`]; see the `transfer-efa` and
//! `transfer-verbs` crates.
//!
//! # Where to read what
//! Bottom up, one concern per file:
//! - value types: `addr` (addresses), `memory` (descriptors), `region`
//!   (registered memory), `peer`, `request` (what users submit), `error`;
//! - the backend contract: `domain` ([`Domain`], one NIC);
//! - pure planning, no threads: `shard` (how many bytes and pages per NIC,
//!   what receivers count) and `plan` (a request -> per-NIC batches of
//!   writes, with keys, registrations and immediates);
//! - bookkeeping: `countdown` (one operation of many parts, one outcome,
//!   also used by the backends), `group` ([`DomainGroup`]: a worker's NICs,
//!   its peer cache, batches and operations in flight), `imm_counter`
//!   (receiver counters), `recv_pool`;
//! - threads: `job` (what crosses to a worker), `worker` (its queue and
//!   loop), `idle` ([`IdleState`], how polling threads wait), `callbacks`,
//!   `topology`, `spin_wait` (a blocking waiter's short spin); `progress`
//!   ([`ProgressMode`]: worker threads, or the
//!   callers themselves driving the same worker state);
//! - the public API: `engine` ([`TransferEngine`], [`EngineBuilder`]).
//!
//! # Three kinds of group
//! - a **domain group** is the NICs one worker thread owns ([`DomainGroup`],
//!   [`GroupAddress`]); every `group: usize` argument of the engine and
//!   [`LocalRegion::group`] is the index of one;
//! - a **peer group** is a list of remote targets for scatter and barrier
//!   ([`PeerGroup`], [`TransferEngine::add_group`]);
//! - a **pipeline group** exists only in `transfer-rpc` (the servers of one
//!   pipeline stage) and never here.

pub mod addr;
pub mod assist;
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
pub mod progress;
pub mod rawloop;
mod recv_pool;
pub mod region;
pub mod request;
pub mod shard;
pub mod spin_wait;
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
pub use progress::{ProgressHandle, ProgressMode};
pub use region::{HostBuffer, LocalRegion};
pub use request::{
    BarrierRequest, PagedWriteRequest, Pages, Request, ScatterItem, ScatterRequest, SendRequest,
    Slice, WriteRequest,
};
pub use shard::{ShardPolicy, WriteShape};
