//! The crate's one error type.
//!
//! Every failure is a value: a machine without a CUDA driver, a driver too
//! old for a call, a device without dma-buf support or a missing GDRCopy
//! library are all reported here, never as a panic. Errors are `Clone` so
//! that the result of loading the driver once can be handed to every caller.

use transfer_core::TransferError;

/// Everything that can go wrong in transfer-cuda.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so.1` could not be loaded (no NVIDIA driver on this machine).
    #[error("CUDA driver library not found: {reason}")]
    DriverNotFound {
        /// What the dynamic loader said.
        reason: String,
    },
    /// The driver library lacks a required entry point (driver too old).
    #[error("CUDA driver lacks the symbol {symbol} (driver too old?)")]
    MissingSymbol {
        /// The entry point.
        symbol: &'static str,
    },
    /// A driver call returned an error code.
    #[error("{call} failed: {name} ({code})")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The `CUresult` code.
        code: i32,
        /// The code's name as the driver reports it (`CUDA_ERROR_...`).
        name: String,
    },
    /// The driver works but there is no such device.
    #[error("no CUDA device {ordinal} ({count} device(s) present)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// How many devices the driver reports.
        count: u32,
    },
    /// The device, driver or kernel cannot do what was asked.
    #[error("{call}: not supported: {reason}")]
    Unsupported {
        /// The call that needed the feature.
        call: &'static str,
        /// Why it is unavailable.
        reason: String,
    },
    /// An argument was refused before anything was done.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The refused call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Memory could not be allocated.
    #[error("{call}: out of memory: {reason}")]
    OutOfMemory {
        /// The allocating call.
        call: &'static str,
        /// Details.
        reason: String,
    },
    /// GDRCopy is not usable on this machine (no `/dev/gdrdrv`, no
    /// `libgdrapi.so.2`, or `gdr_open` failed).
    #[error("GDRCopy unavailable: {reason}")]
    GdrUnavailable {
        /// Why.
        reason: String,
    },
    /// A GDRCopy call returned an error code.
    #[error("{call} failed with code {code}")]
    Gdr {
        /// The libgdrapi call.
        call: &'static str,
        /// Its return value.
        code: i32,
    },
    /// The watcher thread has stopped (or could not be started).
    #[error("watcher: {reason}")]
    Watcher {
        /// What happened.
        reason: String,
    },
    /// An engine call failed.
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

impl CudaError {
    /// Builds [`CudaError::InvalidArgument`].
    pub fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }

    /// Builds [`CudaError::Unsupported`].
    pub fn unsupported(call: &'static str, reason: impl Into<String>) -> Self {
        Self::Unsupported {
            call,
            reason: reason.into(),
        }
    }

    /// Whether this error means "no usable GPU here" (no driver, driver
    /// too old, no device): what GPU tests and examples treat as a skip.
    pub fn is_no_gpu(&self) -> bool {
        match self {
            Self::DriverNotFound { .. } | Self::MissingSymbol { .. } | Self::NoDevice { .. } => {
                true
            }
            // CUDA_ERROR_NO_DEVICE (100), CUDA_ERROR_STUB_LIBRARY (34),
            // CUDA_ERROR_INSUFFICIENT_DRIVER (35), CUDA_ERROR_NOT_INITIALIZED (3)
            // from cuInit all mean the same to a caller.
            Self::Driver { call, code, .. } => *call == "cuInit" || matches!(*code, 100 | 34 | 35),
            _ => false,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
