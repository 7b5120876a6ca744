//! The crate's one error type.
//!
//! Every error names the call (or the backend operation) that failed, is
//! `Clone` so one failure can be delivered to every notification that
//! depends on it, and is `Send + Sync` so it crosses from worker threads to
//! API threads and callback threads. It is `#[non_exhaustive]` (as rustls'
//! `Error`): new kinds may come without breaking callers. What a caller
//! branches on is typed (the variant, [`PeerLoss`], codes and limits); the
//! `reason`/`message` strings are for people.

use crate::addr::BackendKind;

/// Everything that can go wrong in the engine or in a backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// The peer cannot be reached; `cause` says whether trying again may help.
    #[error("{call}: peer unreachable ({cause}): {reason}")]
    PeerUnreachable {
        /// The call that addressed the peer.
        call: &'static str,
        /// Why, as a caller branches on it.
        cause: PeerLoss,
        /// Details, as precise as the backend can tell.
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

/// Why a peer cannot be reached, and so what a caller may do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerLoss {
    /// This side forgot the peer (removed, or never resolved on this NIC):
    /// resolve it again ([`crate::TransferEngine::peer`]).
    Forgotten,
    /// The peer closed its side (it shut down or said goodbye): a restarted
    /// peer must be resolved afresh.
    Closed,
    /// The connection broke and is being set up again: a later attempt may
    /// succeed as is.
    Reconnecting,
    /// The peer stopped answering (connection errors, no progress within
    /// the timeout): operations to it fail fast until it is resolved again.
    Dead,
}

impl std::fmt::Display for PeerLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerLoss::Forgotten => "forgotten",
            PeerLoss::Closed => "closed",
            PeerLoss::Reconnecting => "reconnecting",
            PeerLoss::Dead => "dead",
        })
    }
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

    /// Builds [`TransferError::PeerUnreachable`].
    pub fn unreachable(call: &'static str, cause: PeerLoss, reason: impl Into<String>) -> Self {
        Self::PeerUnreachable {
            call,
            cause,
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
