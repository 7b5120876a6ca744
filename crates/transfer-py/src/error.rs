//! `TransferError` -> Python exceptions.
//!
//! The exception classes live in Python (`transfer/_errors.py`) so that
//! they can derive from the matching built-ins (`TimeoutError`,
//! `ConnectionError`, `ValueError`) and be pickled; the Rust side builds an
//! instance and sets the typed fields (`kind`, `call`, `cause`, `code`).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use transfer_core::TransferError;

/// Where the exception classes are defined.
const ERRORS_MODULE: &str = "transfer._errors";

/// The Python exception class and the `kind` string of an error.
fn classify(e: &TransferError) -> (&'static str, &'static str) {
    match e {
        TransferError::InvalidArgument { call, .. } if *call == crate::transfer::CANCEL_CALL => {
            ("TransferError", "cancelled")
        }
        TransferError::Timeout { .. } => ("TransferTimeout", "timeout"),
        TransferError::PeerUnreachable { .. } => ("PeerUnreachable", "peer_unreachable"),
        TransferError::InvalidArgument { .. } => ("InvalidArgument", "invalid_argument"),
        TransferError::Malformed { .. } => ("InvalidArgument", "malformed"),
        TransferError::BackendMismatch { .. } => ("InvalidArgument", "backend_mismatch"),
        TransferError::Shutdown { .. } => ("EngineShutdown", "shutdown"),
        TransferError::RegionBusy { .. } => ("TransferError", "region_busy"),
        TransferError::RegionUnregistered { .. } => ("TransferError", "region_unregistered"),
        TransferError::Backend { .. } => ("TransferError", "backend"),
        TransferError::LibraryMissing { .. } => ("TransferError", "library_missing"),
        TransferError::RemoteAccess { .. } => ("TransferError", "remote_access"),
        _ => ("TransferError", "other"),
    }
}

/// The call an error names, if any.
fn call_of(e: &TransferError) -> Option<&'static str> {
    match e {
        TransferError::Timeout { call, .. }
        | TransferError::PeerUnreachable { call, .. }
        | TransferError::InvalidArgument { call, .. }
        | TransferError::Malformed { call, .. }
        | TransferError::BackendMismatch { call, .. }
        | TransferError::Shutdown { call }
        | TransferError::RegionUnregistered { call }
        | TransferError::Backend { call, .. }
        | TransferError::RemoteAccess { call, .. } => Some(call),
        _ => None,
    }
}

/// Builds the Python exception for `e`.
pub(crate) fn to_py(py: Python<'_>, e: &TransferError) -> PyErr {
    match build(py, e) {
        Ok(err) => err,
        // The package is incomplete (e.g. the bare native module was
        // imported): still raise, with the message.
        Err(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

fn build(py: Python<'_>, e: &TransferError) -> PyResult<PyErr> {
    let (class, kind) = classify(e);
    let cls = py.import(ERRORS_MODULE)?.getattr(class)?;
    let exc = cls.call1((e.to_string(),))?;
    exc.setattr("kind", kind)?;
    exc.setattr("call", call_of(e))?;
    let cause = match e {
        TransferError::PeerUnreachable { cause, .. } => Some(cause.to_string()),
        _ => None,
    };
    exc.setattr("cause", cause)?;
    let code = match e {
        TransferError::Backend { code, .. } => Some(*code),
        _ => None,
    };
    exc.setattr("code", code)?;
    Ok(PyErr::from_value(exc))
}

/// Converts engine results for Python: `.map_err(py_err)`.
pub(crate) fn py_err(e: TransferError) -> PyErr {
    Python::attach(|py| to_py(py, &e))
}

/// An [`InvalidArgument`](TransferError::InvalidArgument) raised from the bindings themselves.
pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> PyErr {
    py_err(TransferError::invalid(call, reason))
}

/// Extension to convert engine results in one call.
pub(crate) trait IntoPy<T> {
    /// The result with a Python exception in place of the engine error.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, TransferError> {
    fn py(self) -> PyResult<T> {
        self.map_err(py_err)
    }
}
