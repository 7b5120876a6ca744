//! The inline data-path verbs of `verbs.h`, called exactly as rdma-core's
//! header does: through the function pointers in `ibv_context.ops`.

use std::ffi::c_int;

use super::types::*;

/// `ibv_post_send`: `qp->context->ops.post_send(qp, wr, bad_wr)`.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain whose buffers stay registered.
pub unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: caller guarantees `qp` is live, so its context is too.
    let f = unsafe { (*(*qp).context).ops.post_send };
    match f {
        // SAFETY: provider entry point with the verbs.h prototype.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`: `qp->context->ops.post_recv(qp, wr, bad_wr)`.
///
/// # Safety
/// As for [`post_send`].
pub unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: caller guarantees `qp` is live.
    let f = unsafe { (*(*qp).context).ops.post_recv };
    match f {
        // SAFETY: provider entry point with the verbs.h prototype.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_recv`: `srq->context->ops.post_srq_recv(srq, wr, bad_wr)`.
///
/// # Safety
/// `srq` is live; `wr` a valid chain.
pub unsafe fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: caller guarantees `srq` is live.
    let f = unsafe { (*(*srq).context).ops.post_srq_recv };
    match f {
        // SAFETY: provider entry point with the verbs.h prototype.
        Some(f) => unsafe { f(srq, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`: `cq->context->ops.poll_cq(cq, n, wc)`; returns the number
/// of completions (or a negative value on error).
///
/// # Safety
/// `cq` is live; `wc` has room for `wc.len()` entries.
pub unsafe fn poll_cq(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> c_int {
    // SAFETY: caller guarantees `cq` is live.
    let f = unsafe { (*(*cq).context).ops.poll_cq };
    let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
    match f {
        // SAFETY: provider entry point; `wc` has room for `n` entries.
        Some(f) => unsafe { f(cq, n, wc.as_mut_ptr()) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq`: `cq->context->ops.req_notify_cq(cq, solicited_only)`;
/// arms the CQ so that its next completion queues one event on its channel.
/// Returns 0 on success.
///
/// # Safety
/// `cq` is live and was created with a completion channel.
pub unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: bool) -> c_int {
    // SAFETY: caller guarantees `cq` is live.
    let f = unsafe { (*(*cq).context).ops.req_notify_cq };
    match f {
        // SAFETY: provider entry point with the verbs.h prototype.
        Some(f) => unsafe { f(cq, c_int::from(solicited_only)) },
        None => libc::EOPNOTSUPP,
    }
}
