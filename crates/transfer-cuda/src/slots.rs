//! The watcher's slot allocator: 64-bit counters in pages of mapped memory.
//!
//! It grows one page at a time (no fixed limit besides `u32` ids) and never
//! moves or frees a page before it is dropped, so a slot's host and device
//! addresses stay valid for the allocator's whole life. Freed slots are
//! reused lowest id first, and are zeroed when handed out again.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CudaError, Result};
use crate::memory::{MappedBlock, MemoryProvider};

/// Slots per page by default: one 4 KiB host page of `u64`s.
pub const DEFAULT_SLOTS_PER_PAGE: usize = 512;

/// Identifies one slot of an allocator (and of the watcher that owns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// Where a slot lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAddr {
    /// The slot.
    pub id: SlotId,
    /// Its address for the CPU (8-byte aligned).
    pub host: *const AtomicU64,
    /// Its address for GPU code (pass this to kernels or stream operations).
    pub device: u64,
}

// SAFETY: a SlotAddr only names memory owned by an allocator (kept alive by
// its owner); access goes through AtomicU64.
unsafe impl Send for SlotAddr {}
// SAFETY: see Send.
unsafe impl Sync for SlotAddr {}

/// Allocates `u64` slots from pages of a [`MemoryProvider`].
pub struct SlotAllocator {
    provider: Box<dyn MemoryProvider>,
    slots_per_page: usize,
    pages: Vec<Box<dyn MappedBlock>>,
    in_use: Vec<bool>,
    /// Free slot ids; `pop` returns the lowest.
    free: BinaryHeap<Reverse<u32>>,
}

impl std::fmt::Debug for SlotAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotAllocator")
            .field("provider", &self.provider.kind())
            .field("slots_per_page", &self.slots_per_page)
            .field("pages", &self.pages.len())
            .field("in_use", &self.in_use())
            .finish()
    }
}

impl SlotAllocator {
    /// An empty allocator growing by [`DEFAULT_SLOTS_PER_PAGE`] slots.
    pub fn new(provider: impl MemoryProvider) -> Self {
        Self::from_box(Box::new(provider), DEFAULT_SLOTS_PER_PAGE)
    }

    /// An empty allocator growing by `slots_per_page` slots (at least 1).
    pub fn with_page_slots(provider: impl MemoryProvider, slots_per_page: usize) -> Self {
        Self::from_box(Box::new(provider), slots_per_page)
    }

    pub(crate) fn from_box(provider: Box<dyn MemoryProvider>, slots_per_page: usize) -> Self {
        Self {
            provider,
            slots_per_page: slots_per_page.max(1),
            pages: Vec::new(),
            in_use: Vec::new(),
            free: BinaryHeap::new(),
        }
    }

    /// Kind of memory the slots live in.
    pub fn provider_kind(&self) -> &'static str {
        self.provider.kind()
    }

    /// Slots per page.
    pub fn slots_per_page(&self) -> usize {
        self.slots_per_page
    }

    /// Pages allocated so far.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// Slots allocated so far (in use or free).
    pub fn capacity(&self) -> usize {
        self.in_use.len()
    }

    /// Slots currently handed out.
    pub fn in_use(&self) -> usize {
        self.in_use.len() - self.free.len()
    }

    /// Hands out a slot set to 0, growing by one page when none is free.
    pub fn alloc(&mut self) -> Result<SlotAddr> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let Some(Reverse(id)) = self.free.pop() else {
            return Err(CudaError::OutOfMemory {
                call: "SlotAllocator::alloc",
                reason: "no slot after growing".into(),
            });
        };
        if let Some(flag) = self.in_use.get_mut(id as usize) {
            *flag = true;
        }
        let addr = self.addr(SlotId(id))?;
        // SAFETY: the slot lies in a live page (addr checked it); zeroing
        // before handing it out makes reuse start from a known value.
        unsafe { (*addr.host).store(0, Ordering::Release) };
        Ok(addr)
    }

    /// Returns a slot. The caller guarantees that no GPU code writes it any
    /// more (a late write would show up in the slot's next owner).
    pub fn free(&mut self, id: SlotId) -> Result<()> {
        const CALL: &str = "SlotAllocator::free";
        match self.in_use.get_mut(id.0 as usize) {
            Some(flag) if *flag => {
                *flag = false;
            }
            Some(_) => return Err(CudaError::invalid(CALL, format!("{id} is not in use"))),
            None => return Err(CudaError::invalid(CALL, format!("{id} does not exist"))),
        }
        self.free.push(Reverse(id.0));
        Ok(())
    }

    /// Whether `id` is currently handed out.
    pub fn is_in_use(&self, id: SlotId) -> bool {
        self.in_use.get(id.0 as usize).copied().unwrap_or(false)
    }

    /// The addresses of slot `id` (allocated or not, as long as it exists).
    pub fn addr(&self, id: SlotId) -> Result<SlotAddr> {
        let index = id.0 as usize;
        let page = self.pages.get(index / self.slots_per_page).ok_or_else(|| {
            CudaError::invalid("SlotAllocator::addr", format!("{id} does not exist"))
        })?;
        let offset = (index % self.slots_per_page) * 8;
        // SAFETY: offset + 8 <= slots_per_page * 8 == page.len() (see grow).
        let host = unsafe { page.host_ptr().as_ptr().add(offset) }.cast::<AtomicU64>();
        Ok(SlotAddr {
            id,
            host,
            device: page.device_addr() + offset as u64,
        })
    }

    /// Reads slot `id`.
    pub fn load(&self, id: SlotId) -> Result<u64> {
        let a = self.addr(id)?;
        // SAFETY: the slot lies in a live page owned by self.
        Ok(unsafe { (*a.host).load(Ordering::Acquire) })
    }

    fn grow(&mut self) -> Result<()> {
        const CALL: &str = "SlotAllocator::grow";
        let first = self.in_use.len();
        let end = first
            .checked_add(self.slots_per_page)
            .filter(|&e| e <= u32::MAX as usize + 1)
            .ok_or_else(|| CudaError::OutOfMemory {
                call: CALL,
                reason: "slot ids exhausted".into(),
            })?;
        let bytes = self.slots_per_page * 8;
        let page = self.provider.alloc_zeroed(bytes)?;
        if page.len() < bytes || page.host_ptr().as_ptr().align_offset(8) != 0 {
            return Err(CudaError::invalid(
                CALL,
                "provider returned a short or misaligned block",
            ));
        }
        self.pages.push(page);
        self.in_use.resize(end, false);
        self.free.extend((first..end).map(|i| Reverse(i as u32)));
        Ok(())
    }
}
