//! A ggml backend that unmodified llama.cpp loads (builds made with
//! `GGML_BACKEND_DL=ON`, the layout of llama.cpp's Linux release archives)
//! and that speaks transfer-rpc's client: the ggml-rpc wire to any server,
//! plus this project's extensions to ours.
//!
//! Two ways in, chosen at `ggml_backend_init` from the file name
//! ([`backend::mode`], via `dladdr`):
//! - installed next to the binaries as `libggml-rpc-<variant>.so`: ggml's
//!   loader prefers it to the stock `libggml-rpc.so` (score > 0); it
//!   registers as "RPC" and exports `ggml_backend_rpc_add_server` (and the
//!   older `ggml_backend_rpc_add_device`), so `--rpc a,b` works unchanged;
//!   `ggml_backend_rpc_start_server` is forwarded to the stock library so a
//!   stock `rpc-server` in that directory keeps working;
//! - loaded by `GGML_BACKEND_PATH=/path/libtransfer_ggml_plugin.so`: registry
//!   "TRPC", servers from `TRANSFER_RPC_SERVERS`, devices `TRPC<n>` chosen
//!   with `--device` (or by default, as GPU-type devices).
//!
//! The host's ABI is not stable: [`host`] learns its ggml version and
//! confirms the struct layout on real host objects; an unknown host gets
//! score 0 and NULL from init, with one log line. The plugin never links
//! ggml: every ggml function comes from the host at run time.

pub mod abi;
pub mod backend;
pub mod conn;
pub mod engine;
pub mod error;
pub mod host;
pub mod names;
pub mod serialize;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use abi::{DevT, GgmlReg, LOG_ERROR, LOG_INFO, RegT};
use backend::{guard, mode};

pub use error::{PluginError, Result};

/// Score given to ggml's loader: above 0 so that, installed as
/// `libggml-rpc-<variant>.so`, the plugin wins over the stock library.
pub const SCORE: c_int = 10;

static REFUSAL_LOGGED: OnceLock<()> = OnceLock::new();

fn known_host() -> Option<&'static host::Host> {
    match host::host() {
        Ok(h) => Some(h),
        Err(e) => {
            REFUSAL_LOGGED.get_or_init(|| host::log(LOG_ERROR, &format!("not loading: {e}")));
            None
        }
    }
}

/// ggml's loader entry point: the same registry pointer on every call, or
/// NULL (one log line) for a host whose layout the plugin does not know.
/// No threads, no sockets: servers are contacted on first use.
#[unsafe(no_mangle)]
pub extern "C" fn ggml_backend_init() -> *mut GgmlReg {
    guard(
        "ggml_backend_init",
        std::ptr::null_mut(),
        || match known_host() {
            Some(h) => backend::base_reg(h),
            None => std::ptr::null_mut(),
        },
    )
}

/// ggml's loader asks this before `ggml_backend_init`: 0 for a host the
/// plugin would refuse, so that the loader falls back to the stock library.
#[unsafe(no_mangle)]
pub extern "C" fn ggml_backend_score() -> c_int {
    guard("ggml_backend_score", 0, || {
        if known_host().is_some() { SCORE } else { 0 }
    })
}

fn endpoint_arg(endpoint: *const c_char) -> Option<String> {
    if endpoint.is_null() {
        return None;
    }
    // SAFETY: the host passes a NUL-terminated endpoint string.
    Some(
        unsafe { CStr::from_ptr(endpoint) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// `ggml_backend_rpc_add_server(endpoint)`: the server's registry (same
/// pointer for the same endpoint), NULL with a log line when unreachable.
///
/// # Safety
/// `endpoint` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ggml_backend_rpc_add_server(endpoint: *const c_char) -> RegT {
    guard("ggml_backend_rpc_add_server", std::ptr::null_mut(), || {
        let Some(ep) = endpoint_arg(endpoint) else {
            return std::ptr::null_mut();
        };
        match backend::add_server(&ep) {
            Ok(r) => {
                host::log(LOG_INFO, &format!("server {ep} added"));
                r
            }
            Err(e) => {
                host::log(LOG_ERROR, &format!("add_server {ep}: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

/// The pre-2025-10 proc (`ggml_backend_rpc_add_device`): the server's first
/// device.
///
/// # Safety
/// `endpoint` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ggml_backend_rpc_add_device(endpoint: *const c_char) -> DevT {
    guard("ggml_backend_rpc_add_device", std::ptr::null_mut(), || {
        // SAFETY: the caller's contract, passed on.
        let reg = unsafe { ggml_backend_rpc_add_server(endpoint) };
        if reg.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: our registry, with our interface.
        unsafe {
            match (*reg).iface.get_device {
                Some(f) => f(reg, 0),
                None => std::ptr::null_mut(),
            }
        }
    })
}

type StartServer = unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut DevT);

/// Forwards to the stock `libggml-rpc.so` next to this file, so a stock
/// `rpc-server` that found this plugin as "RPC" still serves.
///
/// # Safety
/// Upstream's contract for `ggml_backend_rpc_start_server`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ggml_backend_rpc_start_server(
    endpoint: *const c_char,
    cache_dir: *const c_char,
    n_threads: usize,
    n_devices: usize,
    devices: *mut DevT,
) {
    guard("ggml_backend_rpc_start_server", (), || {
        let Some(stock) = stock_start_server() else {
            host::log(
                LOG_ERROR,
                "ggml_backend_rpc_start_server: no stock libggml-rpc.so next to the plugin to serve with",
            );
            return;
        };
        // SAFETY: upstream's function with upstream's arguments, unchanged.
        unsafe { stock(endpoint, cache_dir, n_threads, n_devices, devices) }
    })
}

fn stock_start_server() -> Option<StartServer> {
    let me = backend::self_path()?;
    let dir = std::path::Path::new(&me).parent()?;
    let lib =
        std::ffi::CString::new(dir.join("libggml-rpc.so").to_string_lossy().as_bytes()).ok()?;
    // SAFETY: dlopen of upstream's RPC backend library by full path; it is
    // kept loaded (the server runs until the process ends).
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    // SAFETY: a valid handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, c"ggml_backend_rpc_start_server".as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: upstream's exported function of that name and signature.
    Some(unsafe { std::mem::transmute::<*mut c_void, StartServer>(p) })
}

/// Whether this process runs the plugin as "RPC" (`--rpc`) or "TRPC".
pub fn presented_name() -> &'static str {
    match mode() {
        backend::Mode::Rpc => "RPC",
        backend::Mode::Own => "TRPC",
    }
}
