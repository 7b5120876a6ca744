//! Registered memory (`Region`), peers (`Peer`) and their regions (`RemoteRegion`).

use std::sync::{Arc, Mutex};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use transfer_core::{
    EngineAddress, LocalRegion, MemoryLocation, MemorySpan, RemoteRegion as CoreRemote,
    RemoteTarget, TransferEngine, TransferError,
};

use crate::engine::Shared;
use crate::error::{IntoPy, invalid};
use crate::signal::lock;

/// What keeps a region's memory alive: the buffer export of a Python
/// object (which also stops it from resizing), or the owner given with a
/// raw pointer.
pub(crate) enum Memory {
    Buffer {
        _export: PyUntypedBuffer,
    },
    Raw {
        _owner: Option<Py<PyAny>>,
    },
    /// The unconsumed capsule of a `__dlpack__` export (see `dlpack.rs`):
    /// its managed tensor references the exporter's tensor.
    Dlpack {
        _capsule: Py<PyAny>,
    },
}

/// Memory registered with the engine's NICs: peers write into it, and it
/// is the source of local writes. Created by `Engine.register(obj)`; keeps
/// `obj` (and its buffer export: a bytearray cannot be resized meanwhile)
/// alive until `unregister()` or the engine closes.
#[pyclass(frozen, module = "transfer")]
pub struct Region {
    pub(crate) shared: Arc<Shared>,
    pub(crate) region: LocalRegion,
    memory: Mutex<Option<Memory>>,
    obj: Option<Py<PyAny>>,
    descriptor: Vec<u8>,
}

/// How a caller described the memory to register.
enum Source {
    Buffer(PyUntypedBuffer),
    Raw { ptr: usize, len: usize },
    Dlpack(crate::dlpack::DlpackSpan),
}

/// The error for memory the package cannot register yet.
fn gpu_unsupported(what: &str) -> PyErr {
    invalid(
        "register",
        format!(
            "{what}: GPU memory is not supported by the Python package yet \
             (host memory only: numpy arrays, bytearray, memoryview, CPU tensors through \
             __dlpack__, or (ptr, nbytes, \"cpu\"))"
        ),
    )
}

/// Whether `obj` describes device memory through DLPack or the CUDA array interface.
fn is_device_array(obj: &Bound<'_, PyAny>) -> bool {
    if obj.hasattr("__cuda_array_interface__").unwrap_or(false) {
        return true;
    }
    // DLPack device types: 1 is kDLCPU, 3 kDLCUDAHost; everything else is a device.
    obj.call_method0("__dlpack_device__")
        .and_then(|d| d.get_item(0)?.extract::<i64>())
        .is_ok_and(|t| t != 1 && t != 3)
}

/// Parses the device of a raw `(ptr, nbytes, device)` registration.
fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<MemoryLocation> {
    if device.is_none() {
        return Ok(MemoryLocation::Host);
    }
    if let Ok(s) = device.extract::<String>() {
        let s = s.trim().to_ascii_lowercase();
        if s == "cpu" || s == "host" {
            return Ok(MemoryLocation::Host);
        }
        if s == "cuda" || s.starts_with("cuda:") {
            return Err(gpu_unsupported(&format!("device {s:?}")));
        }
        return Err(invalid(
            "register",
            format!("unknown device {s:?} (expected \"cpu\" or \"cuda:N\")"),
        ));
    }
    if device.extract::<u32>().is_ok() {
        return Err(gpu_unsupported("an integer device is a CUDA ordinal"));
    }
    Err(invalid(
        "register",
        "device must be \"cpu\", \"cuda:N\" or None",
    ))
}

fn source_of(call: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Source> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        if t.len() != 3 {
            return Err(invalid(
                "register",
                format!(
                    "a raw region is (ptr, nbytes, device), got {} items",
                    t.len()
                ),
            ));
        }
        let ptr: usize = t
            .get_item(0)?
            .extract()
            .map_err(|_| invalid("register", "ptr must be a non-negative integer address"))?;
        let len: usize = t
            .get_item(1)?
            .extract()
            .map_err(|_| invalid("register", "nbytes must be a non-negative integer"))?;
        match parse_device(&t.get_item(2)?)? {
            MemoryLocation::Host => {}
            MemoryLocation::Cuda { .. } => return Err(gpu_unsupported("device memory")),
        }
        return Ok(Source::Raw { ptr, len });
    }
    match PyUntypedBuffer::get(obj) {
        Ok(buf) => Ok(Source::Buffer(buf)),
        Err(_) if is_device_array(obj) => Err(gpu_unsupported(&type_name(obj))),
        Err(_) if crate::dlpack::exports(obj) => crate::dlpack::span(call, obj).map(Source::Dlpack),
        Err(e) => Err(invalid(
            call,
            format!(
                "{} supports neither the buffer protocol ({e}) nor __dlpack__; pass a numpy \
                 array, bytearray, memoryview, a CPU tensor, or (ptr, nbytes, \"cpu\")",
                type_name(obj)
            ),
        )),
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".to_owned(), |n| n.to_string())
}

