//! ibverbs backend (ConnectX, RoCE, soft-RoCE) for transfer-core.
//!
//! [`VerbsDomain`] implements [`transfer_core::Domain`] over libibverbs,
//! loaded at run time (`libibverbs.so.1`; no build-time dependency, a
//! missing library is [`transfer_core::TransferError::LibraryMissing`]).
//!
//! Layout, one concern per file; the files shared with transfer-efa carry
//! the same names: `config` ([`VerbsConfig`]), `devinfo` (discovery,
//! GID/port selection), `domain/mod.rs` (the struct, opening, `impl
//! Domain`), `domain/data_path.rs` (queueing, posting chains, completions),
//! `domain/connection.rs` (QPs, handshake applied, reconnection), `peer`
//! (connection state), `sys` (FFI). Verbs' own: `resources` (owned verbs
//! objects), `handshake` (wire formats), `qp` (state transitions), `ud`
//! (handshake endpoint), `rdma_op` (work requests and chains), `error`
//! (error mapping).

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
