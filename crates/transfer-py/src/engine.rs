//! `Engine`: the TransferEngine over libfabric, as Python sees it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use ::transfer::{Backend, BackendConfig, BackendError, BackendFamily, Domains};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use transfer_core::{
    BarrierRequest, EngineAddress, IdlePolicy, PagedWriteRequest, Pages, ProgressMode,
    Result as CoreResult, ScatterItem, ScatterRequest, SendRequest, TransferEngine, TransferError,
    WriteRequest, WriteShape,
};

use crate::error::{IntoPy, invalid, py_err};
use crate::pages;
use crate::region::{Memory, Peer, Region, RemoteRegion};
use crate::signal::{LoopWaker, Signal, lock};
use crate::transfer::{Op, Transfer, deadline, timeout_error};

/// The state every object of one engine shares.
pub(crate) struct Shared {
    /// `None` once closed. Calls hold the read lock while they use the
    /// engine; `close` drops the engine under the write lock, so that
    /// nobody sees `None` while NIC registrations still exist.
    engine: RwLock<Option<TransferEngine>>,
    /// Memory of regions dropped while transfers still used them: released
    /// once the engine (and every registration) is gone.
    pinned: Mutex<Vec<Memory>>,
    recv: Arc<RecvQueue>,
    /// Immediate expectations, failed by `close`: the engine's own
    /// expectation futures outlive it (they share its counters).
    expectations: Mutex<Expectations>,
    /// Caller-driven progress (`progress="caller"`): no worker threads;
    /// waits drive the NICs on the waiting thread.
    pub(crate) caller: bool,
}

#[derive(Default)]
struct Expectations {
    ops: Vec<Weak<Op>>,
    /// Length after the last sweep of finished entries.
    swept: usize,
}

impl Expectations {
    fn add(&mut self, op: &Arc<Op>) {
        if self.ops.len() >= 2 * self.swept.max(64) {
            self.ops
                .retain(|w| w.upgrade().is_some_and(|op| op.poll().is_none()));
            self.swept = self.ops.len();
        }
        self.ops.push(Arc::downgrade(op));
    }
}

impl Shared {
    /// Runs `f` on the engine, or fails with `Shutdown` once closed.
    pub(crate) fn with<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&TransferEngine) -> CoreResult<T>,
    ) -> CoreResult<T> {
        let guard = self.engine.read().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(e) => f(e),
            None => Err(TransferError::Shutdown { call }),
        }
    }

    /// One progress pass of a caller-driven engine (GIL released by the
    /// caller); `false` with worker threads, or once closed.
    pub(crate) fn progress(&self) -> bool {
        self.caller && self.with("progress", |e| Ok(e.progress())).unwrap_or(false)
    }

    /// Keeps `memory` until the engine is closed.
    pub(crate) fn pin(&self, memory: Memory) {
        let closed = self
            .engine
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none();
        if closed {
            drop(memory);
        } else {
            lock(&self.pinned).push(memory);
        }
    }

    /// Stops the engine (every transfer still in flight fails with
    /// `Shutdown`), then releases pinned memory. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut guard = self.engine.write().unwrap_or_else(PoisonError::into_inner);
            // Dropped under the lock: see `Shared::engine`.
            drop(guard.take());
        });
        self.recv.close();
        let expectations = std::mem::take(&mut lock(&self.expectations).ops);
        for op in expectations.iter().filter_map(Weak::upgrade) {
            op.abandon(TransferError::Shutdown { call: "expect_imm" });
        }
        let pinned = std::mem::take(&mut *lock(&self.pinned));
        drop(pinned);
    }

    fn closed(&self) -> bool {
        self.engine
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// Messages from the receive pool, waiting for `Engine.recv`.
pub(crate) struct RecvQueue {
    state: Mutex<RecvState>,
    signal: Arc<Signal>,
    dropped: AtomicU64,
}

struct RecvState {
    messages: VecDeque<Vec<u8>>,
    backlog: usize,
    closed: bool,
}

impl RecvQueue {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(RecvState {
                messages: VecDeque::new(),
                backlog: 0,
                closed: false,
            }),
            signal: Signal::new(),
            dropped: AtomicU64::new(0),
        })
    }

    /// Runs on the engine's callback thread: no Python here.
    fn push(&self, msg: &[u8]) {
        {
            let mut s = lock(&self.state);
            if s.messages.len() >= s.backlog {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            s.messages.push_back(msg.to_vec());
        }
        self.signal.notify();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.signal.notify();
    }

    /// A message, `Ok(None)` when none is queued, `Err` once closed and empty.
    fn pop(&self) -> CoreResult<Option<Vec<u8>>> {
        let mut s = lock(&self.state);
        match s.messages.pop_front() {
            Some(m) => Ok(Some(m)),
            None if s.closed => Err(TransferError::Shutdown { call: "recv" }),
            None => Ok(None),
        }
    }
}

