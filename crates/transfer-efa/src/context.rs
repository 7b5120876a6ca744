//! Per-operation contexts handed to libfabric.
//!
//! Every posted operation gets a [`Slot`] whose first member is an
//! `fi_context2`, so providers that require FI_CONTEXT / FI_CONTEXT2 may use
//! it as scratch space until the completion is read. Slots are boxed, so
//! their addresses stay put while the pool grows; completions are mapped
//! back by address through a hash map, never by dereferencing whatever
//! pointer a provider returns.

use std::collections::HashMap;
use std::ffi::c_void;

use transfer_core::PeerId;

use crate::domain::PendingRecv;
use crate::mr::MemoryRegistration;
use crate::posting::Posting;
use crate::sys;

/// Where the bytes of a posted send live until its completion.
pub(crate) enum SendPayload {
    /// The caller's buffer, sent in place (providers without FI_MR_LOCAL).
    Owned(Vec<u8>),
    /// A slot of the registered bounce slab (index).
    Bounce(usize),
    /// The caller's buffer, registered for this one send (FI_MR_LOCAL and
    /// no free bounce slot or too large for one).
    Registered(MemoryRegistration, Vec<u8>),
}

/// What a posted operation was.
pub(crate) enum SlotKind {
    /// One write of a submit call.
    Write {
        /// Internal op id.
        op: u64,
        /// Destination.
        peer: PeerId,
        /// The write, kept for one retry after a broken connection.
        write: Posting,
        /// Whether this is that retry.
        retried: bool,
    },
    /// A send.
    Send {
        /// Internal op id.
        op: u64,
        /// Destination.
        peer: PeerId,
        /// Bytes kept alive until completion.
        payload: SendPayload,
    },
    /// A posted receive buffer.
    Recv(PendingRecv),
}

/// One operation context.
#[repr(C)]
pub(crate) struct Slot {
    /// Provider scratch space; must stay the first member.
    ctx: sys::fi_context2,
    kind: Option<SlotKind>,
}

/// A pool of slots.
#[derive(Default)]
pub(crate) struct SlotPool {
    // Boxed on purpose: libfabric holds pointers to slots while the Vec
    // grows, so each slot needs an address of its own.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<Slot>>,
    free: Vec<usize>,
    by_addr: HashMap<usize, usize>,
}

impl SlotPool {
    /// Stores `kind` in a free slot and returns the context pointer to post.
    pub(crate) fn alloc(&mut self, kind: SlotKind) -> *mut c_void {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Box::new(Slot {
                    ctx: sys::fi_context2 {
                        internal: [std::ptr::null_mut(); 8],
                    },
                    kind: None,
                }));
                let i = self.slots.len() - 1;
                let addr = self.ptr_of(i) as usize;
                self.by_addr.insert(addr, i);
                i
            }
        };
        let slot = &mut self.slots[idx];
        slot.ctx.internal = [std::ptr::null_mut(); 8];
        slot.kind = Some(kind);
        self.ptr_of(idx)
    }

    fn ptr_of(&mut self, idx: usize) -> *mut c_void {
        let slot: &mut Slot = &mut self.slots[idx];
        (slot as *mut Slot).cast()
    }

    /// Takes back the slot behind a completion's `op_context`; `None` for
    /// NULL or foreign pointers.
    pub(crate) fn take(&mut self, ctx: *mut c_void) -> Option<SlotKind> {
        let idx = *self.by_addr.get(&(ctx as usize))?;
        let kind = self.slots.get_mut(idx)?.kind.take()?;
        self.free.push(idx);
        Some(kind)
    }

    /// Takes the kinds of the posted slots `pick` selects without freeing
    /// the slots: their contexts stay owned by the provider (an endpoint
    /// that will never complete them), so they are never reused; a late
    /// completion of one finds no kind and is ignored.
    pub(crate) fn abandon(&mut self, pick: impl Fn(&SlotKind) -> bool) -> Vec<SlotKind> {
        self.slots
            .iter_mut()
            .filter(|s| s.kind.as_ref().is_some_and(&pick))
            .filter_map(|s| s.kind.take())
            .collect()
    }

    /// Iterates over the kinds of posted slots.
    pub(crate) fn posted(&self) -> impl Iterator<Item = &SlotKind> {
        self.slots.iter().filter_map(|s| s.kind.as_ref())
    }
}
