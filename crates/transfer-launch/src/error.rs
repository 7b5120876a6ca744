//! The crate's one error type.

use std::time::Duration;

/// Everything that can stop a launch: a bad environment, a malformed
/// hostlist or frame, a refused or timed-out rendezvous.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No launcher convention matched the environment.
    #[error(
        "no launcher found in the environment: set TRANSFER_RANK, TRANSFER_WORLD_SIZE and \
         TRANSFER_RENDEZVOUS=host:port, or start under srun, mpirun or a torchrun-style \
         launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
    )]
    NoLauncher,
    /// An environment variable is missing or malformed.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A Slurm hostlist could not be expanded.
    #[error("hostlist {input:?}: {reason}")]
    Hostlist {
        /// The hostlist (truncated when long).
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A rendezvous frame was malformed.
    #[error("rendezvous protocol: {0}")]
    Wire(String),
    /// A configured bound was exceeded.
    #[error("{what} {value} exceeds the limit {max}")]
    Limit {
        /// What was too large.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// Rank 0 refused this rank, or the rendezvous failed as a whole.
    #[error("rendezvous refused: {0}")]
    Refused(String),
    /// The job secret did not match, or one side has none.
    #[error("rendezvous authentication: {0}")]
    Auth(String),
    /// One rank broke the rendezvous (left early, disagreed on the world).
    #[error("rank {rank}: {reason}")]
    Rank {
        /// The rank.
        rank: usize,
        /// What it did.
        reason: String,
    },
    /// A deadline passed.
    #[error("{what}: timed out after {:.1} s{detail}", after.as_secs_f64())]
    Timeout {
        /// What was being waited for.
        what: &'static str,
        /// The deadline that passed.
        after: Duration,
        /// Extra context (missing ranks, last error), may be empty.
        detail: String,
    },
    /// A socket call failed.
    #[error("{call}: {source}")]
    Io {
        /// What was being done.
        call: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Shorthand.
pub type Result<T, E = LaunchError> = std::result::Result<T, E>;

/// Wraps an I/O error with the call that failed.
pub(crate) fn io(call: &'static str) -> impl FnOnce(std::io::Error) -> LaunchError {
    move |source| LaunchError::Io { call, source }
}
