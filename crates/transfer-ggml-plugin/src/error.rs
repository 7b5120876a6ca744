//! The crate's error type.

use transfer_rpc::RpcError;

/// Result alias.
pub type Result<T> = std::result::Result<T, PluginError>;

/// What can fail inside the plugin; every variant names the call.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The host ggml is not one whose layout the plugin knows.
    #[error("host ggml refused: {0}")]
    UnknownHost(String),
    /// A server command failed.
    #[error("{endpoint}: {source}")]
    Rpc {
        /// The server.
        endpoint: String,
        /// What failed.
        #[source]
        source: RpcError,
    },
    /// A server failed earlier; its connection is closed for good.
    #[error("{endpoint}: unusable after an earlier failure: {reason}")]
    Failed {
        /// The server.
        endpoint: String,
        /// The first failure.
        reason: String,
    },
    /// A wait ran past its deadline.
    #[error("{call}: {endpoint} did not answer within {secs} s")]
    Timeout {
        /// The wait.
        call: &'static str,
        /// The server.
        endpoint: String,
        /// The deadline in seconds.
        secs: u64,
    },
    /// A tensor or graph the wire cannot carry.
    #[error("{call}: {reason}")]
    Unsupported {
        /// The call.
        call: &'static str,
        /// Why.
        reason: String,
    },
}
