//! Registered bounce slab for sends on FI_MR_LOCAL providers: the domain
//! copies the message into a free slot and owns it until the completion.

use std::ffi::c_void;

use transfer_core::Result;

use crate::endpoint::Endpoint;
use crate::fabric::FiDomain;
use crate::mr::MemoryRegistration;

/// Fixed-size registered slots.
pub(crate) struct BounceSlab {
    // Dropped before `mem`: the registration must go first.
    mr: MemoryRegistration,
    mem: Box<[u8]>,
    slot_size: usize,
    free: Vec<usize>,
}

impl BounceSlab {
    /// Allocates and registers `slots` slots of `slot_size` bytes.
    pub(crate) fn new(
        domain: &FiDomain,
        slots: usize,
        slot_size: usize,
        key: u64,
        endpoint: Option<&Endpoint>,
    ) -> Result<Self> {
        let slots = slots.max(1);
        let slot_size = slot_size.max(64);
        let mem = vec![0u8; slots * slot_size].into_boxed_slice();
        let mr = MemoryRegistration::register(domain, mem.as_ptr(), mem.len(), key, endpoint)?;
        Ok(Self {
            mr,
            mem,
            slot_size,
            free: (0..slots).rev().collect(),
        })
    }

    /// Copies `data` into a free slot; returns the slot, its address and
    /// descriptor, or `None` when it does not fit or none is free.
    pub(crate) fn take(&mut self, data: &[u8]) -> Option<(usize, *const u8, *mut c_void)> {
        if data.len() > self.slot_size {
            return None;
        }
        let slot = self.free.pop()?;
        let start = slot * self.slot_size;
        self.mem
            .get_mut(start..start + data.len())?
            .copy_from_slice(data);
        Some((slot, self.mem[start..].as_ptr(), self.mr.desc()))
    }

    /// Returns a slot after its send completed.
    pub(crate) fn give_back(&mut self, slot: usize) {
        self.free.push(slot);
    }
}
