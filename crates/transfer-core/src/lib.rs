//! # transfer-core
//!
//! The backend-independent TransferEngine: memory registration with
//! serialisable remote descriptors, two-sided messages, one-sided writes
//! with 32-bit immediates, peer groups, receiver-side immediate counters,
//! multi-NIC sharding and the worker threads that own the NICs.
//!
//! Backends implement [`Domain`]; see the `transfer-efa` and
//! `transfer-verbs` crates.

pub mod addr;
pub mod domain;
pub mod error;
pub mod memory;

pub use addr::{BackendKind, EngineAddress, GroupAddress, NicAddress, Ordering};
pub use domain::{
    Domain, DomainEvent, DomainInfo, DomainMr, OpToken, PeerId, RecvToken, Registration, WriteOp,
};
pub use error::{Result, TransferError};
pub use memory::{MemoryLocation, MemorySpan, RemoteKey, RemoteNicRegion, RemoteRegion};
