//! The crate's single error type.

use std::io;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, RpcError>;

/// Every failure the protocol, validation, server and client can report.
///
/// Each variant names the call or step that failed so that a logged error is
/// enough to find the refused input.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// A socket or file operation failed.
    #[error("{call}: i/o error: {source}")]
    Io {
        /// The call that failed.
        call: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The command byte is not one this side knows (or has enabled).
    #[error("unknown command byte {0}")]
    UnknownCommand(u8),
    /// A message is larger than the configured maximum.
    #[error("{call}: message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// The call that saw the message.
        call: &'static str,
        /// Declared size.
        size: u64,
        /// Configured limit.
        limit: u64,
    },
    /// A payload does not have the layout its command requires.
    #[error("{call}: malformed payload: {reason}")]
    Malformed {
        /// The codec that refused the payload.
        call: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A request is well formed but refused by validation.
    #[error("{call}: refused: {reason}")]
    Refused {
        /// The command or check that refused.
        call: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The peer speaks an incompatible protocol version.
    #[error("{call}: incompatible protocol version {major}.{minor}.{patch}")]
    Version {
        /// The call that negotiated.
        call: &'static str,
        /// Peer major version.
        major: u8,
        /// Peer minor version.
        minor: u8,
        /// Peer patch version.
        patch: u8,
    },
    /// The remote side does not support a protocol extension.
    #[error("{call}: the server does not support the transfer-rpc extension")]
    ExtensionUnsupported {
        /// The call that needed the extension.
        call: &'static str,
    },
    /// The compute backend cannot or will not run the graph.
    #[error("{call}: compute refused: {reason}")]
    Compute {
        /// The command that asked for compute.
        call: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The server answered with a failure code.
    #[error("{call}: the server reported failure")]
    RemoteFailure {
        /// The command that failed.
        call: &'static str,
    },
    /// A pipeline stage failed: names the stage and the server it runs on.
    #[error("pipeline stage {stage} on {server}: {source}")]
    Stage {
        /// Stage index (0 = the stage holding the first layers).
        stage: usize,
        /// The server's endpoint.
        server: String,
        /// What failed.
        #[source]
        source: Box<RpcError>,
    },
}

impl RpcError {
    /// Wraps an I/O error with the name of the failing call.
    pub fn io(call: &'static str, source: io::Error) -> Self {
        RpcError::Io { call, source }
    }

    /// Builds a [`RpcError::Malformed`].
    pub fn malformed(call: &'static str, reason: impl Into<String>) -> Self {
        RpcError::Malformed {
            call,
            reason: reason.into(),
        }
    }

    /// Builds a [`RpcError::Refused`].
    pub fn refused(call: &'static str, reason: impl Into<String>) -> Self {
        RpcError::Refused {
            call,
            reason: reason.into(),
        }
    }
}
