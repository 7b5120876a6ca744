//! Configuration of a [`crate::VerbsDomain`]: what to open and how to tune
//! it. Nothing that differs between clusters is hard-coded: device, port
//! and GID index are discovered, overridable by environment
//! (`TRANSFER_VERBS_DEVICE`, `TRANSFER_VERBS_PORT`,
//! `TRANSFER_VERBS_GID_INDEX`) and by the builder methods (which win).

use std::time::Duration;

/// Environment variable naming the device (e.g. `mlx5_0`, `rxe0`).
pub const ENV_DEVICE: &str = "TRANSFER_VERBS_DEVICE";
/// Environment variable naming the port (1-based).
pub const ENV_PORT: &str = "TRANSFER_VERBS_PORT";
/// Environment variable naming the GID index.
pub const ENV_GID_INDEX: &str = "TRANSFER_VERBS_GID_INDEX";

/// Tunables of one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name; `None` picks the first device with an active port.
    pub device: Option<String>,
    /// Port number (1-based); `None` picks the first active port.
    pub port: Option<u8>,
    /// GID index; `None` selects one (see [`crate::devinfo::select_gid`]).
    pub gid_index: Option<u32>,
    /// Work requests per doorbell (`ibv_post_send` call). fabric-lib
    /// measured no gain above 4.
    pub chain_len: usize,
    /// At most this many unsignalled work requests in a row per QP.
    pub signal_interval: usize,
    /// Send-queue depth of each RC QP.
    pub sq_depth: u32,
    /// Depth of the completion queue shared by every RC QP and both SRQs.
    pub cq_depth: u32,
    /// Zero-length receives kept posted on the write-with-immediate SRQ.
    pub rma_srq_depth: u32,
    /// Capacity of the message SRQ (receive buffers come from the engine).
    pub msg_srq_depth: u32,
    /// Registered bounce slots for outgoing messages (larger messages, or
    /// bursts beyond the slots, are registered on the fly).
    pub send_slots: usize,
    /// Size of one bounce slot in bytes.
    pub send_slot_size: usize,
    /// First handshake retransmission interval (doubles up to 1 s).
    pub handshake_retry: Duration,
    /// Give up on a handshake after this long.
    pub handshake_timeout: Duration,
    /// RC local ACK timeout exponent (4.096 µs * 2^timeout).
    pub rc_timeout: u8,
    /// RC transport retries (0..=6). Not 7: soft-RoCE (rdma_rxe) treats 7
    /// as "retry forever", so a dead peer would never be detected.
    pub rc_retry_cnt: u8,
    /// RC RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code the receiver advertises.
    pub min_rnr_timer: u8,
    /// Service level.
    pub service_level: u8,
    /// Traffic class (DSCP << 2 on RoCE).
    pub traffic_class: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Register memory with `IBV_ACCESS_RELAXED_ORDERING` (an optional
    /// flag: ignored where unsupported).
    pub relaxed_ordering: bool,
    /// Create the RC QPs in a thread domain (parent domain) when the
    /// provider supports it (mlx5 does; soft-RoCE does not): the worker
    /// thread owns them, so the provider can skip its locks.
    pub thread_domain: bool,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            device: None,
            port: None,
            gid_index: None,
            chain_len: 4,
            signal_interval: 16,
            sq_depth: 256,
            cq_depth: 16384,
            rma_srq_depth: 1024,
            msg_srq_depth: 1024,
            send_slots: 256,
            send_slot_size: 8192,
            handshake_retry: Duration::from_millis(20),
            handshake_timeout: Duration::from_secs(10),
            rc_timeout: 16,
            rc_retry_cnt: 6,
            rnr_retry: 7,
            min_rnr_timer: 12,
            service_level: 0,
            traffic_class: 0,
            pkey_index: 0,
            relaxed_ordering: true,
            thread_domain: true,
        }
    }
}

impl VerbsConfig {
    /// Defaults with environment overrides applied.
    pub fn from_env() -> Self {
        let mut c = Self::default();
        c.apply_env(|k| std::env::var(k).ok());
        c
    }

    /// Applies overrides read through `get` (testable without touching the
    /// process environment). Unparsable values are ignored.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) {
        if let Some(d) = get(ENV_DEVICE).filter(|s| !s.is_empty()) {
            self.device = Some(d);
        }
        if let Some(p) = get(ENV_PORT).and_then(|s| s.trim().parse().ok()) {
            self.port = Some(p);
        }
        if let Some(g) = get(ENV_GID_INDEX).and_then(|s| s.trim().parse().ok()) {
            self.gid_index = Some(g);
        }
    }

    /// Selects the device.
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }

    /// Selects the port.
    pub fn port(mut self, port: u8) -> Self {
        self.port = Some(port);
        self
    }

    /// Selects the GID index.
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Work requests per doorbell (at least 1).
    pub fn chain_len(mut self, n: usize) -> Self {
        self.chain_len = n.max(1);
        self
    }

    /// Longest run of unsignalled work requests (at least 1).
    pub fn signal_interval(mut self, n: usize) -> Self {
        self.signal_interval = n.max(1);
        self
    }

    /// Handshake give-up time.
    pub fn handshake_timeout(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self
    }
}