impl Region {
    /// Registers `obj` (see `Engine.register`).
    pub(crate) fn register(
        shared: &Arc<Shared>,
        obj: &Bound<'_, PyAny>,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        Self::register_as(shared, obj, owner, "register", false)
    }

    /// Registers `obj` for one submit call of `call` that only reads from
    /// it (`write_batch` from an unregistered buffer or tensor): read-only
    /// buffers (bytes) are accepted, since its descriptor is never handed
    /// to a peer.
    pub(crate) fn register_source(
        shared: &Arc<Shared>,
        obj: &Bound<'_, PyAny>,
        call: &'static str,
    ) -> PyResult<Self> {
        Self::register_as(shared, obj, None, call, true)
    }

    fn register_as(
        shared: &Arc<Shared>,
        obj: &Bound<'_, PyAny>,
        owner: Option<Py<PyAny>>,
        call: &'static str,
        read_only_ok: bool,
    ) -> PyResult<Self> {
        let py = obj.py();
        let (ptr, len, memory, keep) = match source_of(call, obj)? {
            Source::Buffer(buf) => {
                if buf.readonly() && !read_only_ok {
                    return Err(invalid(
                        call,
                        format!(
                            "{} is read-only; peers write into registered memory \
                             (use a bytearray or a writable numpy array)",
                            type_name(obj)
                        ),
                    ));
                }
                if !buf.is_c_contiguous() {
                    return Err(invalid(
                        call,
                        "the buffer is not C-contiguous (numpy: np.ascontiguousarray)",
                    ));
                }
                let ptr = buf.buf_ptr() as usize;
                let len = buf.len_bytes();
                let keep = owner.unwrap_or_else(|| obj.clone().unbind());
                (ptr, len, Memory::Buffer { _export: buf }, Some(keep))
            }
            Source::Raw { ptr, len } => {
                let keep = owner.as_ref().map(|o| o.clone_ref(py));
                (ptr, len, Memory::Raw { _owner: owner }, keep)
            }
            Source::Dlpack(d) => {
                let keep = owner.unwrap_or_else(|| obj.clone().unbind());
                let memory = Memory::Dlpack {
                    _capsule: d.capsule,
                };
                (d.ptr, d.len, memory, Some(keep))
            }
        };
        if ptr == 0 || len == 0 {
            return Err(invalid(call, "empty or null memory"));
        }
        let span = MemorySpan {
            ptr: ptr as *mut u8,
            len,
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        let span = SendSpan(span);
        let region = py
            .detach(|| {
                shared.with(call, |e: &TransferEngine| {
                    let span = span;
                    // SAFETY: the memory stays valid while registered: a
                    // buffer export pins the object (and forbids resizing),
                    // and an unconsumed DLPack capsule keeps its managed
                    // tensor (see `dlpack.rs`), until `Memory` is dropped,
                    // which happens only after a successful unregister or
                    // once the engine (and with it every registration) is
                    // gone (`Region::release`, `Shared::pin`); a raw span is
                    // the caller's promise, documented on `Engine.register`.
                    unsafe { e.register(span.0) }
                })
            })
            .py()?;
        let descriptor = region.remote().to_bytes().py()?;
        Ok(Self {
            shared: shared.clone(),
            region,
            memory: Mutex::new(Some(memory)),
            obj: keep,
            descriptor,
        })
    }

    /// Unregisters and releases the memory; on failure (transfers in
    /// flight) the memory is handed to the engine, which releases it when it closes.
    fn release(&self, call: &'static str, strict: bool) -> PyResult<()> {
        let Some(memory) = lock(&self.memory).take() else {
            return Ok(());
        };
        let outcome = self.shared.with(call, |e| e.unregister(&self.region));
        match outcome {
            // Unregistered, or the engine is gone (and every registration with it).
            Ok(()) | Err(TransferError::Shutdown { .. }) => {
                drop(memory);
                Ok(())
            }
            Err(e) if strict => {
                *lock(&self.memory) = Some(memory);
                Err(e).py()
            }
            Err(_) => {
                self.shared.pin(memory);
                Ok(())
            }
        }
    }
}

/// A span moved into a closure that runs with the GIL released.
struct SendSpan(MemorySpan);
// SAFETY: the span is plain data (address, length); the memory it names is
// kept alive by the caller across the call.
unsafe impl Send for SendSpan {}

#[pymethods]
impl Region {
    /// The descriptor a peer needs to write into this region (`Peer.remote`).
    #[getter]
    fn descriptor<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.descriptor)
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.region.len()
    }

    fn __len__(&self) -> usize {
        self.region.len()
    }

    /// Address of the first byte.
    #[getter]
    fn ptr(&self) -> usize {
        self.region.as_ptr() as usize
    }

    /// The registered object (or the owner of a raw region), if any.
    #[getter]
    fn obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.obj.as_ref().map(|o| o.clone_ref(py))
    }

    /// Whether the region is still registered.
    #[getter]
    fn registered(&self) -> bool {
        lock(&self.memory).is_some()
    }

    /// Unregisters the region and releases the object. Raises
    /// `TransferError` (kind "region_busy") while transfers that read from
    /// it are in flight; the region stays usable then.
    fn unregister(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.release("unregister", true))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.unregister(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<Region {} bytes at {:#x}{}>",
            self.region.len(),
            self.region.as_ptr() as usize,
            if self.registered() {
                ""
            } else {
                " unregistered"
            }
        )
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = self.release("Region.__del__", false);
    }
}

