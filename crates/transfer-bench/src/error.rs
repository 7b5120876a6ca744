//! The bench's error type.

use transfer_core::TransferError;

/// Everything that can stop a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The engine or a backend failed.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// Choosing or opening the backend failed.
    #[error(transparent)]
    Backend(#[from] transfer::BackendError),
    /// The side channel or a file failed.
    #[error("{call}: {source}")]
    Io {
        /// What was being done.
        call: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A peer answered something unexpected.
    #[error("{call}: protocol error: {reason}")]
    Protocol {
        /// The exchange that failed.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Moved data did not match what was sent.
    #[error("verification failed in {sweep}: {detail}")]
    Verify {
        /// The sweep whose data was wrong.
        sweep: String,
        /// What differed.
        detail: String,
    },
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
}

/// Shorthand.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Wraps an I/O error with the call that failed.
pub fn io(call: &'static str) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Io { call, source }
}

/// A protocol error.
pub fn protocol(call: &'static str, reason: impl Into<String>) -> BenchError {
    BenchError::Protocol {
        call,
        reason: reason.into(),
    }
}
