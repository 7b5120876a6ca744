//! Owning wrappers of verbs objects: each releases its object on drop.
//!
//! Parents must outlive children (QP before CQ/SRQ/PD, MR/AH before PD, PD
//! before the context); [`crate::VerbsDomain`] declares its fields in that
//! order and its `Drop` releases peers first.

use std::ffi::c_void;
use std::ptr::NonNull;

use transfer_core::{Result, TransferError};

use crate::error::{errno_error, last_errno};
use crate::sys::{self, Verbs};

/// An opened device (`ibv_context`).
pub(crate) struct Context {
    ptr: NonNull<sys::ibv_context>,
    v: &'static Verbs,
    name: String,
}

impl Context {
    /// Opens the named device, or the first one when `name` is `None`.
    pub(crate) fn open(name: Option<&str>) -> Result<Self> {
        const CALL: &str = "VerbsDomain::open";
        let v = sys::verbs()?;
        let mut n = 0;
        // SAFETY: returns a NULL-terminated array freed below.
        let list = unsafe { (v.get_device_list)(&mut n) };
        if list.is_null() {
            let errno = last_errno();
            if errno == libc::ENOSYS {
                return Err(TransferError::invalid(
                    CALL,
                    "no RDMA device found (this kernel has no RDMA/uverbs support; \
                     ibv_get_device_list: ENOSYS)",
                ));
            }
            return Err(errno_error("ibv_get_device_list", errno));
        }
        let mut names = Vec::new();
        let mut chosen = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: i < n entries of the array.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            let dn = crate::devinfo::device_name(v, dev);
            if chosen.is_none() && name.is_none_or(|w| w == dn) {
                chosen = Some((dev, dn.clone()));
            }
            names.push(dn);
        }
        let result = match chosen {
            None if names.is_empty() => Err(TransferError::invalid(
                CALL,
                "no RDMA device found (no verbs provider bound: load the NIC driver, or \
                 `rdma link add rxe0 type rxe netdev <if>` for soft-RoCE)",
            )),
            None => Err(TransferError::invalid(
                CALL,
                format!(
                    "device {:?} not found; present: {}",
                    name.unwrap_or(""),
                    names.join(", ")
                ),
            )),
            Some((dev, dn)) => {
                // SAFETY: dev is a live entry of the list (still allocated).
                let ctx = unsafe { (v.open_device)(dev) };
                match NonNull::new(ctx) {
                    Some(ptr) => Ok(Self { ptr, v, name: dn }),
                    None => Err(errno_error("ibv_open_device", last_errno())),
                }
            }
        };
        // SAFETY: `list` came from ibv_get_device_list; opened contexts stay
        // valid after the list is freed.
        unsafe { (v.free_device_list)(list) };
        result
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    pub(crate) fn verbs(&self) -> &'static Verbs {
        self.v
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device, closed exactly once; every
        // child object was released before (field order of VerbsDomain).
        unsafe { (self.v.close_device)(self.ptr.as_ptr()) };
    }
}

macro_rules! owned {
    ($name:ident, $raw:ty, $destroy:ident) => {
        /// Owns one verbs object; releases it on drop.
        pub(crate) struct $name {
            ptr: NonNull<$raw>,
            v: &'static Verbs,
        }

        impl $name {
            pub(crate) fn as_ptr(&self) -> *mut $raw {
                self.ptr.as_ptr()
            }

            fn from_raw(v: &'static Verbs, p: *mut $raw, call: &'static str) -> Result<Self> {
                match NonNull::new(p) {
                    Some(ptr) => Ok(Self { ptr, v }),
                    None => Err(errno_error(call, last_errno())),
                }
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching ibv_create/alloc/reg call,
                // released exactly once, children already released.
                unsafe { (self.v.$destroy)(self.ptr.as_ptr()) };
            }
        }
    };
}

