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
//! use transfer_efa::{Config, Provider, open_loopback_domains};
//! let domains = open_loopback_domains(&Config::loopback(Provider::Tcp), 2)?;
//! # Ok::<(), transfer_core::TransferError>(())
//! ```
//!
//! [`LibfabricDomain`] implements [`transfer_core::Domain`]; [`raw`] is a
//! pure-libfabric write loop for benchmark baselines.

mod address;
mod av;
mod bounce;
mod config;
mod context;
mod cq;
mod data_path;
mod domain;
mod endpoint;
mod fabric;
mod info;
mod library;
mod mr;
mod ops;
mod peers;
mod provider;
mod queue;
pub mod raw;
mod sys;

pub use address::MAX_RAW_ADDRESS;
pub use config::{Config, DEFAULT_PEER_TIMEOUT, DEFAULT_POST_BATCH};
pub use domain::{
    LibfabricDomain, default_provider, open_domains, open_domains_with, open_loopback_domains,
};
pub use library::{EFA_INSTALLER_LIBRARY, LIBRARY_PATH_ENV, Library};
pub use provider::{PROVIDER_ENV, Provider};