/// The bytes of a bytes-like argument (bytes, bytearray, memoryview, numpy).
pub(crate) fn bytes_arg(what: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let buf = PyUntypedBuffer::get(obj)
        .map_err(|_| invalid("bytes argument", format!("{what} must be bytes-like")))?;
    if !buf.is_c_contiguous() {
        return Err(invalid(
            "bytes argument",
            format!("{what} must be C-contiguous"),
        ));
    }
    let len = buf.len_bytes();
    let mut out = vec![0u8; len];
    // SAFETY: the export keeps `len` bytes at `buf_ptr` valid while `buf`
    // lives; the GIL is held, and `out` has exactly `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(buf.buf_ptr().cast::<u8>(), out.as_mut_ptr(), len) };
    Ok(out)
}

/// How often opening shm endpoints is retried past names taken by stale
/// files (see `open`); a killed process leaves one per endpoint it had.
const SHM_NAME_ATTEMPTS: usize = 256;

/// Opens the domains `Engine(...)` asks for, through the `transfer`
/// crate's [`Backend`] (the one copy of "provider name -> domains").
fn open(
    provider: Option<&str>,
    nics: Option<usize>,
    bind: Option<&str>,
    peer_timeout: Option<f64>,
    busy_poll: bool,
    progress: ProgressMode,
) -> CoreResult<(TransferEngine, String, usize)> {
    const CALL: &str = "Engine";
    if nics == Some(0) {
        return Err(TransferError::invalid(CALL, "nics must be at least 1"));
    }
    let mut backend = match provider {
        Some(p) => Backend::libfabric(p),
        // TRANSFER_PROVIDER, else EFA when present, else tcp: the libfabric
        // half of detection (backend="auto" stays libfabric here).
        None => Backend::from_config(BackendConfig {
            backend: Some(BackendFamily::Libfabric.to_string()),
            ..BackendConfig::default()
        })?,
    };
    if let Some(ip) = bind {
        backend = backend.bind(ip);
    }
    if let Some(t) = peer_timeout {
        let d = Duration::try_from_secs_f64(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                TransferError::invalid(
                    CALL,
                    format!("peer_timeout {t} is not a positive number of seconds"),
                )
            })?;
        backend = backend.peer_timeout(d);
    }
    if let Some(n) = nics {
        backend = backend.nics(n);
    }
    let shm = backend.name() == "shm";
    let mut attempt = 0;
    let domains = loop {
        match backend.open_domains() {
            // shm names endpoints `<pid>-<counter>`, and its files in
            // /dev/shm outlive their process: a process that reuses the
            // PID of one that left them collides (fi_enable: EBUSY). Each
            // attempt takes the next counter value, past the stale names.
            Err(BackendError::Open {
                source: TransferError::Backend { code, .. },
                ..
            }) if code == libc::EBUSY && shm && attempt < SHM_NAME_ATTEMPTS => {
                attempt += 1;
            }
            other => break other?,
        }
    };
    let name = match &domains {
        Domains::Libfabric(nics) => nics
            .first()
            .map_or_else(|| backend.name(), |d| d.provider_name()),
        Domains::Verbs(_) => backend.name(),
    };
    let count = domains.len();
    let engine = domains
        .add_to(
            TransferEngine::builder()
                .idle_policy(idle_policy(busy_poll))
                .progress(progress),
        )
        .build()?;
    Ok((engine, name, count))
}

/// The native ibverbs backend (ConnectX, soft-RoCE): `nics` domains on the
/// device `TRANSFER_VERBS_DEVICE` names (default: the first with an active
/// port); port and GID index from the TRANSFER_VERBS_* environment.
fn open_verbs(
    nics: Option<usize>,
    busy_poll: bool,
    progress: ProgressMode,
) -> CoreResult<(TransferEngine, String, usize)> {
    if nics == Some(0) {
        return Err(TransferError::invalid("Engine", "nics must be at least 1"));
    }
    let backend = Backend::verbs(None).nics(nics.unwrap_or(1));
    let device = backend.verbs_config().and_then(|c| c.device);
    let domains = backend.open_domains()?;
    let count = domains.len();
    let engine = domains
        .add_to(
            TransferEngine::builder()
                .idle_policy(idle_policy(busy_poll))
                .progress(progress),
        )
        .build()?;
    let name = format!(
        "ibverbs {}",
        device.as_deref().unwrap_or("(first active device)")
    );
    Ok((engine, name, count))
}