owned!(Pd, sys::ibv_pd, dealloc_pd);
owned!(Cq, sys::ibv_cq, destroy_cq);
owned!(Srq, sys::ibv_srq, destroy_srq);
owned!(Qp, sys::ibv_qp, destroy_qp);
owned!(Mr, sys::ibv_mr, dereg_mr);
owned!(Ah, sys::ibv_ah, destroy_ah);

impl Pd {
    pub(crate) fn alloc(ctx: &Context) -> Result<Self> {
        // SAFETY: live context.
        let p = unsafe { (ctx.verbs().alloc_pd)(ctx.as_ptr()) };
        Self::from_raw(ctx.verbs(), p, "ibv_alloc_pd")
    }
}

impl Cq {
    /// A CQ of at least `depth` entries, reporting on `channel` when given
    /// (so that [`CompChannel`]'s descriptor can wake a sleeping worker).
    pub(crate) fn create(ctx: &Context, depth: u32, channel: Option<&CompChannel>) -> Result<Self> {
        let cqe = i32::try_from(depth).unwrap_or(i32::MAX);
        let ch = channel.map_or(std::ptr::null_mut(), CompChannel::as_ptr);
        // SAFETY: live context; `ch` is null or a live channel of the same
        // context, which outlives the CQ (VerbsDomain's field order); vector 0.
        let p = unsafe { (ctx.verbs().create_cq)(ctx.as_ptr(), cqe, std::ptr::null_mut(), ch, 0) };
        Self::from_raw(ctx.verbs(), p, "ibv_create_cq")
    }

    /// `ibv_req_notify_cq(cq, 0)`: the next completion queues an event on
    /// the CQ's channel. False when the provider refused.
    pub(crate) fn arm(&self) -> bool {
        // SAFETY: live CQ; only called on CQs created with a channel.
        unsafe { sys::datapath::req_notify_cq(self.as_ptr(), false) == 0 }
    }

    /// Depth the provider actually gave (>= requested).
    pub(crate) fn depth(&self) -> u32 {
        // SAFETY: live CQ; `cqe` is set by the library at creation.
        let n = unsafe { (*self.as_ptr()).cqe };
        u32::try_from(n).unwrap_or(0)
    }
}

/// A completion event channel (`ibv_comp_channel`) with a non-blocking
/// descriptor: the domain's [`transfer_core::Domain::wait_fd`].
///
/// Every event read from it is acknowledged at once (see
/// [`CompChannel::drain`]), so none is ever outstanding when a CQ is
/// destroyed (`ibv_destroy_cq` would wait for it). Destroy after its CQs:
/// the library refuses (EBUSY) while CQs still use it.
pub(crate) struct CompChannel {
    ptr: NonNull<sys::ibv_comp_channel>,
    fns: &'static sys::ChannelVerbs,
    fd: std::os::fd::RawFd,
}

impl CompChannel {
    /// `None` when the library or provider has no completion channels, or
    /// the descriptor cannot be made non-blocking: the domain then offers
    /// no wait descriptor and idle workers park on timers, as before.
    pub(crate) fn create(ctx: &Context) -> Option<Self> {
        let fns = ctx.verbs().channel.as_ref()?;
        // SAFETY: live context.
        let ptr = NonNull::new(unsafe { (fns.create)(ctx.as_ptr()) })?;
        // SAFETY: `ptr` is the live channel just created; `fd` is set by
        // the library and constant for its lifetime.
        let fd = unsafe { (*ptr.as_ptr()).fd };
        let ch = Self { ptr, fns, fd };
        // Non-blocking, so that draining stops at EAGAIN instead of
        // sleeping in read(): the worker blocks in poll(), never here.
        // SAFETY: fcntl on a descriptor the channel owns; no memory involved.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return None; // `ch` drops: the channel is destroyed
        }
        Some(ch)
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_comp_channel {
        self.ptr.as_ptr()
    }

