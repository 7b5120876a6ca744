//! Mapping verbs failures (errno values, work-completion statuses) to
//! [`TransferError`]. Pure functions: testable without a device.

use transfer_core::{BackendKind, PeerLoss, TransferError};

/// `enum ibv_wc_status` values this crate distinguishes.
pub mod status {
    /// IBV_WC_SUCCESS
    pub const SUCCESS: i32 = 0;
    /// IBV_WC_LOC_LEN_ERR
    pub const LOC_LEN_ERR: i32 = 1;
    /// IBV_WC_LOC_QP_OP_ERR
    pub const LOC_QP_OP_ERR: i32 = 2;
    /// IBV_WC_LOC_PROT_ERR
    pub const LOC_PROT_ERR: i32 = 4;
    /// IBV_WC_WR_FLUSH_ERR
    pub const WR_FLUSH_ERR: i32 = 5;
    /// IBV_WC_BAD_RESP_ERR
    pub const BAD_RESP_ERR: i32 = 7;
    /// IBV_WC_LOC_ACCESS_ERR
    pub const LOC_ACCESS_ERR: i32 = 8;
    /// IBV_WC_REM_INV_REQ_ERR
    pub const REM_INV_REQ_ERR: i32 = 9;
    /// IBV_WC_REM_ACCESS_ERR
    pub const REM_ACCESS_ERR: i32 = 10;
    /// IBV_WC_REM_OP_ERR
    pub const REM_OP_ERR: i32 = 11;
    /// IBV_WC_RETRY_EXC_ERR
    pub const RETRY_EXC_ERR: i32 = 12;
    /// IBV_WC_RNR_RETRY_EXC_ERR
    pub const RNR_RETRY_EXC_ERR: i32 = 13;
    /// IBV_WC_REM_ABORT_ERR
    pub const REM_ABORT_ERR: i32 = 16;
    /// IBV_WC_FATAL_ERR
    pub const FATAL_ERR: i32 = 19;
    /// IBV_WC_RESP_TIMEOUT_ERR
    pub const RESP_TIMEOUT_ERR: i32 = 20;
    /// IBV_WC_GENERAL_ERR
    pub const GENERAL_ERR: i32 = 21;
}

/// The name of a work-completion status (as `ibv_wc_status_str` words it,
/// without needing the library).
pub fn wc_status_name(s: i32) -> &'static str {
    match s {
        0 => "success",
        1 => "local length error",
        2 => "local QP operation error",
        3 => "local EE context operation error",
        4 => "local protection error",
        5 => "Work Request Flushed Error",
        6 => "memory bind operation error",
        7 => "bad response error",
        8 => "local access error",
        9 => "remote invalid request error",
        10 => "remote access error",
        11 => "remote operation error",
        12 => "transport retry counter exceeded",
        13 => "RNR retry counter exceeded",
        14 => "local RDD violation error",
        15 => "remote invalid RD request",
        16 => "aborted error",
        17 => "invalid EE context number",
        18 => "invalid EE context state",
        19 => "fatal error",
        20 => "response timeout error",
        21 => "general error",
        _ => "unknown",
    }
}

/// What an error completion means for the connection it arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnFate {
    /// The peer cannot be reached (transport / RNR retries exhausted, fatal):
    /// mark it dead; later operations fail fast until it says hello again.
    Dead,
    /// The connection is unusable (RC QPs enter the error state on any
    /// error) but the peer is alive: reconnect and keep serving it.
    Reconnect,
}

/// The fate of a connection after an error completion with `status`.
pub fn wc_fate(status: i32) -> ConnFate {
    match status {
        status::RETRY_EXC_ERR
        | status::RNR_RETRY_EXC_ERR
        | status::FATAL_ERR
        | status::RESP_TIMEOUT_ERR => ConnFate::Dead,
        _ => ConnFate::Reconnect,
    }
}

/// Maps an error completion to the error the caller sees.
pub fn wc_error(call: &'static str, status: i32, vendor_err: u32) -> TransferError {
    let name = wc_status_name(status);
    match status {
        status::REM_ACCESS_ERR => TransferError::RemoteAccess {
            call,
            reason: format!(
                "{name} (wrong remote key or address range; vendor error {vendor_err:#x})"
            ),
        },
        status::REM_INV_REQ_ERR => TransferError::RemoteAccess {
            call,
            reason: format!(
                "{name} (request refused by the responder, e.g. message longer than its receive buffer; vendor error {vendor_err:#x})"
            ),
        },
        status::RETRY_EXC_ERR | status::RNR_RETRY_EXC_ERR | status::RESP_TIMEOUT_ERR => {
            TransferError::PeerUnreachable {
                call,
                cause: PeerLoss::Dead,
                reason: format!("{name} (vendor error {vendor_err:#x})"),
            }
        }
        status::WR_FLUSH_ERR => TransferError::PeerUnreachable {
            call,
            cause: PeerLoss::Reconnecting,
            reason: "connection failed before this request was executed (flushed)".into(),
        },
        _ => TransferError::Backend {
            call,
            backend: BackendKind::Verbs,
            code: status,
            message: format!("{name} (vendor error {vendor_err:#x})"),
        },
    }
}

/// Maps an errno-style failure of a verbs call (`ibv_*` returning NULL with
/// errno, or a positive return value) to a backend error.
pub fn errno_error(call: &'static str, errno: i32) -> TransferError {
    TransferError::Backend {
        call,
        backend: BackendKind::Verbs,
        code: errno,
        message: std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

/// Whether a post failure is backpressure (queue full): retry later.
pub fn post_is_backpressure(ret: i32) -> bool {
    ret == libc::ENOMEM || ret == -libc::ENOMEM || ret == libc::EAGAIN
}

/// The errno left by the last failed call (0 if none).
pub fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
