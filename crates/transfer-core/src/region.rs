//! Locally registered memory.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::domain::DomainMr;
use crate::error::{Result, TransferError};
use crate::memory::{MemoryLocation, RemoteRegion};

/// Page-aligned, zeroed host memory owned by the engine's user, to be registered.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: HostBuffer uniquely owns its allocation; it is plain bytes.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out raw pointers and copies through them.
unsafe impl Sync for HostBuffer {}

/// Alignment of [`HostBuffer`]s: one page, so registrations never share pages.
pub const HOST_BUFFER_ALIGN: usize = 4096;

impl HostBuffer {
    /// Allocates `len` zeroed bytes, page aligned.
    pub fn new(len: usize) -> Result<Self> {
        const CALL: &str = "HostBuffer::new";
        if len == 0 {
            return Err(TransferError::invalid(CALL, "length must be non-zero"));
        }
        let layout = Layout::from_size_align(len, HOST_BUFFER_ALIGN)
            .map_err(|e| TransferError::invalid(CALL, e.to_string()))?;
        // SAFETY: layout has non-zero size (checked above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            TransferError::invalid(CALL, format!("allocation of {len} bytes failed"))
        })?;
        Ok(Self { ptr, layout })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: buffers are non-empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

pub(crate) struct RegionInner {
    pub(crate) id: u64,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) location: MemoryLocation,
    pub(crate) group: usize,
    /// One registration per domain of the group, in NIC order.
    pub(crate) mrs: Vec<DomainMr>,
    pub(crate) remote: RemoteRegion,
    in_flight: AtomicUsize,
    unregistered: AtomicBool,
    /// A NIC refused the unregister; a new attempt is allowed.
    retry_unregister: AtomicBool,
    _owned: Option<HostBuffer>,
}

// SAFETY: the raw pointer names memory that lives as long as the region
// (owned buffer, or the caller's promise in `register_raw`); the engine only
// copies through it or hands it to NICs.
unsafe impl Send for RegionInner {}
// SAFETY: see Send; shared state is atomics.
unsafe impl Sync for RegionInner {}

impl RegionInner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        ptr: *mut u8,
        len: usize,
        location: MemoryLocation,
        group: usize,
        mrs: Vec<DomainMr>,
        remote: RemoteRegion,
        owned: Option<HostBuffer>,
    ) -> Self {
        Self {
            id,
            ptr,
            len,
            location,
            group,
            mrs,
            remote,
            in_flight: AtomicUsize::new(0),
            unregistered: AtomicBool::new(false),
            retry_unregister: AtomicBool::new(false),
            _owned: owned,
        }
    }

    /// Marks one more transfer as using the region; fails once unregistered.
    /// SeqCst pairs with [`RegionInner::try_unregister`] (Dekker): either the
    /// submit sees the flag, or unregister sees the count.
    pub(crate) fn acquire(&self, call: &'static str) -> Result<()> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.unregistered.load(Ordering::SeqCst) {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(TransferError::RegionUnregistered { call });
        }
        Ok(())
    }

    /// Marks a host copy through the region's pointer as in progress; fails
    /// once an unregister went through (or is going through), because a
    /// `register_raw` caller may free the memory from then on. A refused
    /// unregister (the NIC kept the registration, see
    /// [`RegionInner::reopen_for_unregister`]) leaves the memory valid, so
    /// host access stays allowed then. Pairs with
    /// [`RegionInner::try_unregister`] as [`RegionInner::acquire`] does: an
    /// unregister racing with the copy sees it in flight and is refused.
    /// Release with [`RegionInner::release`].
    fn acquire_host(&self, call: &'static str) -> Result<()> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.unregistered.load(Ordering::SeqCst) && !self.retry_unregister.load(Ordering::SeqCst)
        {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(TransferError::RegionUnregistered { call });
        }
        Ok(())
    }

    pub(crate) fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn try_unregister(&self) -> Result<()> {
        if self.unregistered.swap(true, Ordering::SeqCst)
            && !self.retry_unregister.swap(false, Ordering::SeqCst)
        {
            return Err(TransferError::RegionUnregistered { call: "unregister" });
        }
        let n = self.in_flight.load(Ordering::SeqCst);
        if n > 0 {
            self.unregistered.store(false, Ordering::SeqCst);
            return Err(TransferError::RegionBusy { in_flight: n });
        }
        Ok(())
    }

    /// After a refused unregister: the region stays refused for new
    /// transfers, but unregister may be called again.
    pub(crate) fn reopen_for_unregister(&self) {
        self.retry_unregister.store(true, Ordering::SeqCst);
    }

    pub(crate) fn check_range(&self, call: &'static str, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok(()),
            _ => Err(TransferError::invalid(
                call,
                format!(
                    "local range {offset}+{len} outside region of {} bytes",
                    self.len
                ),
            )),
        }
    }
}

