//! # transfer-py
//!
//! The Python package `transfer` over [`transfer_core::TransferEngine`]
//! and the libfabric backend: PyO3, abi3 (CPython 3.11+), built with
//! maturin (`pyproject.toml` beside this crate's `Cargo.toml`).
//!
//! Where to read what: `engine` (the `Engine` class: opening, writes,
//! immediates, messages), `region` (`Region`, `Peer`, `RemoteRegion`), `dlpack`
//! (`__dlpack__` sources: torch CPU tensors),
//! `transfer` (`Transfer`: poll, block, await), `signal` (how completions
//! reach blocked threads and asyncio loops without Python on engine
//! threads), `pages` (page lists from numpy), `error` (exceptions). The
//! Python half is in `python/transfer/` (exception classes, asyncio glue,
//! type stubs); the tests are pytest files in `tests/`.
//!
//! Nothing here is tested by `cargo test` (`test = false`): an extension
//! module cannot run without an interpreter. `cargo xtask test` builds the
//! wheel and runs pytest.

mod dlpack;
mod engine;
mod error;
mod pages;
mod region;
mod signal;
mod transfer;

use pyo3::prelude::*;

/// The native half of the `transfer` package (import `transfer`).
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<region::Region>()?;
    m.add_class::<region::Peer>()?;
    m.add_class::<region::RemoteRegion>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<signal::LoopWaker>()?;
    Ok(())
}