/// `busy_poll=True`: workers never sleep (dedicated cores).
fn idle_policy(busy_poll: bool) -> IdlePolicy {
    if busy_poll {
        IdlePolicy::busy_poll()
    } else {
        IdlePolicy::default()
    }
}

/// Whether `a` and `b` belong to the same engine.
fn same(a: &Arc<Shared>, b: &Arc<Shared>, what: &str) -> PyResult<()> {
    if Arc::ptr_eq(a, b) {
        Ok(())
    } else {
        Err(invalid(
            "engine",
            format!("{what} belongs to another Engine"),
        ))
    }
}

/// A TransferEngine: registers memory, writes into peers' memory with
/// optional 32-bit immediates, counts the immediates it receives, and sends
/// small messages. Thread-safe; every blocking call releases the GIL.
#[pyclass(frozen, module = "transfer")]
pub struct Engine {
    shared: Arc<Shared>,
    address: Vec<u8>,
    provider: String,
    nics: usize,
}

impl Engine {
    fn check_src(&self, src: &Region) -> PyResult<()> {
        same(&self.shared, &src.shared, "the source region")
    }

    fn check_dst(&self, dst: &RemoteRegion) -> PyResult<()> {
        same(&self.shared, &dst.shared, "the destination")
    }

    /// Submits `req` with the GIL released and wraps its `Pending`.
    fn start<'a, R>(
        &self,
        py: Python<'_>,
        req: R,
        what: &'static str,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<Transfer>
    where
        R: Into<transfer_core::Request<'a>> + Send,
    {
        let req: transfer_core::Request<'a> = req.into();
        let small = transfer_core::assist::assists(req.bytes());
        let pending = py
            .detach(|| self.shared.with(what, move |e| e.start(req)))
            .py()?;
        Ok(Transfer::new(
            Box::pin(pending),
            what,
            keep,
            &self.shared,
            small,
        ))
    }
}

