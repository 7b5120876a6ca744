//! The UVM watcher: GPU code bumps 64-bit slots in host-mapped memory; one
//! thread notices each change and reports `(slot, old, new)` to that
//! slot's callback, which says whether to keep watching.
//!
//! Better than fabric-lib's watcher (512 fixed slots, plain loads, a thread
//! spinning forever): slots grow by pages, every read is an atomic
//! `Acquire` load the compiler cannot cache or hoist, only watched slots are
//! scanned, and the thread spins, then parks with growing timeouts, and
//! parks for good while nothing is watched.
//!
//! Events: a slot that changes several times between two scans is reported
//! once, with `old` the value last reported and `new` the current one; so
//! for every slot the events chain (`old` of one is `new` of the previous,
//! the first `old` is 0) and the last `new` is the slot's latest value.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread, ThreadId};

use crossbeam_queue::SegQueue;
use transfer_core::IdlePolicy;

use crate::context::CudaContext;
use crate::error::{CudaError, Result};
use crate::idle::{IdleLoop, Rest};
use crate::memory::{MemoryProvider, PinnedHostMemory};
use crate::slots::{DEFAULT_SLOTS_PER_PAGE, SlotAddr, SlotAllocator, SlotId};

/// One observed change of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchEvent {
    /// The slot.
    pub slot: SlotId,
    /// The value reported last time (0 for the first event).
    pub old: u64,
    /// The value now.
    pub new: u64,
}

/// What a callback wants after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchControl {
    /// Keep watching the slot.
    Keep,
    /// Stop watching; the slot returns to the allocator for reuse.
    Stop,
}

/// A slot's callback. It runs on the watcher thread: keep it short (submit
/// work, set a flag); a slow callback delays every other slot's events.
pub type WatchCallback = Box<dyn FnMut(WatchEvent) -> WatchControl + Send + 'static>;

/// How a watcher is set up.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// How the thread waits when no slot changes (default: transfer-core's
    /// default, spin 200 µs then park 20 µs..1 ms; [`IdlePolicy::busy_poll`]
    /// for the lowest latency at the cost of one core).
    pub idle: IdlePolicy,
    /// Slots per allocation page (default 512: one 4 KiB page).
    pub slots_per_page: usize,
    /// Name of the watcher thread.
    pub thread_name: String,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        Self {
            idle: IdlePolicy::default(),
            slots_per_page: DEFAULT_SLOTS_PER_PAGE,
            thread_name: "transfer-watcher".into(),
        }
    }
}

/// Counters of a watcher thread (for tests and monitoring).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatcherStats {
    /// Events delivered to callbacks.
    pub events: u64,
    /// Scans over the watched slots.
    pub scans: u64,
    /// Times the thread parked.
    pub parks: u64,
    /// Callbacks that panicked (their slots were stopped).
    pub panicked: u64,
}

struct Entry {
    addr: SlotAddr,
    last: u64,
    callback: WatchCallback,
}

enum Command {
    Watch(Entry),
    Unwatch(SlotId),
}

struct Shared {
    slots: Mutex<SlotAllocator>,
    commands: SegQueue<Command>,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
    events: AtomicU64,
    scans: AtomicU64,
    parks: AtomicU64,
    panicked: AtomicU64,
    watched: AtomicU64,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, SlotAllocator> {
        // The allocator's state stays consistent across a panic elsewhere.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// Watches slots of host-mapped memory from one thread. Dropping it stops
/// and joins the thread (callbacks still registered are dropped unrun).
pub struct Watcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("slots", &*self.shared.slots())
            .finish()
    }
}

impl Watcher {
    /// A watcher whose slots come from `provider`.
    pub fn new(provider: impl MemoryProvider, config: WatcherConfig) -> Result<Self> {
        let shared = Arc::new(Shared {
            slots: Mutex::new(SlotAllocator::from_box(
                Box::new(provider),
                config.slots_per_page,
            )),
            commands: SegQueue::new(),
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            events: AtomicU64::new(0),
            scans: AtomicU64::new(0),
            parks: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
            watched: AtomicU64::new(0),
        });
        let inner = shared.clone();
        let idle = config.idle;
        let thread = std::thread::Builder::new()
            .name(config.thread_name)
            .spawn(move || run(&inner, idle))
            .map_err(|e| CudaError::Watcher {
                reason: format!("spawning the watcher thread: {e}"),
            })?;
        let thread_id = thread.thread().id();
        // First and only set; the thread parks until unparked, so a wake
        // before this line is impossible (nothing can be watched yet).
        let _ = shared.thread.set(thread.thread().clone());
        Ok(Self {
            shared,
            thread: Some(thread),
            thread_id,
        })
    }

    /// A watcher whose slots live in pinned host memory mapped into
    /// `ctx`'s device: what GPU kernels and stream operations write.
    pub fn pinned(ctx: Arc<CudaContext>, config: WatcherConfig) -> Result<Self> {
        Self::new(PinnedHostMemory::new(ctx), config)
    }

