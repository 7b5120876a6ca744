//! The extended verbs reached through `struct verbs_context`, the block of
//! function pointers rdma-core places *before* `struct ibv_context` (it
//! grows downwards; `sz`, the size the library built, sits right before the
//! context). `verbs.h` reaches them with `verbs_get_ctx_op()`; so does this
//! module, with the distances taken from rdma-core 44's header (stable by
//! design: new ops are added at the far end). Only thread domains and
//! parent domains are used.

use std::ffi::{c_int, c_void};

use super::types::{ibv_context, ibv_pd};

/// Opaque `struct ibv_td`.
#[repr(C)]
pub struct ibv_td {
    _opaque: [u8; 0],
}

/// `struct ibv_td_init_attr`.
#[repr(C)]
#[derive(Default)]
pub struct ibv_td_init_attr {
    /// No optional fields.
    pub comp_mask: u32,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    /// The protection domain.
    pub pd: *mut ibv_pd,
    /// The thread domain.
    pub td: *mut ibv_td,
    /// No optional fields.
    pub comp_mask: u32,
    /// Custom allocator (unused: NULL).
    pub alloc: *mut c_void,
    /// Custom free (unused: NULL).
    pub free: *mut c_void,
    /// Allocator context (unused).
    pub pd_context: *mut c_void,
}

/// `ibv_alloc_td` as the provider implements it.
pub type AllocTdFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td;
/// `ibv_dealloc_td`.
pub type DeallocTdFn = unsafe extern "C" fn(*mut ibv_td) -> c_int;
/// `ibv_alloc_parent_domain`.
pub type AllocParentDomainFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;

/// Bytes from each op to the start of `struct ibv_context` (rdma-core 44).
const ALLOC_TD_BEFORE: usize = 192;
const DEALLOC_TD_BEFORE: usize = 200;
const ALLOC_PARENT_DOMAIN_BEFORE: usize = 208;
const SZ_BEFORE: usize = 8;

/// The thread-domain entry points of a context, when its provider has them.
#[derive(Clone, Copy)]
pub struct ThreadDomainOps {
    /// `alloc_td`.
    pub alloc_td: AllocTdFn,
    /// `dealloc_td`.
    pub dealloc_td: DeallocTdFn,
    /// `alloc_parent_domain`.
    pub alloc_parent_domain: AllocParentDomainFn,
}

/// Looks the ops up as `verbs_get_ctx_op()` does: the context must be an
/// extended one (`abi_compat == UINTPTR_MAX`), the library's `sz` must
/// cover the op, and the provider must have set it.
///
/// # Safety
/// `ctx` is a live context returned by `ibv_open_device`.
pub unsafe fn thread_domain_ops(ctx: *mut ibv_context) -> Option<ThreadDomainOps> {
    // SAFETY: caller guarantees a live context.
    let compat = unsafe { (*ctx).abi_compat } as usize;
    if compat != usize::MAX {
        return None;
    }
    let base = ctx.cast::<u8>();
    // SAFETY: extended contexts are embedded at the end of a verbs_context
    // whose `sz` field immediately precedes them.
    let sz = unsafe { base.sub(SZ_BEFORE).cast::<usize>().read_unaligned() };
    let ctx_size = std::mem::size_of::<ibv_context>();
    let get = |before: usize| -> Option<*mut c_void> {
        if sz < before + ctx_size {
            return None;
        }
        // SAFETY: `sz` says the library's verbs_context extends at least
        // `before` bytes in front of the context.
        let p = unsafe { base.sub(before).cast::<*mut c_void>().read_unaligned() };
        (!p.is_null()).then_some(p)
    };
    let (a, d, p) = (
        get(ALLOC_TD_BEFORE)?,
        get(DEALLOC_TD_BEFORE)?,
        get(ALLOC_PARENT_DOMAIN_BEFORE)?,
    );
    // SAFETY: non-null provider entry points with the verbs.h prototypes.
    unsafe {
        Some(ThreadDomainOps {
            alloc_td: std::mem::transmute::<*mut c_void, AllocTdFn>(a),
            dealloc_td: std::mem::transmute::<*mut c_void, DeallocTdFn>(d),
            alloc_parent_domain: std::mem::transmute::<*mut c_void, AllocParentDomainFn>(p),
        })
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
const _: () = assert!(std::mem::size_of::<ibv_parent_domain_init_attr>() == 48);
