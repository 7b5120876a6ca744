//! The embedded PTX kernels (`kernels.ptx`), loaded with `cuModuleLoadData`
//! and launched with `cuLaunchKernel`.
//!
//! The PTX is hand-written for ISA 6.0 / `sm_60`, so every driver from CUDA
//! 9 on JIT-compiles it for the GPU at hand (Pascal through Hopper and
//! later); no toolkit, no NVRTC. Launches are ordinary kernel nodes when a
//! stream is being captured into a CUDA graph.

use std::ffi::{CStr, c_uint, c_void};
use std::sync::Arc;

use crate::context::CudaContext;
use crate::device::Stream;
use crate::driver::{CuFunction, CuModule};
use crate::error::{CudaError, Result};

/// The PTX source (NUL-terminated for the driver).
pub const PTX: &str = concat!(include_str!("kernels.ptx"), "\0");

/// Entry points defined by [`PTX`].
pub const ENTRY_POINTS: [&str; 6] = [
    "transfer_slot_add",
    "transfer_slot_set",
    "transfer_slots_bump_each",
    "transfer_slot_pingpong",
    "transfer_flag_wait",
    "transfer_fill_u32",
];

/// The loaded module and its functions, for one context.
pub struct DeviceKernels {
    ctx: Arc<CudaContext>,
    module: CuModule,
    slot_add: CuFunction,
    slot_set: CuFunction,
    bump_each: CuFunction,
    pingpong: CuFunction,
    flag_wait: CuFunction,
    fill_u32: CuFunction,
}

// SAFETY: modules and functions are context-wide handles, usable from any
// thread where the context is current (every launch binds it).
unsafe impl Send for DeviceKernels {}
// SAFETY: cuLaunchKernel is thread-safe.
unsafe impl Sync for DeviceKernels {}

