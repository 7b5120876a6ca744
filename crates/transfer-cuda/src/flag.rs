//! CPU-to-GPU flags: a `u64` in memory a kernel can poll, written by the CPU.
//!
//! With GDRCopy (the gdrdrv module and `libgdrapi.so.2` present) the flag
//! lives in GPU memory and the CPU writes it through a BAR mapping: the
//! kernel polls device memory. Without it, the flag lives in pinned host
//! memory mapped into the device: the kernel polls over PCIe. [`GpuFlag`]
//! says which one is in use and, for the fallback, why.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::context::CudaContext;
use crate::error::{CudaError, Result};
use crate::gdr::GdrMapping;
use crate::memory::{MappedBlock, MemoryProvider, PinnedHostMemory};

/// Where a [`GpuFlag`] lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagBackend {
    /// GPU memory written by the CPU through a GDRCopy mapping.
    GdrCopy,
    /// Host memory mapped into the device (pinned, or plain in tests).
    HostMapped,
}

impl std::fmt::Display for FlagBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FlagBackend::GdrCopy => "GDRCopy (GPU memory)",
            FlagBackend::HostMapped => "host-mapped pinned memory",
        })
    }
}

enum Storage {
    Gdr(GdrMapping),
    Mapped(Box<dyn MappedBlock>),
}

/// Something the CPU can set and GPU code (or a test) can observe.
pub trait FlagSink: Send + Sync + 'static {
    /// Stores `value`.
    fn set(&self, value: u64) -> Result<()>;
}

/// A `u64` flag that the CPU writes and a kernel polls at [`GpuFlag::device_addr`].
pub struct GpuFlag {
    storage: Storage,
    fallback: Option<String>,
}

impl std::fmt::Debug for GpuFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuFlag")
            .field("backend", &self.backend())
            .field("device_addr", &format_args!("{:#x}", self.device_addr()))
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl GpuFlag {
    /// A flag on `ctx`'s device: GDRCopy when available, else host-mapped
    /// pinned memory (see [`GpuFlag::fallback_reason`]).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        match Self::gdrcopy(ctx) {
            Ok(f) => Ok(f),
            Err(e) => {
                let mut f = Self::host_mapped(&PinnedHostMemory::new(ctx.clone()))?;
                f.fallback = Some(e.to_string());
                Ok(f)
            }
        }
    }

    /// A flag in GPU memory through GDRCopy; fails when GDRCopy is unusable.
    pub fn gdrcopy(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Self {
            storage: Storage::Gdr(GdrMapping::new(ctx)?),
            fallback: None,
        })
    }

    /// A flag in memory from `provider` (pinned host memory for GPUs;
    /// [`crate::PlainHostMemory`] in tests).
    pub fn host_mapped(provider: &dyn MemoryProvider) -> Result<Self> {
        let block = provider.alloc_zeroed(8)?;
        if block.len() < 8 || block.host_ptr().as_ptr().align_offset(8) != 0 {
            return Err(CudaError::invalid(
                "GpuFlag::host_mapped",
                "provider returned a short or misaligned block",
            ));
        }
        Ok(Self {
            storage: Storage::Mapped(block),
            fallback: None,
        })
    }

    /// Which memory the flag lives in.
    pub fn backend(&self) -> FlagBackend {
        match self.storage {
            Storage::Gdr(_) => FlagBackend::GdrCopy,
            Storage::Mapped(_) => FlagBackend::HostMapped,
        }
    }

    /// Why GDRCopy was not used, when [`GpuFlag::new`] fell back.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The address kernels poll (with volatile / system-scope loads).
    pub fn device_addr(&self) -> u64 {
        match &self.storage {
            Storage::Gdr(m) => m.device_addr(),
            Storage::Mapped(b) => b.device_addr(),
        }
    }

    fn atomic(block: &dyn MappedBlock) -> &AtomicU64 {
        // SAFETY: the block is at least 8 bytes and 8-aligned (checked in
        // host_mapped) and lives as long as `self`; the GPU accesses it
        // with whole-word loads only.
        unsafe { &*block.host_ptr().as_ptr().cast::<AtomicU64>() }
    }

    /// Stores `value` (a release store, or a GDRCopy write followed by a
    /// store fence): every CPU write before it is visible to a kernel that
    /// sees the value.
    pub fn set(&self, value: u64) -> Result<()> {
        match &self.storage {
            Storage::Gdr(m) => {
                std::sync::atomic::fence(Ordering::Release);
                m.write_u64(0, value)?;
                // Write-combined stores: drain them now, not at the next fence.
                std::sync::atomic::fence(Ordering::SeqCst);
                Ok(())
            }
            Storage::Mapped(b) => {
                Self::atomic(b.as_ref()).store(value, Ordering::Release);
                Ok(())
            }
        }
    }

    /// Reads the flag back.
    pub fn get(&self) -> Result<u64> {
        match &self.storage {
            Storage::Gdr(m) => m.read_u64(0),
            Storage::Mapped(b) => Ok(Self::atomic(b.as_ref()).load(Ordering::Acquire)),
        }
    }
}

impl FlagSink for GpuFlag {
    fn set(&self, value: u64) -> Result<()> {
        GpuFlag::set(self, value)
    }
}
