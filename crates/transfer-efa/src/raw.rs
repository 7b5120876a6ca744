//! A pure-libfabric write loop, without the engine's bookkeeping: the
//! baseline a benchmark puts next to engine figures (same provider, same
//! domains, same sizes).
//!
//! It posts `fi_writemsg` directly on the source endpoint, keeps `window`
//! writes in flight, reaps completions straight from the CQ, and drives
//! the destination's progress (manual-progress providers such as
//! `tcp;ofi_rxm` only move data while both sides poll).

use std::time::{Duration, Instant};

use transfer_core::{Domain, DomainEvent, MemoryLocation, MemorySpan, Result, TransferError};

use crate::context::SlotKind;
use crate::cq::CqRead;
use crate::domain::LibfabricDomain;
use crate::sys;

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawParams {
    /// Bytes per write.
    pub size: usize,
    /// Number of timed writes.
    pub count: usize,
    /// Writes kept in flight.
    pub window: usize,
    /// Whether every write carries a 32-bit immediate.
    pub imm: bool,
    /// Failure guard: give up after this long.
    pub limit: Duration,
}

impl Default for RawParams {
    fn default() -> Self {
        Self {
            size: 4 << 20,
            count: 64,
            window: 16,
            imm: false,
            limit: Duration::from_secs(120),
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawReport {
    /// Bytes written in the timed loop.
    pub bytes: u64,
    /// Writes completed in the timed loop.
    pub writes: usize,
    /// Wall time of the timed loop.
    pub elapsed: Duration,
    /// `bytes / elapsed`.
    pub bytes_per_sec: f64,
}

/// Runs `params.count` writes of `params.size` bytes from `src` into a
/// buffer registered on `dst`, `params.window` in flight, after one
/// untimed warm-up write, and returns the bandwidth.
///
/// Both domains must be otherwise idle (no submit in flight, no receive
/// posted): their completion queues are read directly.
pub fn write_bandwidth(
    src: &mut LibfabricDomain,
    dst: &mut LibfabricDomain,
    params: &RawParams,
) -> Result<RawReport> {
    const CALL: &str = "raw::write_bandwidth";
    if src.has_pending() || dst.has_pending() {
        return Err(TransferError::invalid(CALL, "domains must be idle"));
    }
    let size = params.size.max(1);
    let mut src_buf = vec![0xA5u8; size];
    let mut dst_buf = vec![0u8; size];
    let src_reg = src.register(MemorySpan {
        ptr: src_buf.as_mut_ptr(),
        len: size,
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    })?;
    let dst_reg = match dst.register(MemorySpan {
        ptr: dst_buf.as_mut_ptr(),
        len: size,
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    }) {
        Ok(r) => r,
        Err(e) => {
            let _ = src.unregister(src_reg.mr);
            return Err(e);
        }
    };
    // Set when writes are still in flight after a failure: the buffers and
    // registrations are then leaked, never freed under the provider.
    let mut in_flight = false;
    let result = (|| {
        let peer = src.resolve_peer(&dst.address())?;
        let dest = src.peers.fi_addr(CALL, peer)?;
        let desc = src
            .mrs
            .get(&src_reg.mr.0)
            .ok_or(TransferError::RegionUnregistered { call: CALL })?
            .desc();
        let target = Target {
            local: src_buf.as_ptr(),
            len: params.size,
            desc,
            dest,
            addr: dst_reg.remote.base,
            key: dst_reg.remote.key.0,
            imm: params.imm.then_some(0x5eed),
        };
        let deadline = Instant::now() + params.limit;
        let (r, busy) = run(src, dst, &target, 1, 1, deadline);
        in_flight = busy;
        r?;
        let start = Instant::now();
        let window = params.window.max(1);
        let (r, busy) = run(src, dst, &target, params.count, window, deadline);
        in_flight = busy;
        r?;
        let elapsed = start.elapsed();
        let bytes = (params.size as u64) * params.count as u64;
        Ok(RawReport {
            bytes,
            writes: params.count,
            elapsed,
            bytes_per_sec: bytes as f64 / elapsed.as_secs_f64().max(1e-9),
        })
    })();
    if in_flight {
        std::mem::forget(src_buf);
        std::mem::forget(dst_buf);
    } else {
        let _ = dst.unregister(dst_reg.mr);
        let _ = src.unregister(src_reg.mr);
    }
    result
}

struct Target {
    local: *const u8,
    len: usize,
    desc: *mut std::ffi::c_void,
    dest: sys::fi_addr_t,
    addr: u64,
    key: u64,
    imm: Option<u32>,
}

fn run(
    src: &mut LibfabricDomain,
    dst: &mut LibfabricDomain,
    t: &Target,
    count: usize,
    window: usize,
    deadline: Instant,
) -> (Result<()>, bool) {
    const CALL: &str = "raw::write_bandwidth";
    let mut posted = 0usize;
    // Completions reaped, successful or not.
    let mut reaped = 0usize;
    let mut first_error: Option<TransferError> = None;
    let mut buf = std::mem::take(&mut src.cq_buf);
    let mut sink: Vec<DomainEvent> = Vec::new();
    loop {
        // Done when every write completed, or after an error once nothing
        // posted is left in flight (buffers must outlive the provider's use).
        if reaped == posted && (reaped >= count || first_error.is_some()) {
            break;
        }
        if Instant::now() > deadline {
            first_error.get_or_insert(TransferError::Timeout {
                call: CALL,
                millis: 0,
            });
            break;
        }
        while first_error.is_none() && posted < count && posted - reaped < window {
            let ctx = src.slots.alloc(SlotKind::Raw);
            // SAFETY: source and target spans are registered and outlive the
            // loop (the caller unregisters only after every posted write
            // completed); `ctx` lives until its completion.
            let ret = unsafe {
                src.ep.write(
                    t.local,
                    t.len,
                    t.desc,
                    t.dest,
                    t.addr,
                    t.key,
                    t.imm,
                    ctx,
                    if t.len == 0 { 0 } else { src.write_flags },
                )
            };
            if ret == 0 {
                posted += 1;
                continue;
            }
            src.slots.take(ctx);
            if ret != -(sys::FI_EAGAIN as isize) {
                first_error = Some(src.lib.error("fi_writemsg", ret));
            }
            break;
        }
        match src.cq.read(&mut buf) {
            CqRead::Entries(n) => {
                for e in buf.iter().take(n) {
                    if let Some(SlotKind::Raw) = src.slots.take(e.op_context) {
                        reaped += 1;
                    }
                }
            }
            CqRead::Empty => {}
            CqRead::ErrorAvailable => {
                if let Some((e, message)) = src.cq.read_error() {
                    if let Some(SlotKind::Raw) = src.slots.take(e.op_context) {
                        reaped += 1;
                    }
                    first_error.get_or_insert(TransferError::Backend {
                        call: "fi_writemsg",
                        backend: transfer_core::BackendKind::Libfabric,
                        code: e.err,
                        message,
                    });
                }
            }
            CqRead::Failed(code) => {
                first_error.get_or_insert(src.lib.error("fi_cq_read", code));
            }
        }
        dst.poll(&mut sink);
        sink.clear();
    }
    src.cq_buf = buf;
    (first_error.map_or(Ok(()), Err), reaped < posted)
}
