//! # transfer-efa
//!
//! The libfabric backend of transfer-core: AWS EFA in production, and the
//! `tcp`, `shm`, `udp` and `sockets` providers on machines without RDMA
//! hardware (same FI_EP_RDM + FI_RMA + remote-CQ-data call path).
//!
//! libfabric is loaded at run time (`libfabric.so.1`, see [`Library`]), so
//! building needs no development package and a machine without libfabric
//! gets [`transfer_core::TransferError::LibraryMissing`] instead of a link
//! error.
//!
//! ```no_run
//! use transfer_efa::{LibfabricConfig, Provider, open_loopback_domains};
//! let domains = open_loopback_domains(&LibfabricConfig::loopback(Provider::Tcp), 2)?;
//! # Ok::<(), transfer_core::TransferError>(())
//! ```
//!
//! [`LibfabricDomain`] implements [`transfer_core::Domain`]; benchmark
//! baselines run `transfer_core::rawloop` on it (one raw loop for every
//! backend and every user).
//!
//! Layout, one concern per file; the files shared with transfer-verbs
//! carry the same names: `config` ([`LibfabricConfig`]), `devinfo`
//! (`fi_getinfo` discovery), `domain/mod.rs` (the struct, opening, `impl
//! Domain`), `domain/data_path.rs` (posting, per-peer queues, completions),
//! `domain/connection.rs` (connection errors, peer death, timeouts), `peer`
//! (resolved peers), `sys` (FFI). libfabric's own: `library` (loading),
//! `fabric`/`endpoint`/`cq`/`av`/`mr` (one object each; verbs keeps its
//! objects in `resources`), `address` (wire address; verbs: `handshake`),
//! `context` (operation contexts), `ops` (calls in flight), `queue`
//! (work waiting to be posted), `gate` (immediates held until the writes
//! before them were delivered, which makes tcp and shm domains in order),
//! `posting` (consecutive writes merged into one multi-segment
//! `fi_writemsg`), `bounce` (registered send slots), `provider` (names).

mod address;
mod av;
mod bounce;
mod config;
mod context;
mod cq;
mod devinfo;
mod domain;
mod doorbell;
mod endpoint;
mod fabric;
mod gate;
mod library;
mod mr;
mod ops;
mod peer;
mod posting;
mod provider;
mod queue;
mod sys;

pub use address::MAX_RAW_ADDRESS;
pub use config::{DEFAULT_PEER_TIMEOUT, DEFAULT_POST_BATCH, LibfabricConfig};

/// The earlier name of [`LibfabricConfig`] (now named like
/// `transfer_verbs::VerbsConfig`), kept so that dependents still compile.
pub type Config = LibfabricConfig;
pub use domain::{
    LibfabricDomain, default_provider, open_domains, open_domains_with, open_loopback_domains,
};
pub use library::{EFA_INSTALLER_LIBRARY, LIBRARY_PATH_ENV, Library};
pub use provider::{PROVIDER_ENV, Provider};
