//! Loads `libibverbs.so.1` at run time and resolves the exported verbs.
//!
//! Nothing here is linked at build time: the crate builds and its pure tests
//! run on machines without rdma-core. The library is opened once per
//! process and never unloaded (providers keep global state).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use transfer_core::TransferError;

use super::types::*;

/// The shared library looked for.
pub const LIBRARY: &str = "libibverbs.so.1";
/// How to install it (Debian/Ubuntu).
pub const INSTALL_HINT: &str = "apt-get install libibverbs1 ibverbs-providers";

/// Function pointers resolved from `libibverbs.so.1`.
///
/// Symbols are resolved by `dlsym`, which picks each symbol's default
/// version (`IBVERBS_1.1`), the one the C headers bind to. `ibv_query_port`
/// and `ibv_reg_mr` are inline wrappers in newer headers; the exported
/// symbols of the same name keep the compatible semantics this crate
/// relies on (`ibv_query_port` fills the `ibv_port_attr` prefix that
/// includes `link_layer`; `ibv_reg_mr` registers `[addr, addr+len)` at iova
/// `addr`).
#[allow(missing_docs)]
pub struct Verbs {
    _lib: libloading::Library,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    /// `_ibv_query_gid_ex` (rdma-core >= 32); `None` on older libraries.
    pub query_gid_ex: Option<
        unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
    >,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    /// `ibv_reg_mr_iova2` (rdma-core >= 24): honours optional access flags
    /// such as relaxed ordering.
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// `ibv_reg_dmabuf_mr` (rdma-core >= 34).
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub create_srq: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub create_ah: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah,
    pub destroy_ah: unsafe extern "C" fn(*mut ibv_ah) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(c_int) -> *const c_char,
    /// The completion-channel verbs; `None` when the library lacks any of
    /// them (workers then park on timers instead of blocking).
    pub channel: Option<ChannelVerbs>,
}

/// `ibv_create_comp_channel`, `ibv_destroy_comp_channel`, `ibv_get_cq_event`
/// and `ibv_ack_cq_events`: what a domain needs to sleep on its CQs.
#[allow(missing_docs)]
pub struct ChannelVerbs {
    pub create: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub get_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack: unsafe extern "C" fn(*mut ibv_cq, c_uint),
}

static VERBS: OnceLock<Result<Verbs, String>> = OnceLock::new();

/// The process-wide verbs library, loaded on first use.
pub fn verbs() -> Result<&'static Verbs, TransferError> {
    match VERBS.get_or_init(load) {
        Ok(v) => Ok(v),
        Err(reason) => Err(TransferError::LibraryMissing {
            library: LIBRARY,
            reason: reason.clone(),
            install_hint: INSTALL_HINT,
        }),
    }
}

/// Whether the library can be loaded (without reporting why not).
pub fn available() -> bool {
    verbs().is_ok()
}

fn load() -> Result<Verbs, String> {
    let name = std::env::var("TRANSFER_VERBS_LIBRARY").unwrap_or_else(|_| LIBRARY.to_string());
    // SAFETY: loading libibverbs runs its constructors, which only set up
    // provider tables; the library is kept loaded for the process lifetime
    // (stored in a static), so no resolved pointer outlives it.
    let lib = unsafe { libloading::Library::new(&name) }.map_err(|e| e.to_string())?;
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is declared with its C prototype from
            // verbs.h (rdma-core 44) in the field type this value is stored in.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{}: {e}", $name))?;
            *s
        }};
    }
    macro_rules! opt_sym {
        ($name:literal) => {{
            // SAFETY: as for `sym!`; absent symbols (older libraries) give None.
            unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .ok()
                .map(|s| *s)
        }};
    }
    // All four or none: blocking waits need every one of them.
    let channel = match (
        opt_sym!("ibv_create_comp_channel"),
        opt_sym!("ibv_destroy_comp_channel"),
        opt_sym!("ibv_get_cq_event"),
        opt_sym!("ibv_ack_cq_events"),
    ) {
        (Some(create), Some(destroy), Some(get_event), Some(ack)) => Some(ChannelVerbs {
            create,
            destroy,
            get_event,
            ack,
        }),
        _ => None,
    };
    Ok(Verbs {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_device: sym!("ibv_query_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        query_gid_ex: opt_sym!("_ibv_query_gid_ex"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        reg_mr_iova2: opt_sym!("ibv_reg_mr_iova2"),
        reg_dmabuf_mr: opt_sym!("ibv_reg_dmabuf_mr"),
        dereg_mr: sym!("ibv_dereg_mr"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        create_srq: sym!("ibv_create_srq"),
        destroy_srq: sym!("ibv_destroy_srq"),
        create_ah: sym!("ibv_create_ah"),
        destroy_ah: sym!("ibv_destroy_ah"),
        wc_status_str: sym!("ibv_wc_status_str"),
        channel,
        _lib: lib,
    })
}

impl Verbs {
    /// `ibv_wc_status_str` as a Rust string.
    pub fn status_str(&self, status: c_int) -> String {
        // SAFETY: ibv_wc_status_str returns a pointer to a static string
        // (or "unknown") for any value.
        let p = unsafe { (self.wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}
