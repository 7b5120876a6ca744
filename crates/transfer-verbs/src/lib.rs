//! ibverbs backend (ConnectX, RoCE, soft-RoCE) for transfer-core.
//!
//! [`VerbsDomain`] implements [`transfer_core::Domain`] over libibverbs,
//! loaded at run time (`libibverbs.so.1`; no build-time dependency, a
//! missing library is [`transfer_core::TransferError::LibraryMissing`]).
//!
//! Layout, one concern per file: `sys` (FFI), `resources` (owned verbs
//! objects), `devinfo` (discovery, GID/port selection), `config`,
//! `handshake` (wire formats), `qp` (state transitions), `ud` (handshake
//! endpoint), `rdma_op` (work requests and chains), `peer` (connection
//! state), `error` (error mapping), `domain` (the `Domain`).

pub mod config;
pub mod devinfo;
pub mod domain;
pub mod error;
pub mod handshake;
mod peer;
mod qp;
pub mod rdma_op;
mod resources;
#[doc(hidden)]
pub mod sys;
mod trace;
mod ud;

pub use config::VerbsConfig;
pub use domain::VerbsDomain;

/// Whether `libibverbs.so.1` can be loaded in this process.
pub fn library_available() -> bool {
    sys::available()
}

/// Names of the verbs devices present (loads the library).
pub fn devices() -> transfer_core::Result<Vec<String>> {
    devinfo::list_devices()
}