    /// Allocates a slot (set to 0) and watches it: `callback` hears every
    /// change until it returns [`WatchControl::Stop`] or [`Watcher::unwatch`]
    /// is called. Hand [`SlotAddr::device`] to the GPU code that bumps it.
    pub fn watch(
        &self,
        callback: impl FnMut(WatchEvent) -> WatchControl + Send + 'static,
    ) -> Result<SlotAddr> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(CudaError::Watcher {
                reason: "the watcher is shutting down".into(),
            });
        }
        let addr = self.shared.slots().alloc()?;
        self.shared.watched.fetch_add(1, Ordering::Relaxed);
        // The baseline is the 0 just stored, not a value read later by the
        // thread: a bump landing before the thread picks the command up is
        // still reported.
        self.shared.commands.push(Command::Watch(Entry {
            addr,
            last: 0,
            callback: Box::new(callback),
        }));
        self.shared.wake();
        Ok(addr)
    }

    /// Stops watching `id` (asynchronously: an event already being
    /// delivered may still run); the slot is then freed for reuse. The
    /// caller guarantees no GPU code writes the slot any more, and calls
    /// this only for a slot it still watches: once its callback returned
    /// [`WatchControl::Stop`] or after one `unwatch`, the id may already
    /// belong to someone else. Unwatching a slot that is not watched does
    /// nothing.
    pub fn unwatch(&self, id: SlotId) {
        self.shared.commands.push(Command::Unwatch(id));
        self.shared.wake();
    }

    /// Reads a slot's current value (watched or not).
    pub fn load(&self, id: SlotId) -> Result<u64> {
        self.shared.slots().load(id)
    }

    /// Slots being watched (including ones whose watch is still queued).
    pub fn watched(&self) -> u64 {
        self.shared.watched.load(Ordering::Relaxed)
    }

    /// Pages the slot allocator has grown to.
    pub fn pages(&self) -> usize {
        self.shared.slots().pages()
    }

    /// The kind of memory slots live in.
    pub fn provider_kind(&self) -> &'static str {
        self.shared.slots().provider_kind()
    }

    /// The thread's counters.
    pub fn stats(&self) -> WatcherStats {
        let s = &self.shared;
        WatcherStats {
            events: s.events.load(Ordering::Relaxed),
            scans: s.scans.load(Ordering::Relaxed),
            parks: s.parks.load(Ordering::Relaxed),
            panicked: s.panicked.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            // Dropped from inside a callback: the thread exits on its own.
            if std::thread::current().id() != self.thread_id {
                let _ = t.join();
            }
        }
    }
}

fn run(shared: &Shared, policy: IdlePolicy) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut finished: Vec<SlotId> = Vec::new();
    let mut idle = IdleLoop::new(policy);
    let (mut events, mut scans, mut parks, mut panicked) = (0u64, 0u64, 0u64, 0u64);
    while !shared.stop.load(Ordering::Acquire) {
        while let Some(cmd) = shared.commands.pop() {
            match cmd {
                Command::Watch(e) => entries.push(e),
                // In order: an unwatch only affects a watch queued before it.
                Command::Unwatch(id) => {
                    if let Some(i) = entries.iter().position(|e| e.addr.id == id) {
                        entries.swap_remove(i);
                        let _ = shared.slots().free(id);
                        shared.watched.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let mut changed = false;
        for e in &mut entries {
            // SAFETY: the slot lies in a page owned by `shared.slots`, which
            // lives as long as this thread (the Arc) and never frees pages.
            let now = unsafe { (*e.addr.host).load(Ordering::Acquire) };
            if now == e.last {
                continue;
            }
            let event = WatchEvent {
                slot: e.addr.id,
                old: e.last,
                new: now,
            };
            e.last = now;
            changed = true;
            events += 1;
            let control = catch_unwind(AssertUnwindSafe(|| (e.callback)(event)));
            match control {
                Ok(WatchControl::Keep) => {}
                Ok(WatchControl::Stop) => finished.push(e.addr.id),
                Err(_) => {
                    panicked += 1;
                    finished.push(e.addr.id);
                }
            }
        }
        scans += 1;
        if !finished.is_empty() {
            finished.sort_unstable();
            finished.dedup();
            let before = entries.len();
            entries.retain(|e| finished.binary_search(&e.addr.id).is_err());
            let removed = before - entries.len();
            let mut slots = shared.slots();
            for id in finished.drain(..) {
                let _ = slots.free(id);
            }
            drop(slots);
            shared.watched.fetch_sub(removed as u64, Ordering::Relaxed);
        }
        shared.events.store(events, Ordering::Relaxed);
        shared.scans.store(scans, Ordering::Relaxed);
        shared.panicked.store(panicked, Ordering::Relaxed);
        if changed {
            idle.active();
        } else if shared.commands.is_empty()
            && !shared.stop.load(Ordering::Acquire)
            && idle.idle(entries.is_empty()) == Rest::Parked
        {
            parks += 1;
            shared.parks.store(parks, Ordering::Relaxed);
        }
    }
}