/// A peer engine, from `Engine.connect(address)`.
#[pyclass(frozen, module = "transfer")]
pub struct Peer {
    pub(crate) shared: Arc<Shared>,
    pub(crate) peer: transfer_core::Peer,
    address: Vec<u8>,
}

impl Peer {
    pub(crate) fn connect(shared: &Arc<Shared>, address: Vec<u8>) -> PyResult<Self> {
        let addr = EngineAddress::from_bytes(&address).py()?;
        let peer = shared.with("connect", |e| e.peer(&addr)).py()?;
        Ok(Self {
            shared: shared.clone(),
            peer,
            address,
        })
    }

    pub(crate) fn core_address(&self) -> &EngineAddress {
        self.peer.address()
    }
}

#[pymethods]
impl Peer {
    /// The peer's address, as its `Engine.address` gave it.
    #[getter]
    fn address<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.address)
    }

    /// A region of this peer, from the descriptor its `Region.descriptor` gave.
    fn remote(slf: &Bound<'_, Self>, descriptor: &Bound<'_, PyAny>) -> PyResult<RemoteRegion> {
        let this = slf.get();
        let bytes = crate::engine::bytes_arg("descriptor", descriptor)?;
        let region = CoreRemote::from_bytes(&bytes).py()?;
        let target = this
            .shared
            .with("remote", |e| e.remote(&this.peer, region))
            .py()?;
        Ok(RemoteRegion {
            shared: this.shared.clone(),
            target,
            peer: slf.clone().unbind(),
            descriptor: bytes,
        })
    }

    /// Forgets this peer's connection state, so that a restarted peer at
    /// the same address is reached afresh by the next `Engine.connect`.
    fn forget(&self) -> PyResult<()> {
        self.shared
            .with("forget", |e| e.forget_peer(&self.peer))
            .py()
    }

    fn __repr__(&self) -> String {
        format!("<Peer {}>", self.peer.id())
    }
}

/// A region of a peer: the target of writes. From `Peer.remote(descriptor)`.
#[pyclass(frozen, module = "transfer")]
pub struct RemoteRegion {
    pub(crate) shared: Arc<Shared>,
    pub(crate) target: RemoteTarget,
    peer: Py<Peer>,
    descriptor: Vec<u8>,
}

#[pymethods]
impl RemoteRegion {
    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.target.region().len
    }

    fn __len__(&self) -> usize {
        usize::try_from(self.target.region().len).unwrap_or(usize::MAX)
    }

    /// The peer that owns the region.
    #[getter]
    fn peer(&self, py: Python<'_>) -> Py<Peer> {
        self.peer.clone_ref(py)
    }

    /// The descriptor this target was made from.
    #[getter]
    fn descriptor<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.descriptor)
    }

    fn __repr__(&self) -> String {
        format!(
            "<RemoteRegion {} bytes of peer {}>",
            self.target.region().len,
            self.target.peer().id()
        )
    }
}