#[pymethods]
impl Engine {
    /// Starts an engine. `backend`: "auto" or "libfabric" (libfabric), or
    /// "verbs" (the native ibverbs backend: ConnectX, soft-RoCE; the device
    /// from TRANSFER_VERBS_DEVICE, else the first with an active port).
    /// `provider`:
    /// a libfabric provider ("tcp", "shm", "efa", ...; default: the
    /// `TRANSFER_PROVIDER` variable, else EFA when present, else tcp).
    /// `nics`: NICs (domains) to use (default: every EFA NIC; on tcp two
    /// endpoints, a connection each per peer, large writes and batches
    /// split over both; else 1).
    /// `bind`: the IP address IP providers bind to (e.g. "127.0.0.1").
    /// `peer_timeout`: seconds before an operation to a silent peer fails
    /// (default 5). `busy_poll`: workers never sleep (lowest latency, one
    /// core each). `progress`: "thread" (default: worker threads move the
    /// NICs; waits block on a hand-off from them, after polling for
    /// `TRANSFER_WAIT_SPIN_US` microseconds, default 0) or "caller" (no worker
    /// threads: `progress()` and every wait, `done()`, `recv` drive the NICs
    /// on the calling thread with the GIL released, spinning until done or
    /// the deadline; nothing moves between calls, so a target that only
    /// receives must call `progress()` or wait).
    #[new]
    #[pyo3(signature = (backend="auto", provider=None, nics=None, *, bind=None, peer_timeout=None, busy_poll=false, progress="thread"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: &str,
        provider: Option<String>,
        nics: Option<usize>,
        bind: Option<String>,
        peer_timeout: Option<f64>,
        busy_poll: bool,
        progress: &str,
    ) -> PyResult<Self> {
        let mode = match progress {
            "thread" => ProgressMode::Thread,
            "caller" => ProgressMode::Caller,
            other => {
                return Err(invalid(
                    "Engine",
                    format!("unknown progress {other:?} (\"thread\" or \"caller\")"),
                ));
            }
        };
        if busy_poll && mode == ProgressMode::Caller {
            return Err(invalid(
                "Engine",
                "busy_poll=True sets how worker threads idle; progress=\"caller\" has none",
            ));
        }
        let verbs = match backend {
            "auto" | "libfabric" => false,
            "verbs" | "ibverbs" => true,
            other => {
                return Err(invalid(
                    "Engine",
                    format!("unknown backend {other:?} (\"auto\", \"libfabric\" or \"verbs\")"),
                ));
            }
        };
        if verbs && (provider.is_some() || bind.is_some()) {
            return Err(invalid(
                "Engine",
                "provider= and bind= are libfabric options; the verbs device comes from TRANSFER_VERBS_DEVICE",
            ));
        }
        let (engine, provider, nics) = py
            .detach(|| {
                if verbs {
                    open_verbs(nics, busy_poll, mode)
                } else {
                    open(
                        provider.as_deref(),
                        nics,
                        bind.as_deref(),
                        peer_timeout,
                        busy_poll,
                        mode,
                    )
                }
            })
            .py()?;
        let address = engine.address().to_bytes().py()?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine: RwLock::new(Some(engine)),
                pinned: Mutex::new(Vec::new()),
                recv: RecvQueue::new(),
                expectations: Mutex::new(Expectations::default()),
                caller: mode == ProgressMode::Caller,
            }),
            address,
            provider,
            nics,
        })
    }

    /// This engine's address: hand it to peers (`Engine.connect`).
    #[getter]
    fn address<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.address)
    }

    /// The libfabric provider in use (e.g. "tcp;ofi_rxm", "shm", "efa").
    #[getter]
    fn provider(&self) -> &str {
        &self.provider
    }

    /// The backend ("libfabric" or "verbs").
    #[getter]
    fn backend(&self) -> &'static str {
        if self.provider.starts_with("ibverbs") {
            "verbs"
        } else {
            "libfabric"
        }
    }

    /// "thread" (worker threads) or "caller" (caller-driven progress).
    #[getter]
    fn progress_mode(&self) -> &'static str {
        if self.shared.caller {
            "caller"
        } else {
            "thread"
        }
    }

    /// One progress pass of a caller-driven engine (GIL released): posts
    /// queued work, polls every NIC, counts immediates, completes
    /// transfers. Returns whether anything happened. With worker threads a
    /// no-op returning False.
    fn progress(&self, py: Python<'_>) -> bool {
        if !self.shared.caller {
            return false;
        }
        py.detach(|| self.shared.progress())
    }

    /// Number of NICs (domains).
    #[getter]
    fn nics(&self) -> usize {
        self.nics
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.closed()
    }

    /// A peer from its address (`Engine.address` on its side). Cheap: the
    /// connection is set up by the first transfer.
    fn connect(&self, address: &Bound<'_, PyAny>) -> PyResult<Peer> {
        let bytes = bytes_arg("address", address)?;
        Peer::connect(&self.shared, bytes)
    }

    /// Registers memory for transfers: anything with the writable buffer
    /// protocol (numpy array, bytearray, memoryview), an object exporting
    /// `__dlpack__` in host memory (a torch CPU tensor; C-contiguous; its
    /// capsule is kept, unconsumed, while registered), or a tuple
    /// `(ptr, nbytes, device)` with device "cpu" (the caller keeps that
    /// memory valid; `owner` is kept referenced for it). The region keeps
    /// the object referenced until unregistered or the engine closes.
    #[pyo3(signature = (obj, *, owner=None))]
    fn register(&self, obj: &Bound<'_, PyAny>, owner: Option<Py<PyAny>>) -> PyResult<Region> {
        Region::register(&self.shared, obj, owner)
    }

    /// Writes `nbytes` (default: the rest of `src` after `src_offset`) of
    /// `src` into `dst`; with `imm`, the peer counts one logical arrival
    /// (see `expected_imms`). `nbytes=0` with `imm` sends the immediate only.
    #[pyo3(signature = (src, dst, *, src_offset=0, dst_offset=0, nbytes=None, imm=None))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        py: Python<'_>,
        src: &Bound<'_, Region>,
        dst: &Bound<'_, RemoteRegion>,
        src_offset: u64,
        dst_offset: u64,
        nbytes: Option<u64>,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        let (s, d) = (src.get(), dst.get());
        self.check_src(s)?;
        self.check_dst(d)?;
        let len = match nbytes {
            Some(n) => n,
            None => (s.region.len() as u64)
                .checked_sub(src_offset)
                .ok_or_else(|| {
                    invalid(
                        "write",
                        format!("src_offset {src_offset} is past the region's end"),
                    )
                })?,
        };
        let req = WriteRequest {
            src: &s.region,
            src_offset,
            dst: &d.target,
            dst_offset,
            len,
            imm,
        };
        self.start(py, req, "write", Some(src.clone().into_any().unbind()))
    }

    /// Writes pages: `src_pages[i]` of `src` to `dst_pages[i]` of `dst`,
    /// `page_len` bytes each. Page `p` starts at `offset + p * stride`
    /// (stride default: `page_len`). Page lists: numpy arrays (uint32
    /// best, any integer type works) or sequences of ints.
    #[pyo3(signature = (src, src_pages, dst, dst_pages, page_len, *, src_stride=None, dst_stride=None, src_offset=0, dst_offset=0, imm=None))]
    #[allow(clippy::too_many_arguments)]
    fn write_paged(
        &self,
        py: Python<'_>,
        src: &Bound<'_, Region>,
        src_pages: &Bound<'_, PyAny>,
        dst: &Bound<'_, RemoteRegion>,
        dst_pages: &Bound<'_, PyAny>,
        page_len: u64,
        src_stride: Option<u64>,
        dst_stride: Option<u64>,
        src_offset: u64,
        dst_offset: u64,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        let (s, d) = (src.get(), dst.get());
        self.check_src(s)?;
        self.check_dst(d)?;
        let req = PagedWriteRequest {
            src: &s.region,
            src_pages: Pages {
                indices: pages::indices(src_pages, "src_pages")?,
                stride: src_stride.unwrap_or(page_len),
                offset: src_offset,
            },
            dst: &d.target,
            dst_pages: Pages {
                indices: pages::indices(dst_pages, "dst_pages")?,
                stride: dst_stride.unwrap_or(page_len),
                offset: dst_offset,
            },
            page_len,
            imm,
        };
        self.start(
            py,
            req,
            "write_paged",
            Some(src.clone().into_any().unbind()),
        )
    }

    /// Scatters slices of `src`: `items` are `(dst, src_offset,
    /// dst_offset, nbytes)` tuples, each like one write (so each receiver
    /// counts `expected_imms(nbytes=...)` arrivals per item).
    #[pyo3(signature = (src, items, *, imm=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        src: &Bound<'_, Region>,
        items: &Bound<'_, PyAny>,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        let s = src.get();
        self.check_src(s)?;
        let mut list = Vec::new();
        for item in items.try_iter()? {
            let item = item?;
            let t = item.cast::<PyTuple>().map_err(|_| {
                invalid(
                    "scatter",
                    "each item is a (dst, src_offset, dst_offset, nbytes) tuple",
                )
            })?;
            if t.len() != 4 {
                return Err(invalid(
                    "scatter",
                    "each item is a (dst, src_offset, dst_offset, nbytes) tuple",
                ));
            }
            let dst = t.get_item(0)?;
            let dst = dst
                .cast::<RemoteRegion>()
                .map_err(|_| invalid("scatter", "an item's dst is not a RemoteRegion"))?
                .get();
            self.check_dst(dst)?;
            list.push(ScatterItem {
                dst: dst.target.clone(),
                src_offset: t.get_item(1)?.extract()?,
                dst_offset: t.get_item(2)?.extract()?,
                len: t.get_item(3)?.extract()?,
            });
        }
        let req = ScatterRequest {
            src: &s.region,
            items: list,
            imm,
        };
        self.start(py, req, "scatter", Some(src.clone().into_any().unbind()))
    }

    /// Posts many writes into `dst` with ONE call and ONE completion,
    /// zero-copy: `triples` are `(src_offset, dst_offset, nbytes)` rows (an
    /// `(N, 3)` integer numpy array, copied in one pass without a Python
    /// object per row, or a sequence of 3-tuples). `src` is a `Region`; a
    /// sequence of regions with `triples` a sequence of as many row lists
    /// (one engine request per region, joined into the one `Transfer`); or
    /// unregistered host memory: any C-contiguous buffer (numpy, bytes,
    /// bytearray, memoryview) or object exporting `__dlpack__` (a torch
    /// CPU tensor), registered for this call and kept, with its exporter,
    /// until the `Transfer` is dropped (a `Transfer` dropped before it
    /// completed leaves that memory registered and referenced until the
    /// engine closes, as any region dropped in flight; register memory
    /// written from repeatedly once instead: registering costs a system
    /// call or more per call on EFA). With `imm`, each row delivers like one write
    /// (`expected_imms(nbytes=...)` per row).
    #[pyo3(signature = (src, dst, triples, *, imm=None))]
    fn write_batch(
        &self,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, RemoteRegion>,
        triples: &Bound<'_, PyAny>,
        imm: Option<u32>,
    ) -> PyResult<Transfer> {
        const CALL: &str = "write_batch";
        let d = dst.get();
        self.check_dst(d)?;
        let items = |rows: Vec<(u64, u64, u64)>| -> PyResult<Vec<ScatterItem>> {
            if rows.is_empty() {
                return Err(invalid(CALL, "no rows to write"));
            }
            Ok(rows
                .into_iter()
                .map(|(src_offset, dst_offset, len)| ScatterItem {
                    dst: d.target.clone(),
                    src_offset,
                    dst_offset,
                    len,
                })
                .collect())
        };
        if let Ok(one) = src.cast::<Region>() {
            let s = one.get();
            self.check_src(s)?;
            let req = ScatterRequest {
                src: &s.region,
                items: items(pages::triples(triples)?)?,
                imm,
            };
            return self.start(py, req, CALL, Some(one.clone().into_any().unbind()));
        }
        if PyUntypedBuffer::get(src).is_ok() || crate::dlpack::exports(src) {
            // An unregistered buffer or tensor: registered for this call
            // only. The transfer keeps the region (and with it the buffer
            // export or DLPack capsule) until it is dropped; dropping the
            // region unregisters it, or hands the memory to the engine
            // until it closes if writes are still in flight.
            let rows = items(pages::triples(triples)?)?;
            let region = Bound::new(py, Region::register_source(&self.shared, src, CALL)?)?;
            let req = ScatterRequest {
                src: &region.get().region,
                items: rows,
                imm,
            };
            return self.start(py, req, CALL, Some(region.clone().into_any().unbind()));
        }
        let regions: Vec<Bound<'_, Region>> = src
            .try_iter()
            .and_then(|it| {
                it.map(|r| r.and_then(|r| Ok(r.cast_into::<Region>()?)))
                    .collect()
            })
            .map_err(|_| {
                invalid(
                    CALL,
                    "src must be a Region, a sequence of Regions, a C-contiguous buffer or a \
                     host-memory __dlpack__ exporter (a raw (ptr, nbytes, device) is registered \
                     first: Engine.register)",
                )
            })?;
        let lists: Vec<Bound<'_, PyAny>> =
            triples
                .try_iter()
                .and_then(|it| it.collect())
                .map_err(|_| {
                    invalid(
                        CALL,
                        "with several regions, triples is a sequence of row lists",
                    )
                })?;
        if regions.is_empty() || regions.len() != lists.len() {
            return Err(invalid(
                CALL,
                format!(
                    "{} source regions but {} row lists (one per region, at least one)",
                    regions.len(),
                    lists.len()
                ),
            ));
        }
        // Regions and row lists are checked before anything is posted;
        // ranges are checked by the engine at submit: a range refused
        // after earlier regions went out fails the one Transfer with that
        // error once those finished (writes cannot be called back).
        let mut reqs = Vec::with_capacity(regions.len());
        for (r, rows) in regions.iter().zip(&lists) {
            self.check_src(r.get())?;
            reqs.push(items(pages::triples(rows)?)?);
        }
        let bytes = reqs
            .iter()
            .flatten()
            .fold(0u64, |a, i| a.saturating_add(i.len));
        let small = transfer_core::assist::assists(bytes);
        let mut futs: Vec<crate::transfer::EngineFuture> = Vec::with_capacity(reqs.len());
        let mut refused = None;
        let srcs: Vec<&Region> = regions.iter().map(|r| r.get()).collect();
        py.detach(|| {
            for (r, list) in srcs.into_iter().zip(reqs) {
                let req = ScatterRequest {
                    src: &r.region,
                    items: list,
                    imm,
                };
                match self.shared.with(CALL, move |e| e.start(req)) {
                    Ok(p) => futs.push(Box::pin(p)),
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
        });
        if let Some(e) = refused {
            if futs.is_empty() {
                return Err(py_err(e));
            }
            futs.push(Box::pin(std::future::ready(Err(e))));
        }
        let keep = pyo3::types::PyList::new(py, &regions)?.into_any().unbind();
        Ok(Transfer::new(
            Box::pin(crate::transfer::JoinAll::new(futs)),
            CALL,
            Some(keep),
            &self.shared,
            small,
        ))
    }

    /// Sends the immediate `imm` (a zero-byte write) to every target:
    /// each receiver counts exactly one arrival.
    fn barrier(&self, py: Python<'_>, targets: &Bound<'_, PyAny>, imm: u32) -> PyResult<Transfer> {
        let mut list = Vec::new();
        if let Ok(one) = targets.cast::<RemoteRegion>() {
            self.check_dst(one.get())?;
            list.push(one.get().target.clone());
        } else {
            for t in targets.try_iter()? {
                let t = t?;
                let r = t
                    .cast::<RemoteRegion>()
                    .map_err(|_| invalid("barrier", "targets must be RemoteRegions"))?
                    .get();
                self.check_dst(r)?;
                list.push(r.target.clone());
            }
        }
        self.start(py, BarrierRequest::to(&list, imm), "barrier", None)
    }

    /// Sends a small message (copied at once) to `peer`'s receive pool.
    fn send(
        &self,
        py: Python<'_>,
        peer: &Bound<'_, Peer>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Transfer> {
        let p = peer.get();
        same(&self.shared, &p.shared, "the peer")?;
        let bytes = bytes_arg("data", data)?;
        let req = SendRequest {
            peer: &p.peer,
            data: &bytes,
        };
        self.start(py, req, "send", None)
    }

    /// Starts receiving messages: `count` buffers of `size` bytes (the
    /// largest message). Up to `backlog` messages wait for `recv`; more are
    /// dropped and counted (`recv_dropped`). Once per engine.
    #[pyo3(signature = (count=64, size=65536, *, backlog=65536))]
    fn start_recv_pool(
        &self,
        py: Python<'_>,
        count: usize,
        size: usize,
        backlog: usize,
    ) -> PyResult<()> {
        lock(&self.shared.recv.state).backlog = backlog;
        let queue = self.shared.recv.clone();
        py.detach(|| {
            self.shared.with("start_recv_pool", |e| {
                e.start_recv_pool(count, size, move |msg| queue.push(msg))
            })
        })
        .py()
    }

    /// The next message; blocks (GIL released) up to `timeout` seconds
    /// (`None`: no limit), then raises `TransferTimeout`.
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyBytes>> {
        let queue = &self.shared.recv;
        let deadline = deadline(timeout)?;
        // The first slice polls briefly before it blocks (see `Signal::wait_past`).
        let mut spin = transfer_core::spin_wait::window();
        loop {
            let seen = queue.signal.generation();
            if let Some(m) = queue.pop().py()? {
                return Ok(PyBytes::new(py, &m));
            }
            let slice_end = std::time::Instant::now() + Duration::from_millis(50);
            let until = deadline.map_or(slice_end, |d| d.min(slice_end));
            let changed = py.detach(|| {
                if self.shared.caller {
                    // Nothing else moves a caller-driven engine: drive it
                    // here until a message is queued.
                    crate::transfer::drive_until(&self.shared, until, || {
                        queue.signal.generation() != seen
                    })
                } else {
                    queue.signal.wait_past(seen, until, spin)
                }
            });
            spin = Duration::ZERO;
            if !changed {
                if let Some(d) = deadline
                    && std::time::Instant::now() >= d
                {
                    if let Some(m) = queue.pop().py()? {
                        return Ok(PyBytes::new(py, &m));
                    }
                    return Err(py_err(timeout_error("recv", timeout)));
                }
                py.check_signals()?;
            }
        }
    }

    /// The next message if one is queued, else None.
    /// A caller-driven engine runs one progress pass first.
    fn try_recv<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        if self.shared.caller {
            py.detach(|| self.shared.progress());
        }
        Ok(self.shared.recv.pop().py()?.map(|m| PyBytes::new(py, &m)))
    }

    /// Awaitable `recv` for asyncio.
    fn recv_async<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("transfer._aio")?
            .getattr("recv")?
            .call1((slf,))
    }

    /// Messages dropped because `backlog` messages were already waiting.
    #[getter]
    fn recv_dropped(&self) -> u64 {
        self.shared.recv.dropped.load(Ordering::Relaxed)
    }

    /// Internal (asyncio): push `token` to `waker` at the next message.
    fn _notify_recv(&self, waker: &LoopWaker, token: u64) {
        let queue = &self.shared.recv;
        queue.signal.add_notifier(waker.inner.clone(), token);
        let s = lock(&queue.state);
        // Caller-driven: nobody else would make a message arrive, so the
        // loop comes back at once and `try_recv` drives a pass.
        if !s.messages.is_empty() || s.closed || self.shared.caller {
            waker.inner.push(token);
        }
    }

    /// Internal (asyncio): withdraws a `_notify_recv` whose waiter went away
    /// (cancelled, timed out) before a message came.
    fn _forget_recv(&self, waker: &LoopWaker, token: u64) {
        self.shared.recv.signal.remove_notifier(&waker.inner, token);
    }

    /// Internal (tests): asyncio receivers registered on the receive pool.
    fn _recv_notifiers(&self) -> usize {
        self.shared.recv.signal.notifiers()
    }

    /// A `Transfer` that completes once `count` immediates `imm` arrived
    /// (consuming them). Expectations on one value are served in order.
    /// Dropping or cancelling it before then withdraws it.
    #[pyo3(signature = (imm, count=1))]
    fn expect_imm(&self, imm: u32, count: u64) -> PyResult<Transfer> {
        // Under the engine's read lock, so that `close` cannot miss it.
        let op = self
            .shared
            .with("expect_imm", |e| {
                let op = Op::new(Box::pin(e.imm_future(imm, count)), &self.shared, true);
                lock(&self.shared.expectations).add(&op);
                Ok(op)
            })
            .py()?;
        Ok(Transfer::expectation(op))
    }

    /// Blocks (GIL released) until `count` immediates `imm` arrived, then
    /// consumes them; raises `TransferTimeout` after `timeout` seconds (the
    /// expectation is withdrawn then).
    #[pyo3(signature = (imm, count=1, timeout=None))]
    fn wait_imm(&self, py: Python<'_>, imm: u32, count: u64, timeout: Option<f64>) -> PyResult<()> {
        let t = self.expect_imm(imm, count)?;
        match t.op.block(py, timeout) {
            Ok(Some(r)) => r.py(),
            Ok(None) => {
                // Withdraw; if it was met meanwhile, that counts.
                if t.op.cancel() {
                    Err(py_err(timeout_error("wait_imm", timeout)))
                } else {
                    t.op.poll().cloned().unwrap_or(Ok(())).py()
                }
            }
            Err(e) => {
                t.op.cancel();
                Err(e)
            }
        }
    }

    /// Arrivals of `imm` not consumed by an expectation yet.
    fn imm_value(&self, imm: u32) -> PyResult<u64> {
        self.shared.with("imm_value", |e| Ok(e.imm_value(imm))).py()
    }

    /// Takes up to `count` pending arrivals of `imm` (when no expectation
    /// waits on it); returns how many were taken. For polling receivers.
    fn take_imm(&self, imm: u32, count: u64) -> PyResult<u64> {
        self.shared
            .with("take_imm", |e| Ok(e.take_imm(imm, count)))
            .py()
    }

    /// Immediate arrivals dropped because too many distinct unexpected
    /// values were held (a peer sent values nobody waits for).
    #[getter]
    fn imm_dropped(&self) -> PyResult<u64> {
        self.shared
            .with("imm_dropped", |e| Ok(e.imm_dropped()))
            .py()
    }

    /// How many immediates one logical transfer from `sender` (a `Peer`
    /// or its address) delivers here: give `nbytes` for a write (or one
    /// scatter item), `pages` (and `page_len` if pages may be large) for a
    /// paged write, or `barrier=True`.
    #[pyo3(signature = (sender, *, nbytes=None, pages=None, page_len=None, barrier=false, sender_group=0, my_group=0))]
    #[allow(clippy::too_many_arguments)]
    fn expected_imms(
        &self,
        sender: &Bound<'_, PyAny>,
        nbytes: Option<u64>,
        pages: Option<usize>,
        page_len: Option<u64>,
        barrier: bool,
        sender_group: usize,
        my_group: usize,
    ) -> PyResult<u64> {
        const CALL: &str = "expected_imms";
        let shape = match (nbytes, pages, page_len, barrier) {
            (Some(len), None, None, false) => WriteShape::Single { len },
            (None, Some(pages), None, false) => WriteShape::Paged { pages },
            (None, Some(pages), Some(page_len), false) => {
                WriteShape::PagedSized { pages, page_len }
            }
            (None, None, None, true) => WriteShape::Barrier,
            _ => {
                return Err(invalid(
                    CALL,
                    "give exactly one shape: nbytes=, pages= (with optional page_len=), or barrier=True",
                ));
            }
        };
        let addr = match sender.cast::<Peer>() {
            Ok(p) => p.get().core_address().clone(),
            Err(_) => EngineAddress::from_bytes(&bytes_arg("sender", sender)?).py()?,
        };
        self.shared
            .with(CALL, |e| {
                e.expected_imms(&addr, sender_group, my_group, shape)
            })
            .py()
    }

    /// Stops the engine: transfers in flight fail with `EngineShutdown`,
    /// NICs close, threads are joined, registered objects are released.
    /// Idempotent; also runs when the engine is garbage-collected.
    fn close(&self, py: Python<'_>) {
        self.shared.close(py);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "<Engine {} x{}{}>",
            self.provider,
            self.nics,
            if self.shared.closed() { " closed" } else { "" }
        )
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        Python::attach(|py| self.shared.close(py));
    }
}
