//! Client configuration, including the `TRANSFER_RPC_*` environment switches.

use std::time::Duration;

use crate::protocol::Limits;

/// Environment variable: `0` forces the hub path for stage-boundary copies.
pub const ENV_P2P: &str = "TRANSFER_RPC_P2P";
/// Environment variable: `1` turns on per-command counters.
pub const ENV_STATS: &str = "TRANSFER_RPC_STATS";
/// Environment variable: `0` reads the answers of posted commands before
/// an ordinary call's request is sent (the order before `early_send`; for
/// A/B runs).
pub const ENV_EARLY_SEND: &str = "TRANSFER_RPC_EARLY_SEND";
/// Environment variable: `0` writes every request at once (no coalescing
/// of commands sent back to back; for A/B runs).
pub const ENV_COALESCE: &str = "TRANSFER_RPC_COALESCE";

/// Client behaviour switches.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Use COPY_TENSOR_TO when the source server supports it.
    pub p2p: bool,
    /// Count commands and bytes.
    pub stats: bool,
    /// Connect timeout (`None` = the OS default).
    pub connect_timeout: Option<Duration>,
    /// Read/write timeout (`None` = block).
    pub io_timeout: Option<Duration>,
    /// Message size limits for responses.
    pub limits: Limits,
    /// Ask the server for the extension right after HELLO, on the same
    /// connection. An upstream server closes the connection on the unknown
    /// command; the client then reconnects (before any state exists) and
    /// remembers that the extension is absent. Upstream's server serves one
    /// connection at a time, so the probe must not use a second connection.
    pub probe_extensions: bool,
    /// Local address to connect from (`None`: the OS chooses). For hosts
    /// with several addresses, and for tests that need distinct client
    /// addresses on loopback (127.0.0.x) to exercise per-address bounds.
    pub source: Option<std::net::IpAddr>,
    /// An ordinary call sends its request before it reads the answers of
    /// commands posted earlier (they still come first: the server answers
    /// in order), instead of after: the request does not wait for those
    /// answers to cross the link ([`Client`](super::Client)'s `call`).
    pub early_send: bool,
    /// Requests without an answer (SET_TENSOR with small data, GRAPH_*,
    /// posted commands) are kept and written together: before an answer is
    /// read, at [`COALESCE_BOUND`](super::connection::COALESCE_BOUND)
    /// bytes, or by [`Client::flush`](super::Client::flush), which the
    /// owner must call before it waits on anything else (another party may
    /// be waiting for a kept command). Off by default; the plugin turns it
    /// on (its worker flushes when no command is queued next).
    pub coalesce: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            p2p: true,
            stats: false,
            connect_timeout: None,
            io_timeout: None,
            limits: Limits::default(),
            probe_extensions: true,
            source: None,
            early_send: true,
            coalesce: false,
        }
    }
}

/// Parses a boolean switch: `0`, `false`, `off`, `no` are false, any other
/// non-empty value true, unset or empty gives `default`.
pub fn parse_flag(value: Option<&str>, default: bool) -> bool {
    match value.map(str::trim) {
        None | Some("") => default,
        Some(v) => !matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        ),
    }
}

impl ClientConfig {
    /// Defaults, with `TRANSFER_RPC_P2P`, `TRANSFER_RPC_STATS`,
    /// `TRANSFER_RPC_EARLY_SEND` and `TRANSFER_RPC_COALESCE` (default on:
    /// a caller of `from_env` flushes, see [`ClientConfig::coalesce`])
    /// applied.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        ClientConfig {
            p2p: parse_flag(var(ENV_P2P).as_deref(), true),
            stats: parse_flag(var(ENV_STATS).as_deref(), false),
            early_send: parse_flag(var(ENV_EARLY_SEND).as_deref(), true),
            coalesce: parse_flag(var(ENV_COALESCE).as_deref(), true),
            ..ClientConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        assert!(parse_flag(None, true));
        assert!(!parse_flag(None, false));
        assert!(!parse_flag(Some("0"), true));
        assert!(!parse_flag(Some("off"), true));
        assert!(parse_flag(Some("1"), false));
        assert!(parse_flag(Some(""), true));
    }
}
