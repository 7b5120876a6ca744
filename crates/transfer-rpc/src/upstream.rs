//! ggml's own RPC server (upstream's `rpc-server`), compiled from the ggml
//! this crate computes with (`GGML_RPC=ON`): what our server is measured
//! and tested against, with no difference of ggml version between the two.

use std::ffi::CString;
use std::os::raw::c_char;

use llama_cpp_sys_2 as sys;

use crate::error::{Result, RpcError};

unsafe extern "C" {
    fn ggml_backend_rpc_start_server(
        endpoint: *const c_char,
        cache_dir: *const c_char,
        n_threads: usize,
        n_devices: usize,
        devices: *mut sys::ggml_backend_dev_t,
    );
}

/// Serves ggml's RPC protocol on `endpoint` (`HOST:PORT`) with the CPU
/// device and `threads` compute threads, without a tensor cache. Blocks
/// for as long as ggml's server runs (until the process ends); returns
/// only with an error.
pub fn serve(endpoint: &str, threads: usize) -> Result<()> {
    let refused = |why: &str| RpcError::refused("upstream::serve", why.to_string());
    if threads == 0 {
        return Err(refused("threads must be at least 1"));
    }
    let endpoint = CString::new(endpoint).map_err(|_| refused("the endpoint holds a NUL byte"))?;
    // SAFETY: a lookup in ggml's registry of built-in devices; no argument.
    let mut dev = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if dev.is_null() {
        return Err(refused("ggml has no CPU device"));
    }
    // SAFETY: `endpoint` outlives the call (it serves until the process
    // ends); `dev` is one valid CPU device, matching n_devices = 1; a null
    // cache directory turns the cache off.
    unsafe {
        ggml_backend_rpc_start_server(endpoint.as_ptr(), std::ptr::null(), threads, 1, &mut dev);
    }
    Err(refused("ggml's server returned (it could not listen?)"))
}
