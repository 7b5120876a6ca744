//! The layer-by-layer KV-cache send pattern: GPU code bumps one watcher
//! slot per layer when the layer is written; the slot's callback submits
//! that layer's pages as one paged write carrying an immediate, so the
//! receiver's immediate counter completes when every layer has arrived.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use transfer_core::{
    LocalRegion, Notify, PagedWriteRequest, Pages, RemoteTarget, TransferEngine, TransferError,
};

use crate::error::Result;
use crate::slots::SlotAddr;
use crate::watcher::{WatchControl, Watcher};

/// The pages of one layer: `src_pages[i]` of the local region goes to
/// `dst_pages[i]` of the remote one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPages {
    /// Source pages in the local region.
    pub src_pages: Pages,
    /// Destination pages in the remote region.
    pub dst_pages: Pages,
    /// Bytes per page.
    pub page_len: u64,
}

#[derive(Default)]
struct Progress {
    submitted: AtomicU64,
    completed: AtomicU64,
    errors: Mutex<Vec<(usize, TransferError)>>,
}

/// Sends layers as they become ready. One watcher slot per layer; bump it
/// (to any non-zero value) from the stream that wrote the layer.
pub struct LayerSender {
    slots: Vec<SlotAddr>,
    progress: Arc<Progress>,
}

impl std::fmt::Debug for LayerSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerSender")
            .field("layers", &self.slots.len())
            .field("submitted", &self.submitted())
            .field("completed", &self.completed())
            .finish()
    }
}

impl LayerSender {
    /// Watches one slot per entry of `layers`; when slot `l` first changes,
    /// submits layer `l`'s pages from `src` to `dst` with immediate `imm`.
    pub fn start(
        watcher: &Watcher,
        engine: Arc<TransferEngine>,
        src: LocalRegion,
        dst: RemoteTarget,
        layers: Vec<LayerPages>,
        imm: u32,
    ) -> Result<Self> {
        let progress = Arc::new(Progress::default());
        let mut slots = Vec::with_capacity(layers.len());
        for (index, layer) in layers.into_iter().enumerate() {
            let engine = engine.clone();
            let src = src.clone();
            let dst = dst.clone();
            let progress = progress.clone();
            let mut layer = Some(layer);
            let slot = watcher.watch(move |_event| {
                let Some(l) = layer.take() else {
                    return WatchControl::Stop;
                };
                let done = progress.clone();
                let notify = Notify::callback(move |r| {
                    if let Err(e) = r {
                        done.errors
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((index, e));
                    }
                    done.completed.fetch_add(1, Ordering::AcqRel);
                });
                let req = PagedWriteRequest {
                    src: &src,
                    src_pages: l.src_pages,
                    dst: &dst,
                    dst_pages: l.dst_pages,
                    page_len: l.page_len,
                    imm: Some(imm),
                };
                progress.submitted.fetch_add(1, Ordering::AcqRel);
                // A refused submit is also reported through `notify`.
                let _ = engine.submit_paged_write(req, notify);
                WatchControl::Stop
            })?;
            slots.push(slot);
        }
        Ok(Self { slots, progress })
    }

    /// Slot of layer `layer` (its `device` address goes to the kernel).
    pub fn slot(&self, layer: usize) -> Option<SlotAddr> {
        self.slots.get(layer).copied()
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.slots.len()
    }

    /// Layers submitted so far.
    pub fn submitted(&self) -> u64 {
        self.progress.submitted.load(Ordering::Acquire)
    }

    /// Layers whose write finished (successfully or not).
    pub fn completed(&self) -> u64 {
        self.progress.completed.load(Ordering::Acquire)
    }

    /// Failed layers and their errors.
    pub fn errors(&self) -> Vec<(usize, TransferError)> {
        self.progress
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