impl std::fmt::Debug for DeviceKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKernels")
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl DeviceKernels {
    /// JIT-compiles the PTX for `ctx`'s device.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind()?;
        let d = ctx.driver();
        let mut module: CuModule = std::ptr::null_mut();
        // SAFETY: PTX is a NUL-terminated PTX text; the context is current.
        d.check("cuModuleLoadData", unsafe {
            (d.api.module_load_data)(&mut module, PTX.as_ptr().cast::<c_void>())
        })?;
        let mut k = Self {
            ctx: ctx.clone(),
            module,
            slot_add: std::ptr::null_mut(),
            slot_set: std::ptr::null_mut(),
            bump_each: std::ptr::null_mut(),
            pingpong: std::ptr::null_mut(),
            flag_wait: std::ptr::null_mut(),
            fill_u32: std::ptr::null_mut(),
        };
        k.slot_add = k.function(c"transfer_slot_add")?;
        k.slot_set = k.function(c"transfer_slot_set")?;
        k.bump_each = k.function(c"transfer_slots_bump_each")?;
        k.pingpong = k.function(c"transfer_slot_pingpong")?;
        k.flag_wait = k.function(c"transfer_flag_wait")?;
        k.fill_u32 = k.function(c"transfer_fill_u32")?;
        Ok(k)
    }

    fn function(&self, name: &CStr) -> Result<CuFunction> {
        let d = self.ctx.driver();
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; `name` is NUL-terminated.
        d.check("cuModuleGetFunction", unsafe {
            (d.api.module_get_function)(&mut f, self.module, name.as_ptr())
        })?;
        Ok(f)
    }

    fn launch(
        &self,
        f: CuFunction,
        stream: &Stream,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if stream.context().ordinal() != self.ctx.ordinal() {
            return Err(CudaError::invalid(
                "DeviceKernels::launch",
                "stream belongs to another device",
            ));
        }
        self.ctx.bind()?;
        let d = self.ctx.driver();
        // SAFETY: `f` belongs to the loaded module; `params` holds one
        // pointer per kernel parameter, each to a live local of the
        // parameter's type (the driver copies them before returning).
        d.check("cuLaunchKernel", unsafe {
            (d.api.launch_kernel)(
                f,
                grid as c_uint,
                1,
                1,
                block as c_uint,
                1,
                1,
                0,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Queues `*slot += delta` (a system-scope atomic add, after a
    /// system-wide fence) on `stream`: the watcher-bump helper, usable
    /// inside graph capture. Several streams may bump one slot if the
    /// platform has host-native atomics
    /// ([`crate::driver::attr::HOST_NATIVE_ATOMIC_SUPPORTED`]); otherwise
    /// give each slot one producer stream.
    ///
    /// # Safety
    /// `slot` must be a device address of 8 writable, 8-aligned bytes
    /// (e.g. [`crate::SlotAddr::device`]) that stays valid until the kernel ran.
    pub unsafe fn slot_add(&self, stream: &Stream, slot: u64, delta: u64) -> Result<()> {
        let (mut a, mut b) = (slot, delta);
        self.launch(self.slot_add, stream, 1, 1, &mut [ptr(&mut a), ptr(&mut b)])
    }

    /// Queues `*slot = value` (a volatile store after a system-wide fence).
    ///
    /// # Safety
    /// As for [`DeviceKernels::slot_add`].
    pub unsafe fn slot_set(&self, stream: &Stream, slot: u64, value: u64) -> Result<()> {
        let (mut a, mut b) = (slot, value);
        self.launch(self.slot_set, stream, 1, 1, &mut [ptr(&mut a), ptr(&mut b)])
    }

    /// Test helper: `count` threads, thread `i` adds 1 to `base[i]`, `rounds` times.
    ///
    /// # Safety
    /// `base` must be a device address of `count` writable, 8-aligned `u64`s.
    pub unsafe fn bump_each(
        &self,
        stream: &Stream,
        base: u64,
        count: u32,
        rounds: u32,
    ) -> Result<()> {
        const BLOCK: u32 = 128;
        let grid = count.div_ceil(BLOCK).max(1);
        let (mut a, mut b, mut c) = (base, count, rounds);
        let mut p = [ptr(&mut a), ptr(&mut b), ptr(&mut c)];
        self.launch(self.bump_each, stream, grid, BLOCK, &mut p)
    }

    /// Latency probe: for `i` in `1..=rounds`, waits for `*go >= i`, then
    /// stores `i` into `*slot`; after `timeout_ns` without progress it
    /// stores `u64::MAX` and exits. Occupies one SM thread while it runs.
    ///
    /// # Safety
    /// `go` and `slot` must be device addresses of 8-aligned `u64`s (host-mapped
    /// memory the CPU writes / reads) valid until the kernel exits.
    pub unsafe fn pingpong(
        &self,
        stream: &Stream,
        go: u64,
        slot: u64,
        rounds: u64,
        timeout_ns: u64,
    ) -> Result<()> {
        let (mut a, mut b, mut c, mut e) = (go, slot, rounds, timeout_ns);
        let mut p = [ptr(&mut a), ptr(&mut b), ptr(&mut c), ptr(&mut e)];
        self.launch(self.pingpong, stream, 1, 1, &mut p)
    }

    /// Flag probe: waits until `*flag == expected`, then stores 1 into
    /// `*out`; after `timeout_ns` it stores 2 instead.
    ///
    /// # Safety
    /// `flag` and `out` must be device addresses of 8-aligned `u64`s valid
    /// until the kernel exits.
    pub unsafe fn flag_wait(
        &self,
        stream: &Stream,
        flag: u64,
        expected: u64,
        out: u64,
        timeout_ns: u64,
    ) -> Result<()> {
        let (mut a, mut b, mut c, mut e) = (flag, expected, out, timeout_ns);
        let mut p = [ptr(&mut a), ptr(&mut b), ptr(&mut c), ptr(&mut e)];
        self.launch(self.flag_wait, stream, 1, 1, &mut p)
    }

    /// Example helper: `words[i] = value + i` for `i < count`.
    ///
    /// # Safety
    /// `words` must be a device address of `count` writable `u32`s.
    pub unsafe fn fill_u32(
        &self,
        stream: &Stream,
        words: u64,
        count: u32,
        value: u32,
    ) -> Result<()> {
        const BLOCK: u32 = 256;
        let grid = count.div_ceil(BLOCK).max(1);
        let (mut a, mut b, mut c) = (words, count, value);
        let mut p = [ptr(&mut a), ptr(&mut b), ptr(&mut c)];
        self.launch(self.fill_u32, stream, grid, BLOCK, &mut p)
    }
}

fn ptr<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast::<c_void>()
}

impl Drop for DeviceKernels {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded in `load`, unloaded once; no launch can follow.
            let _ = unsafe { (self.ctx.driver().api.module_unload)(self.module) };
        }
    }
}