    /// The descriptor that becomes readable when an armed CQ completes.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    /// Reads every queued event (until EAGAIN) and acknowledges them, one
    /// `ibv_ack_cq_events` call per CQ. Returns how many there were.
    pub(crate) fn drain(&self) -> usize {
        // Two CQs use a channel (the data CQ and the handshake CQ); a
        // third would be acknowledged event by event.
        let mut counts: [(*mut sys::ibv_cq, u32); 2] = [(std::ptr::null_mut(), 0); 2];
        let mut total = 0;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut cq_ctx = std::ptr::null_mut();
            // SAFETY: live channel; out-pointers valid for the call; the
            // descriptor is non-blocking, so this returns -1 (EAGAIN) when
            // no event is queued.
            let rc = unsafe { (self.fns.get_event)(self.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc != 0 || cq.is_null() {
                break;
            }
            total += 1;
            match counts.iter_mut().find(|(c, _)| *c == cq || c.is_null()) {
                Some(slot) => *slot = (cq, slot.1 + 1),
                // SAFETY: `cq` is a live CQ of ours that just reported this event.
                None => unsafe { (self.fns.ack)(cq, 1) },
            }
        }
        for (cq, n) in counts {
            if n > 0 {
                // SAFETY: live CQ; acknowledges exactly the events read above.
                unsafe { (self.fns.ack)(cq, n) };
            }
        }
        total
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed exactly
        // once, after every CQ using it (VerbsDomain's field order).
        unsafe { (self.fns.destroy)(self.ptr.as_ptr()) };
    }
}

impl Srq {
    pub(crate) fn create(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Self> {
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; attr valid for the call.
        let p = unsafe { (pd.v.create_srq)(pd.as_ptr(), &mut attr) };
        Self::from_raw(pd.v, p, "ibv_create_srq")
    }
}

impl Qp {
    pub(crate) fn create(
        pd: &Pd,
        cq: &Cq,
        srq: Option<&Srq>,
        qp_type: i32,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<Self> {
        let mut attr = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: srq.map_or(std::ptr::null_mut(), Srq::as_ptr),
            cap: sys::ibv_qp_cap {
                max_send_wr,
                max_recv_wr: if srq.is_some() { 0 } else { max_recv_wr },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type,
            sq_sig_all: 0,
        };
        // SAFETY: live PD/CQ/SRQ; attr valid for the call.
        let p = unsafe { (pd.v.create_qp)(pd.as_ptr(), &mut attr) };
        Self::from_raw(pd.v, p, "ibv_create_qp")
    }

    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: live QP; qp_num is immutable after creation.
        unsafe { (*self.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp`; the error carries `call`.
    pub(crate) fn modify(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: i32,
        call: &'static str,
    ) -> Result<()> {
        // SAFETY: live QP; attr valid for the call.
        let rc = unsafe { (self.v.modify_qp)(self.as_ptr(), attr, mask) };
        if rc == 0 {
            Ok(())
        } else {
            Err(errno_error(call, rc))
        }
    }
}

impl Mr {
    /// Registers host memory `[ptr, ptr+len)`; with `relaxed`, asks for
    /// relaxed ordering through `ibv_reg_mr_iova2` (an optional flag,
    /// dropped by libraries/kernels without it), falling back to plain
    /// `ibv_reg_mr`.
    pub(crate) fn register(pd: &Pd, ptr: *mut u8, len: usize, relaxed: bool) -> Result<Self> {
        let access = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE;
        if relaxed {
            if let Some(f) = pd.v.reg_mr_iova2 {
                let acc = (access | sys::IBV_ACCESS_RELAXED_ORDERING) as u32;
                // SAFETY: live PD; the caller keeps the span alive while registered.
                let p = unsafe { f(pd.as_ptr(), ptr.cast::<c_void>(), len, ptr as u64, acc) };
                if let Ok(mr) = Self::from_raw(pd.v, p, "ibv_reg_mr_iova2") {
                    return Ok(mr);
                }
            }
        }
        // SAFETY: as above.
        let p = unsafe { (pd.v.reg_mr)(pd.as_ptr(), ptr.cast::<c_void>(), len, access) };
        Self::from_raw(pd.v, p, "ibv_reg_mr")
    }

    /// Registers a dma-buf (`ibv_reg_dmabuf_mr`) at iova `iova`, offset 0 of `fd`.
    pub(crate) fn register_dmabuf(pd: &Pd, fd: i32, len: usize, iova: u64) -> Result<Self> {
        let Some(f) = pd.v.reg_dmabuf_mr else {
            return Err(TransferError::invalid(
                "VerbsDomain::register",
                "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core >= 34 needed)",
            ));
        };
        let access = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_RELAXED_ORDERING;
        // SAFETY: live PD; the fd names a dma-buf the caller keeps open.
        let p = unsafe { f(pd.as_ptr(), 0, len, iova, fd, access) };
        Self::from_raw(pd.v, p, "ibv_reg_dmabuf_mr")
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: live MR; keys are immutable after registration.
        unsafe { (*self.as_ptr()).lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.as_ptr()).rkey }
    }
}

impl Ah {
    pub(crate) fn create(pd: &Pd, attr: &mut sys::ibv_ah_attr) -> Result<Self> {
        // SAFETY: live PD; attr valid for the call.
        let p = unsafe { (pd.v.create_ah)(pd.as_ptr(), attr) };
        Self::from_raw(pd.v, p, "ibv_create_ah")
    }
}

/// A thread domain and the parent domain (a PD whose objects take no
/// locks: one thread uses them) built on it. Drop order: parent, then TD.
pub(crate) struct ThreadDomain {
    parent: std::mem::ManuallyDrop<Pd>,
    td: NonNull<sys::extended::ibv_td>,
    dealloc_td: sys::extended::DeallocTdFn,
}

impl ThreadDomain {
    /// `None` when the provider has no thread domains (rxe, older libraries)
    /// or refuses one.
    pub(crate) fn create(ctx: &Context, pd: &Pd) -> Option<Self> {
        // SAFETY: live context.
        let ops = unsafe { sys::extended::thread_domain_ops(ctx.as_ptr()) }?;
        let mut tattr = sys::extended::ibv_td_init_attr::default();
        // SAFETY: provider entry point; attr valid for the call.
        let td = NonNull::new(unsafe { (ops.alloc_td)(ctx.as_ptr(), &mut tattr) })?;
        let mut pattr = sys::extended::ibv_parent_domain_init_attr {
            pd: pd.as_ptr(),
            td: td.as_ptr(),
            comp_mask: 0,
            alloc: std::ptr::null_mut(),
            free: std::ptr::null_mut(),
            pd_context: std::ptr::null_mut(),
        };
        // SAFETY: provider entry point; live PD and TD; attr valid for the call.
        let parent = unsafe { (ops.alloc_parent_domain)(ctx.as_ptr(), &mut pattr) };
        match Pd::from_raw(ctx.verbs(), parent, "ibv_alloc_parent_domain") {
            Ok(parent) => Some(Self {
                parent: std::mem::ManuallyDrop::new(parent),
                td,
                dealloc_td: ops.dealloc_td,
            }),
            Err(_) => {
                // SAFETY: allocated just above, unused.
                unsafe { (ops.dealloc_td)(td.as_ptr()) };
                None
            }
        }
    }

    /// The parent domain, used as the PD of the RC QPs.
    pub(crate) fn pd(&self) -> &Pd {
        &self.parent
    }
}

impl Drop for ThreadDomain {
    fn drop(&mut self) {
        // SAFETY: the parent domain is released exactly once, here, before
        // its thread domain; it has no QPs left (VerbsDomain releases peers
        // first).
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.parent);
            (self.dealloc_td)(self.td.as_ptr());
        }
    }
}
