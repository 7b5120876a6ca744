//! # transfer
//!
//! The TransferEngine (from `transfer-core`) with its backends behind cargo
//! features: `libfabric` (default: AWS EFA, tcp, shm, udp), `verbs` (native
//! ibverbs: ConnectX, RoCE, soft-RoCE) and `cuda` (GPU memory). Native
//! libraries are loaded at run time, so nothing native is needed to build;
//! a missing one is a [`BackendError::LibraryMissing`] naming the package to
//! install.
//!
//! ```toml
//! [dependencies]
//! transfer = { path = "…/crates/transfer", features = ["verbs"] }
//! ```
//!
//! ```no_run
//! // EFA when libfabric offers it, else a verbs device that opens, else tcp;
//! // TRANSFER_BACKEND=libfabric|verbs, TRANSFER_PROVIDER=tcp|shm|efa|... and
//! // TRANSFER_VERBS_DEVICE=mlx5_0 override the choice.
//! let engine = transfer::Backend::detect()?.engine()?;
//! println!("{} NIC(s)", engine.address().groups[0].nics.len());
//! # Ok::<(), transfer::BackendError>(())
//! ```
//!
//! Two engines in one process over tcp on loopback, one write with an
//! immediate (runs wherever `libfabric1` is installed):
//!
//! ```
//! use std::time::Duration;
//! use transfer::{Backend, BackendError, WriteRequest, WriteShape};
//!
//! let backend = Backend::libfabric("tcp").loopback();
//! let (a, b) = match (backend.engine(), backend.engine()) {
//!     (Ok(a), Ok(b)) => (a, b),
//!     // No libfabric on this machine: nothing to show.
//!     (Err(BackendError::LibraryMissing { .. }), _) => return Ok(()),
//!     (Err(e), _) | (_, Err(e)) => return Err(e.into()),
//! };
//! let src = a.alloc_host(4096, 0)?;
//! let dst = b.alloc_host(4096, 0)?;
//! src.write_at(0, b"hello")?;
//! let peer = a.peer(&b.address())?;
//! let target = a.remote(&peer, dst.remote().clone())?;
//! a.write(WriteRequest { src: &src, src_offset: 0, dst: &target, dst_offset: 0, len: 5, imm: Some(7) })?
//!     .wait_timeout(Duration::from_secs(10))?;
//! let n = b.expected_imms(&a.address(), 0, 0, WriteShape::Single { len: 5 })?;
//! b.wait_imm(7, n, Duration::from_secs(10))?;
//! let mut got = [0u8; 5];
//! dst.read_at(0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout: `selection` (the detection order and its overrides, pure logic),
//! `probe` (asking the machine), `backend` ([`Backend`]: options, opening,
//! engines), `domains` ([`Domains`], [`AnyDomain`]), `backend_error`.

// Without a backend there is nothing to open: say so at build time rather
// than with an engine that can never start.
#[cfg(not(any(feature = "libfabric", feature = "verbs")))]
compile_error!("the `transfer` crate needs a backend: enable its `libfabric` or `verbs` feature");

mod backend;
mod backend_error;
mod domains;
mod probe;
pub mod selection;

pub use backend::{Backend, BackendConfig};
pub use backend_error::{BackendError, BackendResult, packages_of};
pub use domains::{AnyDomain, Domains};
pub use probe::SystemProbe;
pub use selection::{BackendFamily, Choice, Overrides};

/// The engine API (everything `transfer-core` exports).
pub use transfer_core::*;

/// The whole of `transfer-core`, for paths such as `transfer::core::testing`.
pub use transfer_core as core;

/// The libfabric backend crate (`transfer-efa`).
#[cfg(feature = "libfabric")]
pub use transfer_efa as libfabric;

/// The native ibverbs backend crate (`transfer-verbs`).
#[cfg(feature = "verbs")]
pub use transfer_verbs as verbs;

/// GPU memory and signalling (`transfer-cuda`).
#[cfg(feature = "cuda")]
pub use transfer_cuda as cuda;
