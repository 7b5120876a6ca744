//! The crate's one error type.
//!
//! Every error names the call (or the backend operation) that failed, is
//! `Clone` so one failure can be delivered to every notification that
//! depends on it, and is `Send + Sync` so it crosses from worker threads to
//! API threads and callback threads.

use crate::addr::BackendKind;

/// Everything that can go wrong in the engine or in a backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// An address or descriptor was built by another backend.
    #[error("{call}: backend mismatch (expected {expected}, got {got})")]
    BackendMismatch {
        /// The call that was refused.
        call: &'static str,
        /// The backend of this engine.
        expected: BackendKind,
        /// The backend that built the foreign value.
        got: BackendKind,
    },
    /// Bytes from the wire could not be decoded.
    #[error("{call}: malformed input: {reason}")]
    Malformed {
        /// The decoding call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// An argument was refused before anything was submitted.
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The refused call.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A region is still used by transfers in flight.
    #[error("unregister: region still has {in_flight} transfer(s) in flight")]
    RegionBusy {
        /// Number of transfers still referencing the region.
        in_flight: usize,
    },
    /// The region was unregistered before this use.
    #[error("{call}: region was unregistered")]
    RegionUnregistered {
        /// The call that used the region.
        call: &'static str,
    },
    /// The peer is known to be dead; operations to it fail fast.
    #[error("{call}: peer unreachable: {reason}")]
    PeerUnreachable {
        /// The call that addressed the peer.
        call: &'static str,
        /// Why the peer is considered unreachable.
        reason: String,
    },
    /// The operation did not complete in time.
    #[error("{call}: timed out after {millis} ms")]
    Timeout {
        /// The call that timed out.
        call: &'static str,
        /// The limit that was exceeded.
        millis: u64,
    },
    /// The engine shut down before the operation completed.
    #[error("{call}: engine shut down")]
    Shutdown {
        /// The call that was cut short.
        call: &'static str,
    },
    /// A backend (provider / device) call failed.
    #[error("{call}: {backend} error {code}: {message}")]
    Backend {
        /// The backend call that failed (e.g. `fi_writemsg`, `ibv_post_send`).
        call: &'static str,
        /// Which backend reported it.
        backend: BackendKind,
        /// The provider's numeric code (errno-style, positive), 0 if none.
        code: i32,
        /// The provider's own message.
        message: String,
    },
    /// A native library could not be loaded.
    #[error("{library} could not be loaded ({reason}); install it with: {install_hint}")]
    LibraryMissing {
        /// The shared library that was looked for.
        library: &'static str,
        /// The loader's message.
        reason: String,
        /// The command that installs it.
        install_hint: &'static str,
    },
    /// The remote side refused the access (wrong key, out-of-range address).
    #[error("{call}: remote access error: {reason}")]
    RemoteAccess {
        /// The call that was refused remotely.
        call: &'static str,
        /// The reason, as precise as the backend can tell.
        reason: String,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;

impl TransferError {
    /// Builds [`TransferError::InvalidArgument`].
    pub fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }

    /// Builds [`TransferError::Malformed`].
    pub fn malformed(call: &'static str, reason: impl Into<String>) -> Self {
        Self::Malformed {
            call,
            reason: reason.into(),
        }
    }
}