/// A region registered with every NIC of one domain group.
///
/// Cloning is cheap (shared handle). The memory stays registered, and owned
/// memory stays allocated, until [`crate::TransferEngine::unregister`]
/// succeeds or the engine is dropped, so that peers can never write into
/// freed memory.
#[derive(Clone)]
pub struct LocalRegion(pub(crate) Arc<RegionInner>);

impl std::fmt::Debug for LocalRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRegion")
            .field("id", &self.0.id)
            .field("len", &self.0.len)
            .field("location", &self.0.location)
            .field("group", &self.0.group)
            .finish()
    }
}

impl LocalRegion {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether the region is empty (never: registration refuses it).
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// First byte (for device kernels or zero-copy use).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.ptr
    }

    /// Where the region lives.
    pub fn location(&self) -> MemoryLocation {
        self.0.location
    }

    /// The domain group it is registered with.
    pub fn group(&self) -> usize {
        self.0.group
    }

    /// The descriptor to hand to peers so they can write into this region.
    pub fn remote(&self) -> &RemoteRegion {
        &self.0.remote
    }

    /// Copies `src` into the region at `offset` (host memory only).
    ///
    /// Refused with [`TransferError::RegionUnregistered`] once the region
    /// was unregistered: memory given to `register_raw` may be freed then.
    /// A copy in progress makes a concurrent unregister fail with
    /// [`TransferError::RegionBusy`].
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        const CALL: &str = "LocalRegion::write_at";
        self.host_only(CALL)?;
        self.0.check_range(CALL, offset as u64, src.len() as u64)?;
        self.0.acquire_host(CALL)?;
        // SAFETY: range checked inside the host region, which stays valid
        // while `acquire_host` holds off unregister; the copy goes through
        // raw pointers because NICs may write concurrently (no Rust
        // reference to the region is ever formed).
        unsafe { std::ptr::copy(src.as_ptr(), self.0.ptr.add(offset), src.len()) };
        self.0.release();
        Ok(())
    }

    /// Copies bytes at `offset` out of the region into `dst` (host memory
    /// only). Refused once unregistered, as [`LocalRegion::write_at`].
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        const CALL: &str = "LocalRegion::read_at";
        self.host_only(CALL)?;
        self.0.check_range(CALL, offset as u64, dst.len() as u64)?;
        self.0.acquire_host(CALL)?;
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy(self.0.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        self.0.release();
        Ok(())
    }

    /// Reads the whole region into a new vector (host memory only).
    /// Refused once unregistered, as [`LocalRegion::write_at`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0; self.0.len];
        self.read_at(0, &mut v).map_err(|e| match e {
            TransferError::RegionUnregistered { .. } => TransferError::RegionUnregistered {
                call: "LocalRegion::to_vec",
            },
            e => e,
        })?;
        Ok(v)
    }

    fn host_only(&self, call: &'static str) -> Result<()> {
        match self.0.location {
            MemoryLocation::Host => Ok(()),
            MemoryLocation::Cuda { .. } => {
                Err(TransferError::invalid(call, "region is device memory"))
            }
        }
    }
}
