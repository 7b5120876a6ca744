//! The ggml backend itself: registry, devices, buffer types, buffers,
//! backends (streams) and events, as C callbacks over [`Conn`]. Every
//! callback catches panics and answers its documented failure value.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock};

use transfer_rpc::hash::fnv1a64;
use transfer_rpc::protocol::tensor::MAX_SRC;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};

use crate::abi::*;
use crate::conn::{Conn, Done, check_posted};
use crate::error::{PluginError, Result};
use crate::host::{self, Host, Layout};
use crate::serialize;

/// Upstream's threshold for trying SET_TENSOR_HASH on weights.
const HASH_THRESHOLD: usize = 10 * 1024 * 1024;
/// Bound of each device's GET_ALLOC_SIZE answer cache.
const ALLOC_CACHE_CAP: usize = 4096;

/// A raw pointer that may sit in a static or cross threads: every pointee
/// is either leaked for the process' life (registries, devices, buffer
/// types) or owned by the host, which orders its use.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: see the type's documentation.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: see the type's documentation.
unsafe impl<T> Sync for SendPtr<T> {}

/// How the plugin presents itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Installed as `libggml-rpc-<variant>.so`: the "RPC" registry that
    /// `--rpc` and llama-bench talk to.
    Rpc,
    /// Loaded by `GGML_BACKEND_PATH`: registry "TRPC", servers from
    /// [`ENV_SERVERS`].
    Own,
}

/// Environment variable of the own-name mode: `host:port,host:port,...`.
pub const ENV_SERVERS: &str = "TRANSFER_RPC_SERVERS";

/// Runs `f`, turning a panic into `fallback` and one log line.
pub fn guard<R>(call: &str, fallback: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            host::log(LOG_ERROR, &format!("{call}: internal error (panic caught)"));
            fallback
        }
    }
}

/// A host call into the timeline (`TRANSFER_RPC_TRACE`, see
/// `transfer_rpc::client::trace`).
fn trace_host(conn: &Conn, what: &str) {
    if transfer_rpc::client::trace::enabled() {
        transfer_rpc::client::trace::event(format_args!("{} HOST {what}", conn.endpoint()));
    }
}

fn log_err(call: &str, e: &PluginError) {
    // A server's first failure was logged when it happened; the calls that
    // fail fast after it would only repeat it.
    if !matches!(e, PluginError::Failed { .. }) {
        host::log(LOG_ERROR, &format!("{call}: {e}"));
    }
}

// ---------------------------------------------------------------- registry

enum RegKind {
    /// The "RPC" registry: no devices of its own; `add_server` makes more.
    RpcBase,
    /// The registry `add_server` returns for one server.
    Server(Vec<SendPtr<GgmlDevice>>),
    /// The "TRPC" registry: devices from [`ENV_SERVERS`], on first use.
    Own,
}

struct RegCtx {
    name: CString,
    kind: RegKind,
}

struct DevCtx {
    conn: Arc<Conn>,
    index: u32,
    name: CString,
    desc: CString,
    buft: OnceLock<SendPtr<c_void>>,
    last_graph: Mutex<Option<GraphPayload>>,
}

struct BuftCtx {
    conn: Arc<Conn>,
    index: u32,
    name: CString,
    alignment: usize,
    max_size: usize,
    alloc_sizes: Mutex<HashMap<u64, usize>>,
}

struct BufCtx {
    conn: Arc<Conn>,
    remote: u64,
    base: u64,
}

struct BackendCtx {
    conn: Arc<Conn>,
    dev: SendPtr<GgmlDevice>,
    index: u32,
    name: CString,
}

struct EventCtx {
    conn: Arc<Conn>,
    done: Mutex<Option<Arc<Done>>>,
}

static BASE_REG: OnceLock<SendPtr<GgmlReg>> = OnceLock::new();
static MODE: OnceLock<Mode> = OnceLock::new();
static GUID: OnceLock<SendPtr<[u8; 16]>> = OnceLock::new();
static OWN_DEVICES: OnceLock<Vec<SendPtr<GgmlDevice>>> = OnceLock::new();

struct Registry {
    conns: HashMap<String, Arc<Conn>>,
    server_regs: HashMap<String, SendPtr<GgmlReg>>,
    next_dev: u32,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let r = g.get_or_insert_with(|| Registry {
        conns: HashMap::new(),
        server_regs: HashMap::new(),
        next_dev: 0,
    });
    f(r)
}

/// The connection to `endpoint`, shared by every device, buffer and
/// backend on it (one ordered stream per server, like upstream's dispatcher).
fn conn_for(reg: &mut Registry, endpoint: &str) -> Result<Arc<Conn>> {
    if let Some(c) = reg.conns.get(endpoint) {
        if c.failure().is_none() {
            return Ok(c.clone());
        }
    }
    let c = Conn::connect(endpoint)?;
    reg.conns.insert(endpoint.to_owned(), c.clone());
    Ok(c)
}

/// The mode, from the file name the plugin was loaded as.
pub fn mode() -> Mode {
    *MODE.get_or_init(|| {
        let name = self_path().unwrap_or_default();
        let file = std::path::Path::new(&name)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file.starts_with("libggml-rpc-") {
            Mode::Rpc
        } else {
            Mode::Own
        }
    })
}

/// The path of the library this code was loaded from.
pub fn self_path() -> Option<String> {
    // SAFETY: an all-zero Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = crate::ggml_backend_init as *const c_void;
    // SAFETY: dladdr only reads the loader's tables for an address of our
    // own code.
    let ok = unsafe { libc::dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the loader's NUL-terminated path.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// The registry `ggml_backend_init` returns: the same pointer every call.
pub fn base_reg(host: &Host) -> *mut GgmlReg {
    BASE_REG
        .get_or_init(|| {
            let (name, kind) = match mode() {
                Mode::Rpc => (c"RPC", RegKind::RpcBase),
                Mode::Own => (c"TRPC", RegKind::Own),
            };
            let ctx = leak(RegCtx {
                name: name.to_owned(),
                kind,
            });
            SendPtr(leak(GgmlReg {
                api_version: host.layout.api_version(),
                iface: REG_I,
                context: ctx.cast(),
            }))
        })
        .0
}

const REG_I: RegI = RegI {
    get_name: Some(reg_get_name),
    get_device_count: Some(reg_get_device_count),
    get_device: Some(reg_get_device),
    get_proc_address: Some(reg_get_proc_address),
};

unsafe fn reg_ctx<'a>(reg: RegT) -> Option<&'a RegCtx> {
    if reg.is_null() {
        return None;
    }
    // SAFETY: only our registries carry REG_I, and their context is a
    // leaked RegCtx.
    unsafe { (*reg).context.cast::<RegCtx>().as_ref() }
}

unsafe extern "C" fn reg_get_name(reg: RegT) -> *const c_char {
    guard("reg_get_name", c"RPC".as_ptr(), || {
        // SAFETY: the host passes our registry.
        unsafe { reg_ctx(reg) }.map_or(c"RPC".as_ptr(), |c| c.name.as_ptr())
    })
}

fn reg_devices(ctx: &RegCtx) -> &[SendPtr<GgmlDevice>] {
    match &ctx.kind {
        RegKind::RpcBase => &[],
        RegKind::Server(d) => d,
        RegKind::Own => own_devices(),
    }
}

unsafe extern "C" fn reg_get_device_count(reg: RegT) -> usize {
    guard("reg_get_device_count", 0, || {
        // SAFETY: the host passes our registry.
        unsafe { reg_ctx(reg) }.map_or(0, |c| reg_devices(c).len())
    })
}

unsafe extern "C" fn reg_get_device(reg: RegT, index: usize) -> DevT {
    guard("reg_get_device", std::ptr::null_mut(), || {
        // SAFETY: the host passes our registry.
        unsafe { reg_ctx(reg) }
            .and_then(|c| reg_devices(c).get(index).map(|d| d.0))
            .unwrap_or(std::ptr::null_mut())
    })
}

unsafe extern "C" fn reg_get_proc_address(_reg: RegT, name: *const c_char) -> *mut c_void {
    guard("reg_get_proc_address", std::ptr::null_mut(), || {
        if name.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: the host passes a NUL-terminated name.
        let n = unsafe { CStr::from_ptr(name) };
        match n.to_bytes() {
            b"ggml_backend_rpc_add_server" => crate::ggml_backend_rpc_add_server as *mut c_void,
            b"ggml_backend_rpc_add_device" => crate::ggml_backend_rpc_add_device as *mut c_void,
            b"ggml_backend_rpc_start_server" => crate::ggml_backend_rpc_start_server as *mut c_void,
            _ => std::ptr::null_mut(),
        }
    })
}

/// Devices of one server, named `<prefix><n>` with a process-wide counter
/// (upstream numbers RPC devices across servers the same way).
fn make_devices(
    reg: &mut Registry,
    endpoint: &str,
    prefix: &str,
    owner: RegT,
) -> Result<Vec<SendPtr<GgmlDevice>>> {
    let conn = conn_for(reg, endpoint)?;
    let n = conn.call("DEVICE_COUNT", |c| c.device_count())?;
    let mut out = Vec::new();
    for index in 0..n {
        let id = reg.next_dev;
        reg.next_dev += 1;
        let ctx = leak(DevCtx {
            conn: conn.clone(),
            index,
            name: CString::new(format!("{prefix}{id}")).unwrap_or_default(),
            desc: CString::new(format!("{endpoint} (transfer-rpc)")).unwrap_or_default(),
            buft: OnceLock::new(),
            last_graph: Mutex::new(None),
        });
        out.push(SendPtr(leak(GgmlDevice {
            iface: DEVICE_I,
            reg: owner,
            context: ctx.cast(),
        })));
    }
    Ok(out)
}

fn own_devices() -> &'static [SendPtr<GgmlDevice>] {
    OWN_DEVICES.get_or_init(|| {
        let Some(&SendPtr(owner)) = BASE_REG.get() else {
            return Vec::new();
        };
        let list = std::env::var(ENV_SERVERS).unwrap_or_default();
        let mut all = Vec::new();
        for ep in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match with_registry(|r| make_devices(r, ep, "TRPC", owner)) {
                Ok(d) => all.extend(d),
                Err(e) => log_err(&format!("{ENV_SERVERS} server {ep}"), &e),
            }
        }
        if all.is_empty() {
            host::log(
                LOG_WARN,
                &format!("no devices: set {ENV_SERVERS}=host:port[,host:port...]"),
            );
        }
        all
    })
}

/// `ggml_backend_rpc_add_server`: the per-server registry (its devices'
/// `reg` is the "RPC" registry, as upstream), the same pointer for the
/// same endpoint; NULL (logged) when the server cannot be reached.
pub fn add_server(endpoint: &str) -> Result<RegT> {
    let h = host::host()?;
    let base = base_reg(h);
    with_registry(|r| {
        if let Some(p) = r.server_regs.get(endpoint) {
            return Ok(p.0);
        }
        let devices = make_devices(r, endpoint, "RPC", base)?;
        let ctx = leak(RegCtx {
            name: CString::new(format!("RPC[{endpoint}]")).unwrap_or_default(),
            kind: RegKind::Server(devices),
        });
        let reg = leak(GgmlReg {
            api_version: h.layout.api_version(),
            iface: REG_I,
            context: ctx.cast(),
        });
        r.server_regs.insert(endpoint.to_owned(), SendPtr(reg));
        Ok(reg)
    })
}

// ------------------------------------------------------------------ device

const DEVICE_I: DeviceI = DeviceI {
    get_name: Some(dev_get_name),
    get_description: Some(dev_get_description),
    get_memory: Some(dev_get_memory),
    get_type: Some(dev_get_type),
    get_props: Some(dev_get_props),
    init_backend: Some(dev_init_backend),
    get_buffer_type: Some(dev_get_buffer_type),
    get_host_buffer_type: None,
    buffer_from_host_ptr: None,
    supports_op: Some(dev_supports_op),
    supports_buft: Some(dev_supports_buft),
    offload_op: None,
    event_new: Some(dev_event_new),
    event_free: Some(dev_event_free),
    event_synchronize: Some(dev_event_synchronize),
};

unsafe fn dev_ctx<'a>(dev: DevT) -> Option<&'a DevCtx> {
    if dev.is_null() {
        return None;
    }
    // SAFETY: only our devices carry DEVICE_I; their context is a leaked DevCtx.
    unsafe { (*dev).context.cast::<DevCtx>().as_ref() }
}

unsafe extern "C" fn dev_get_name(dev: DevT) -> *const c_char {
    guard("dev_get_name", c"RPC".as_ptr(), || {
        // SAFETY: the host passes our device.
        unsafe { dev_ctx(dev) }.map_or(c"RPC".as_ptr(), |d| d.name.as_ptr())
    })
}

unsafe extern "C" fn dev_get_description(dev: DevT) -> *const c_char {
    guard("dev_get_description", c"".as_ptr(), || {
        // SAFETY: the host passes our device.
        unsafe { dev_ctx(dev) }.map_or(c"".as_ptr(), |d| d.desc.as_ptr())
    })
}

fn memory(d: &DevCtx) -> (usize, usize) {
    match d
        .conn
        .call("GET_DEVICE_MEMORY", |c| c.get_device_memory(d.index))
    {
        Ok((f, t)) => (f as usize, t as usize),
        Err(e) => {
            log_err("get_memory", &e);
            (0, 0)
        }
    }
}

unsafe extern "C" fn dev_get_memory(dev: DevT, free: *mut usize, total: *mut usize) {
    guard("dev_get_memory", (), || {
        // SAFETY: the host passes our device.
        let (f, t) = unsafe { dev_ctx(dev) }.map_or((0, 0), memory);
        // SAFETY: the host passes writable out-parameters (NULL tolerated).
        unsafe {
            if !free.is_null() {
                *free = f;
            }
            if !total.is_null() {
                *total = t;
            }
        }
    })
}

unsafe extern "C" fn dev_get_type(_dev: DevT) -> c_int {
    DEVICE_TYPE_GPU
}

unsafe extern "C" fn dev_get_props(dev: DevT, props: *mut DevProps) {
    guard("dev_get_props", (), || {
        // SAFETY: the host passes our device.
        let Some(d) = (unsafe { dev_ctx(dev) }) else {
            return;
        };
        if props.is_null() {
            return;
        }
        let (f, t) = memory(d);
        // SAFETY: the host passes a writable props struct.
        unsafe {
            *props = DevProps {
                name: d.name.as_ptr(),
                description: d.desc.as_ptr(),
                memory_free: f,
                memory_total: t,
                ty: DEVICE_TYPE_GPU,
                device_id: std::ptr::null(),
                caps: DevCaps {
                    async_ops: true,
                    host_buffer: false,
                    buffer_from_host_ptr: false,
                    events: true,
                    mmap_support: true,
                },
            };
        }
    })
}

fn guid() -> *mut [u8; 16] {
    // Not upstream's RPC guid: ggml_backend_is_rpc() must not treat our
    // backends as upstream's (it would read our context as theirs).
    GUID.get_or_init(|| {
        SendPtr(leak([
            0x74, 0x72, 0x70, 0x63, 0x2d, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x70, 0x6c, 0x75, 0x67,
            0x69, 0x6e,
        ]))
    })
    .0
}

unsafe extern "C" fn dev_init_backend(dev: DevT, _params: *const c_char) -> BackendT {
    guard("dev_init_backend", std::ptr::null_mut(), || {
        // SAFETY: the host passes our device.
        let Some(d) = (unsafe { dev_ctx(dev) }) else {
            return std::ptr::null_mut();
        };
        let ctx = leak(BackendCtx {
            conn: d.conn.clone(),
            dev: SendPtr(dev),
            index: d.index,
            name: d.name.clone(),
        });
        leak(GgmlBackend {
            guid: guid(),
            iface: backend_i(),
            device: dev,
            context: ctx.cast(),
        })
    })
}

unsafe extern "C" fn dev_get_buffer_type(dev: DevT) -> BuftT {
    guard("dev_get_buffer_type", std::ptr::null_mut(), || {
        let Ok(h) = host::host() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the host passes our device.
        let Some(d) = (unsafe { dev_ctx(dev) }) else {
            return std::ptr::null_mut();
        };
        d.buft
            .get_or_init(|| {
                let alignment = d
                    .conn
                    .call("GET_ALIGNMENT", |c| c.get_alignment(d.index))
                    .map_or(32, |a| a as usize);
                let max_size = d
                    .conn
                    .call("GET_MAX_SIZE", |c| c.get_max_size(d.index))
                    .map_or(usize::MAX, |m| m as usize);
                let ctx = leak(BuftCtx {
                    conn: d.conn.clone(),
                    index: d.index,
                    name: d.name.clone(),
                    alignment,
                    max_size,
                    alloc_sizes: Mutex::new(HashMap::new()),
                });
                SendPtr(make_buft(h.layout, dev, ctx.cast()))
            })
            .0
    })
}

unsafe extern "C" fn dev_supports_op(_dev: DevT, _op: *const GgmlTensor) -> bool {
    // As upstream: the server decides (and refuses what it cannot run).
    true
}

unsafe extern "C" fn dev_supports_buft(dev: DevT, buft: BuftT) -> bool {
    guard("dev_supports_buft", false, || {
        // SAFETY: the host passes our device and any buffer type.
        let (Some(d), Some(b)) = (unsafe { dev_ctx(dev) }, unsafe { buft_ctx(buft) }) else {
            return false;
        };
        Arc::ptr_eq(&d.conn, &b.conn) && d.index == b.index
    })
}

unsafe fn event_ctx<'a>(ev: EventT) -> Option<&'a EventCtx> {
    if ev.is_null() {
        return None;
    }
    // SAFETY: events reaching our callbacks are ours (made by dev_event_new).
    unsafe { (*ev).context.cast::<EventCtx>().as_ref() }
}

unsafe extern "C" fn dev_event_new(dev: DevT) -> EventT {
    guard("dev_event_new", std::ptr::null_mut(), || {
        // SAFETY: the host passes our device.
        let Some(d) = (unsafe { dev_ctx(dev) }) else {
            return std::ptr::null_mut();
        };
        let ctx = leak(EventCtx {
            conn: d.conn.clone(),
            done: Mutex::new(None),
        });
        leak(GgmlEvent {
            device: dev,
            context: ctx.cast(),
        })
    })
}

unsafe extern "C" fn dev_event_free(_dev: DevT, ev: EventT) {
    guard("dev_event_free", (), || {
        if ev.is_null() {
            return;
        }
        // SAFETY: both boxes were leaked by dev_event_new; the host frees an
        // event once.
        unsafe {
            let e = Box::from_raw(ev);
            if !e.context.is_null() {
                drop(Box::from_raw(e.context.cast::<EventCtx>()));
            }
        }
    })
}

unsafe extern "C" fn dev_event_synchronize(_dev: DevT, ev: EventT) {
    guard("dev_event_synchronize", (), || {
        // SAFETY: the host passes our event.
        let Some(e) = (unsafe { event_ctx(ev) }) else {
            return;
        };
        let d = e.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        trace_host(&e.conn, "event_synchronize");
        if let Some(d) = d {
            if let Err(err) = e.conn.await_done(&d, "event_synchronize") {
                log_err("event_synchronize", &err);
            }
        }
    })
}

// ------------------------------------------------------------- buffer type

fn make_buft(layout: Layout, dev: DevT, ctx: *mut c_void) -> BuftT {
    match layout {
        Layout::Api2 => leak(BuftV2 {
            get_name: Some(buft_get_name),
            alloc_buffer: Some(buft_alloc_buffer),
            get_alignment: Some(buft_get_alignment),
            get_max_size: Some(buft_get_max_size),
            get_alloc_size: Some(buft_get_alloc_size),
            is_host: None,
            device: dev,
            context: ctx,
        })
        .cast(),
        Layout::Api3 => leak(BuftV3 {
            get_name: Some(buft_get_name),
            alloc_buffer: Some(buft_alloc_buffer),
            alloc_buffer_n: None,
            get_alignment: Some(buft_get_alignment),
            get_max_size: Some(buft_get_max_size),
            get_alloc_size: Some(buft_get_alloc_size),
            get_alloc_size_n: None,
            is_host: None,
            device: dev,
            context: ctx,
        })
        .cast(),
    }
}

/// Our context of a buffer type, `None` for anyone else's.
unsafe fn buft_ctx<'a>(buft: BuftT) -> Option<&'a BuftCtx> {
    if buft.is_null() {
        return None;
    }
    let ours = buft_get_name as unsafe extern "C" fn(BuftT) -> *const c_char as usize;
    // SAFETY: `get_name` is the first word of every ggml buffer type.
    let first = unsafe { *buft.cast::<usize>() };
    if first != ours {
        return None;
    }
    let layout = host::host().ok()?.layout;
    // SAFETY: ours, so made by make_buft with this layout.
    let ctx = unsafe {
        match layout {
            Layout::Api2 => (*buft.cast::<BuftV2>()).context,
            Layout::Api3 => (*buft.cast::<BuftV3>()).context,
        }
    };
    // SAFETY: a leaked BuftCtx.
    unsafe { ctx.cast::<BuftCtx>().as_ref() }
}

unsafe extern "C" fn buft_get_name(buft: BuftT) -> *const c_char {
    guard("buft_get_name", c"RPC".as_ptr(), || {
        // SAFETY: the host passes our buffer type.
        unsafe { buft_ctx(buft) }.map_or(c"RPC".as_ptr(), |b| b.name.as_ptr())
    })
}

unsafe extern "C" fn buft_get_alignment(buft: BuftT) -> usize {
    guard("buft_get_alignment", 32, || {
        // SAFETY: the host passes our buffer type.
        unsafe { buft_ctx(buft) }.map_or(32, |b| b.alignment)
    })
}

unsafe extern "C" fn buft_get_max_size(buft: BuftT) -> usize {
    guard("buft_get_max_size", usize::MAX, || {
        // SAFETY: the host passes our buffer type.
        unsafe { buft_ctx(buft) }.map_or(usize::MAX, |b| b.max_size)
    })
}

unsafe extern "C" fn buft_alloc_buffer(buft: BuftT, size: usize) -> BufT {
    guard("buft_alloc_buffer", std::ptr::null_mut(), || {
        let Ok(h) = host::host() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the host passes our buffer type.
        let Some(b) = (unsafe { buft_ctx(buft) }) else {
            return std::ptr::null_mut();
        };
        let r = b.conn.call("ALLOC_BUFFER", |c| {
            let Some((remote, rsize)) = c.alloc_buffer(b.index, size as u64)? else {
                return Ok(None);
            };
            let base = c.buffer_get_base(remote)?;
            Ok(Some((remote, rsize, base)))
        });
        match r {
            Ok(Some((remote, rsize, base))) => {
                let ctx = leak(BufCtx {
                    conn: b.conn.clone(),
                    remote,
                    base,
                });
                // SAFETY: our buffer type and the context BUFFER_I expects;
                // ggml takes ownership of the struct (and calls
                // buf_free_buffer, which frees ctx).
                unsafe { h.buffer_init(buft, BUFFER_I, ctx.cast(), rsize as usize) }
            }
            Ok(None) => {
                host::log(
                    LOG_ERROR,
                    &format!(
                        "{}: ALLOC_BUFFER of {size} bytes refused",
                        b.conn.endpoint()
                    ),
                );
                std::ptr::null_mut()
            }
            Err(e) => {
                log_err("alloc_buffer", &e);
                std::ptr::null_mut()
            }
        }
    })
}

fn alloc_key(index: u32, t: &GgmlTensor) -> u64 {
    let mut k = Vec::with_capacity(160);
    k.extend_from_slice(&index.to_le_bytes());
    k.extend_from_slice(&t.ty.to_le_bytes());
    k.extend_from_slice(&t.op.to_le_bytes());
    for p in t.op_params {
        k.extend_from_slice(&p.to_le_bytes());
    }
    for i in 0..4 {
        k.extend_from_slice(&t.ne[i].to_le_bytes());
        k.extend_from_slice(&t.nb[i].to_le_bytes());
    }
    fnv1a64(&k)
}

unsafe extern "C" fn buft_get_alloc_size(buft: BuftT, t: *const GgmlTensor) -> usize {
    guard("buft_get_alloc_size", 0, || {
        let Ok(h) = host::host() else { return 0 };
        if t.is_null() {
            return 0;
        }
        // SAFETY: the host passes a live tensor.
        let nbytes = unsafe { h.nbytes(t) };
        // SAFETY: as above.
        let r = unsafe { &*t };
        // SAFETY: the host passes our buffer type.
        let Some(b) = (unsafe { buft_ctx(buft) }) else {
            return nbytes;
        };
        // Upstream asks the server only where a backend may pad (quantized
        // rows not a multiple of 512, ops that may expand).
        let ask = (h.is_quantized(r.ty) && r.ne[0] % 512 != 0 && r.view_src.is_null())
            || h.op_may_expand(r.op);
        if !ask {
            return nbytes;
        }
        let key = alloc_key(b.index, r);
        if let Some(&v) = b
            .alloc_sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return v.max(nbytes);
        }
        let asked = (|| -> Result<u64> {
            // SAFETY: a live tensor and its live sources.
            let tensor = unsafe { serialize::tensor(h, t, None) }?;
            let mut srcs: [RpcTensor; MAX_SRC] = std::array::from_fn(|_| RpcTensor::default());
            for (o, &s) in srcs.iter_mut().zip(r.src.iter()) {
                // SAFETY: as above.
                *o = unsafe { serialize::tensor(h, s, None) }?;
            }
            b.conn.call("GET_ALLOC_SIZE", |c| {
                c.get_alloc_size(b.index, &tensor, &srcs)
            })
        })();
        match asked {
            Ok(v) => {
                let v = (v as usize).max(nbytes);
                let mut cache = b.alloc_sizes.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() >= ALLOC_CACHE_CAP {
                    cache.clear();
                }
                cache.insert(key, v);
                v
            }
            Err(e) => {
                log_err("get_alloc_size", &e);
                nbytes
            }
        }
    })
}

// ------------------------------------------------------------------ buffer

const BUFFER_I: BufferI = BufferI {
    free_buffer: Some(buf_free_buffer),
    get_base: Some(buf_get_base),
    init_tensor: Some(buf_init_tensor),
    memset_tensor: Some(buf_memset_tensor),
    set_tensor: Some(buf_set_tensor),
    get_tensor: Some(buf_get_tensor),
    set_tensor_2d: None,
    get_tensor_2d: None,
    cpy_tensor: Some(buf_cpy_tensor),
    clear: Some(buf_clear),
    reset: None,
};

unsafe fn buf_ctx<'a>(buf: BufT) -> Option<&'a BufCtx> {
    if buf.is_null() {
        return None;
    }
    // SAFETY: a live host buffer; our context only behind our interface.
    unsafe {
        let ours = buf_free_buffer as unsafe extern "C" fn(BufT) as usize;
        if (*buf).iface.free_buffer.map(|f| f as usize) != Some(ours) {
            return None;
        }
        (*buf).context.cast::<BufCtx>().as_ref()
    }
}

/// The connection of a buffer, when it is one of ours.
///
/// # Safety
/// `buf` must be NULL or a live host buffer.
unsafe fn buffer_conn(buf: BufT) -> Option<Arc<Conn>> {
    // SAFETY: the caller's contract.
    unsafe { buf_ctx(buf) }.map(|c| c.conn.clone())
}

/// The connection and remote handle of a buffer, when it is one of ours.
///
/// # Safety
/// `buf` must be NULL or a live host buffer.
pub unsafe fn buffer_remote<'a>(buf: BufT) -> Option<(&'a Conn, u64)> {
    // SAFETY: the caller's contract.
    unsafe { buf_ctx(buf) }.map(|c| (&*c.conn, c.remote))
}

unsafe extern "C" fn buf_free_buffer(buf: BufT) {
    guard("buf_free_buffer", (), || {
        if buf.is_null() {
            return;
        }
        // SAFETY: our buffer; the context was leaked by buft_alloc_buffer
        // and the host frees a buffer once.
        let ctx = unsafe { Box::from_raw((*buf).context.cast::<BufCtx>()) };
        crate::engine::forget_buffer(&ctx.conn, ctx.remote);
        if let Err(e) = ctx.conn.call("FREE_BUFFER", |c| c.free_buffer(ctx.remote)) {
            log_err("free_buffer", &e);
        }
    })
}

unsafe extern "C" fn buf_get_base(buf: BufT) -> *mut c_void {
    guard("buf_get_base", std::ptr::null_mut(), || {
        // SAFETY: the host passes our buffer.
        unsafe { buf_ctx(buf) }.map_or(std::ptr::null_mut(), |c| c.base as *mut c_void)
    })
}

/// The buffer's context and the wire record of `t` (in it).
unsafe fn buf_and_tensor<'a>(
    buf: BufT,
    t: *const GgmlTensor,
) -> Result<(&'a Host, &'a BufCtx, RpcTensor)> {
    let h = host::host()?;
    // SAFETY: the caller passes a live buffer.
    let ctx = unsafe { buf_ctx(buf) }.ok_or_else(|| PluginError::Unsupported {
        call: "buffer",
        reason: "not one of this plugin's buffers".into(),
    })?;
    // SAFETY: the caller passes a live tensor.
    let rt = unsafe { serialize::tensor(h, t, None) }?;
    Ok((h, ctx, rt))
}

unsafe extern "C" fn buf_init_tensor(buf: BufT, t: *mut GgmlTensor) -> c_int {
    guard("buf_init_tensor", GGML_STATUS_FAILED, || {
        let Ok(h) = host::host() else {
            return GGML_STATUS_FAILED;
        };
        if t.is_null() {
            return GGML_STATUS_FAILED;
        }
        // SAFETY: a live tensor.
        let r = unsafe { &*t };
        // As upstream: only quantized rows a padding backend may extend.
        if !(h.is_quantized(r.ty) && r.ne[0] % 512 != 0 && r.view_src.is_null()) {
            return GGML_STATUS_SUCCESS;
        }
        // SAFETY: live buffer and tensor.
        let res = unsafe { buf_and_tensor(buf, t) }
            .and_then(|(_, ctx, rt)| ctx.conn.call("INIT_TENSOR", |c| c.init_tensor(&rt)));
        match res {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log_err("init_tensor", &e);
                GGML_STATUS_FAILED
            }
        }
    })
}

unsafe extern "C" fn buf_memset_tensor(
    buf: BufT,
    t: *mut GgmlTensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    guard("buf_memset_tensor", (), || {
        // SAFETY: live buffer and tensor.
        let res = unsafe { buf_and_tensor(buf, t) }.and_then(|(_, ctx, rt)| {
            ctx.conn.call("MEMSET_TENSOR", |c| {
                c.memset_tensor(&rt, offset as u64, size as u64, value)
            })
        });
        if let Err(e) = res {
            log_err("memset_tensor", &e);
        }
    })
}

/// Largest `set_tensor` that is queued with a copy of its bytes rather
/// than sent after the stream drained (at most `QUEUE_CAP` of them queued:
/// 64 MiB per server).
const SMALL_SET: usize = 64 * 1024;

unsafe extern "C" fn buf_set_tensor(
    buf: BufT,
    t: *mut GgmlTensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("buf_set_tensor", (), || {
        if data.is_null() && size > 0 {
            return;
        }
        // SAFETY: live buffer and tensor.
        let res = unsafe { buf_and_tensor(buf, t) }.and_then(|(_, ctx, rt)| {
            // SAFETY: ggml passes `size` readable bytes at `data`; the
            // slice lives only during this synchronous call.
            let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) };
            // SAFETY: a live host buffer.
            let usage = unsafe { (*buf).usage };
            if size <= SMALL_SET && usage != BUFFER_USAGE_WEIGHTS {
                // A small input (positions, the KQ mask: every stage's
                // split has them) is queued with a copy of its bytes
                // instead of waiting for the stream to drain: waiting there
                // put one round trip per stage into every decode step
                // (llama-bench tg over 4 servers, 5 ms each way: 16.9 t/s
                // stock, 17.9 ours before this). SET_TENSOR has no answer,
                // and the queue keeps it ordered with the rest. It reads
                // no buffer: a boundary write need not wait for it.
                let data = bytes.to_vec();
                trace_host(&ctx.conn, "set_tensor (queued)");
                return ctx
                    .conn
                    .post_no_read(Box::new(move |c, _| {
                        c.set_tensor(&rt, offset as u64, &data)
                    }))
                    .map(drop);
            }
            trace_host(&ctx.conn, "set_tensor (after drain)");
            ctx.conn.call("SET_TENSOR", |c| {
                let mut cache = false;
                if size > HASH_THRESHOLD && usage == BUFFER_USAGE_WEIGHTS {
                    if c.set_tensor_hash(&rt, offset as u64, fnv1a64(bytes))? {
                        return Ok(());
                    }
                    cache = true;
                }
                c.set_tensor_cached(&rt, offset as u64, bytes, cache)
            })
        });
        if let Err(e) = res {
            log_err("set_tensor", &e);
        }
    })
}

unsafe extern "C" fn buf_get_tensor(
    buf: BufT,
    t: *const GgmlTensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("buf_get_tensor", (), || {
        if data.is_null() && size > 0 {
            return;
        }
        // SAFETY: live buffer and tensor.
        let res = unsafe { buf_and_tensor(buf, t) }.and_then(|(_, ctx, rt)| {
            trace_host(&ctx.conn, "get_tensor (sync)");
            ctx.conn.call("GET_TENSOR", |c| {
                c.get_tensor(&rt, offset as u64, size as u64)
            })
        });
        match res {
            Ok(v) if v.len() == size => {
                // SAFETY: ggml passes `size` writable bytes at `data`.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), data.cast::<u8>(), size) }
            }
            Ok(v) => host::log(
                LOG_ERROR,
                &format!("get_tensor: {} bytes answered, {size} asked", v.len()),
            ),
            Err(e) => log_err("get_tensor", &e),
        }
    })
}

unsafe extern "C" fn buf_cpy_tensor(
    buf: BufT,
    src: *const GgmlTensor,
    dst: *mut GgmlTensor,
) -> bool {
    guard("buf_cpy_tensor", false, || {
        let Ok(h) = host::host() else { return false };
        if src.is_null() || dst.is_null() {
            return false;
        }
        // SAFETY: live host tensors; their buffers are NULL or live.
        let (Some((sc, _)), Some(dc)) = (unsafe { buffer_remote((*src).buffer) }, unsafe {
            buf_ctx(buf)
        }) else {
            return false;
        };
        let same = std::ptr::eq(sc, &*dc.conn);
        if !same && !direct_allowed(sc, &dc.conn) {
            // ggml falls back to GET_TENSOR + SET_TENSOR through the host.
            return false;
        }
        // SAFETY: live tensors.
        let res = unsafe { serialize::tensor(h, src, None) }.and_then(|s| {
            // SAFETY: as above.
            let d = unsafe { serialize::tensor(h, dst, None) }?;
            if same {
                return dc.conn.call("COPY_TENSOR", |c| c.copy_tensor(&s, &d));
            }
            // SAFETY: a live tensor.
            let size = unsafe { h.nbytes(src) } as u64;
            // The destination's earlier commands must have run on its
            // server before the source's server writes there (the write
            // arrives over another connection).
            dc.conn.call("PEER_BARRIER", |c| c.peer_barrier())?;
            let ok = sc.call("COPY_TENSOR_TO", |c| {
                c.copy_tensor_to(&s, &d, size, dc.conn.peer_endpoint())
            })?;
            if !ok {
                give_up_direct(sc, &dc.conn, "it answered 0 to COPY_TENSOR_TO");
            }
            Ok(ok)
        });
        match res {
            Ok(ok) => ok,
            Err(e) => {
                log_err("cpy_tensor", &e);
                false
            }
        }
    })
}

unsafe extern "C" fn buf_clear(buf: BufT, value: u8) {
    guard("buf_clear", (), || {
        // SAFETY: the host passes our buffer.
        let Some(ctx) = (unsafe { buf_ctx(buf) }) else {
            return;
        };
        if let Err(e) = ctx
            .conn
            .call("BUFFER_CLEAR", |c| c.buffer_clear(ctx.remote, value))
        {
            log_err("clear", &e);
        }
    })
}

// ----------------------------------------------------------------- backend

fn backend_i() -> BackendI {
    BackendI {
        get_name: Some(be_get_name),
        free: Some(be_free),
        set_tensor_async: Some(be_set_tensor_async),
        get_tensor_async: Some(be_get_tensor_async),
        set_tensor_2d_async: None,
        get_tensor_2d_async: None,
        cpy_tensor_async: Some(be_cpy_tensor_async),
        synchronize: Some(be_synchronize),
        graph_plan_create: None,
        graph_plan_free: None,
        graph_plan_update: None,
        graph_plan_compute: None,
        graph_compute: Some(be_graph_compute),
        event_record: Some(be_event_record),
        event_wait: Some(be_event_wait),
        graph_optimize: None,
    }
}

unsafe fn be_ctx<'a>(b: BackendT) -> Option<&'a BackendCtx> {
    if b.is_null() {
        return None;
    }
    // SAFETY: backends reaching our callbacks are ours (dev_init_backend).
    unsafe { (*b).context.cast::<BackendCtx>().as_ref() }
}

unsafe extern "C" fn be_get_name(b: BackendT) -> *const c_char {
    guard("be_get_name", c"RPC".as_ptr(), || {
        // SAFETY: our backend.
        unsafe { be_ctx(b) }.map_or(c"RPC".as_ptr(), |c| c.name.as_ptr())
    })
}

unsafe extern "C" fn be_free(b: BackendT) {
    guard("be_free", (), || {
        if b.is_null() {
            return;
        }
        // SAFETY: both boxes leaked by dev_init_backend; freed once.
        unsafe {
            let be = Box::from_raw(b);
            if !be.context.is_null() {
                drop(Box::from_raw(be.context.cast::<BackendCtx>()));
            }
        }
    })
}

unsafe extern "C" fn be_set_tensor_async(
    b: BackendT,
    t: *mut GgmlTensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("be_set_tensor_async", (), || {
        let res = (|| -> Result<()> {
            let h = host::host()?;
            // SAFETY: our backend.
            let Some(ctx) = (unsafe { be_ctx(b) }) else {
                return Ok(());
            };
            if data.is_null() && size > 0 {
                return Ok(());
            }
            // SAFETY: a live tensor.
            let rt = unsafe { serialize::tensor(h, t, None) }?;
            // The host may reuse `data` once this returns: copy it now.
            // SAFETY: ggml passes `size` readable bytes at `data`.
            let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec();
            trace_host(&ctx.conn, "set_tensor_async");
            ctx.conn
                .post_no_read(Box::new(move |c, _| {
                    c.set_tensor(&rt, offset as u64, &bytes)
                }))
                .map(drop)
        })();
        if let Err(e) = res {
            log_err("set_tensor_async", &e);
        }
    })
}

unsafe extern "C" fn be_get_tensor_async(
    b: BackendT,
    t: *const GgmlTensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("be_get_tensor_async", (), || {
        let res = (|| -> Result<()> {
            let h = host::host()?;
            // SAFETY: our backend.
            let Some(ctx) = (unsafe { be_ctx(b) }) else {
                return Ok(());
            };
            if data.is_null() && size > 0 {
                return Ok(());
            }
            // SAFETY: a live tensor.
            let rt = unsafe { serialize::tensor(h, t, None) }?;
            trace_host(&ctx.conn, "get_tensor_async");
            let dst = SendPtr(data.cast::<u8>());
            ctx.conn.post(Box::new(move |c, conn| {
                let v = c.get_tensor(&rt, offset as u64, size as u64)?;
                conn.settled_by();
                if v.len() != size {
                    return Err(transfer_rpc::RpcError::malformed(
                        "GET_TENSOR",
                        format!("{} bytes answered, {size} asked", v.len()),
                    ));
                }
                let dst = dst;
                // SAFETY: ggml keeps `size` writable bytes at `data` until
                // the backend is synchronized; if_alive refuses once a
                // synchronize gave up waiting (the host took them back).
                conn.if_alive(|| unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), dst.0, size) });
                Ok(())
            }))
        })();
        if let Err(e) = res {
            log_err("get_tensor_async", &e);
        }
    })
}

unsafe extern "C" fn be_synchronize(b: BackendT) {
    guard("be_synchronize", (), || {
        // SAFETY: our backend.
        if let Some(ctx) = unsafe { be_ctx(b) } {
            trace_host(&ctx.conn, "synchronize");
            if let Err(e) = ctx.conn.synchronize("synchronize") {
                log_err("synchronize", &e);
            }
            trace_host(&ctx.conn, "synchronized");
        }
    })
}

unsafe extern "C" fn be_graph_compute(b: BackendT, g: GraphT) -> c_int {
    guard("be_graph_compute", GGML_STATUS_FAILED, || {
        let res = (|| -> Result<()> {
            let h = host::host()?;
            // SAFETY: our backend.
            let ctx = unsafe { be_ctx(b) }.ok_or_else(|| PluginError::Unsupported {
                call: "graph_compute",
                reason: "not one of this plugin's backends".into(),
            })?;
            // SAFETY: the backend's device is ours.
            let dev = unsafe { dev_ctx(ctx.dev.0) }.ok_or_else(|| PluginError::Unsupported {
                call: "graph_compute",
                reason: "backend without a device".into(),
            })?;
            // SAFETY: the host passes a live graph.
            let payload = unsafe { serialize::graph(h, g, ctx.index, &ctx.conn) }?;
            let mut last = dev.last_graph.lock().unwrap_or_else(|p| p.into_inner());
            // The server keeps the last graph per device: an identical one
            // (same tensors, same addresses) is re-run by GRAPH_RECOMPUTE.
            // Compared on the serialized form: the host's graph uid lives in
            // the opaque ggml_cgraph.
            let same = last.as_ref() == Some(&payload);
            if transfer_rpc::client::trace::enabled() {
                transfer_rpc::client::trace::event(format_args!(
                    "{} HOST graph_compute {} nodes {} tensors {}",
                    ctx.conn.endpoint(),
                    if same { "recompute" } else { "new" },
                    payload.nodes.len(),
                    payload.tensors.len()
                ));
            }
            if same {
                let index = ctx.index;
                ctx.conn
                    .post(Box::new(move |c, _| c.graph_recompute(index)))
            } else {
                *last = Some(payload.clone());
                ctx.conn
                    .post(Box::new(move |c, _| c.graph_compute(&payload)))
            }
        })();
        match res {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                log_err("graph_compute", &e);
                GGML_STATUS_FAILED
            }
        }
    })
}

unsafe extern "C" fn be_event_record(b: BackendT, ev: EventT) {
    guard("be_event_record", (), || {
        // SAFETY: our backend and event.
        let (Some(ctx), Some(e)) = (unsafe { be_ctx(b) }, unsafe { event_ctx(ev) }) else {
            return;
        };
        match ctx.conn.record() {
            Ok(d) => *e.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(d),
            Err(err) => log_err("event_record", &err),
        }
    })
}

unsafe extern "C" fn be_event_wait(b: BackendT, ev: EventT) {
    guard("be_event_wait", (), || {
        // SAFETY: our backend and event.
        let (Some(ctx), Some(e)) = (unsafe { be_ctx(b) }, unsafe { event_ctx(ev) }) else {
            return;
        };
        // One connection is one ordered stream: an event recorded on it is
        // already ordered before anything queued later.
        if Arc::ptr_eq(&ctx.conn, &e.conn) {
            return;
        }
        let d = e.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(d) = d {
            if let Err(err) = ctx.conn.wait_for(d) {
                log_err("event_wait", &err);
            }
        }
    })
}

// ------------------------------------------------------- stage boundaries

/// Pairs (source, destination) whose direct copy failed once: their
/// boundaries go through the host from then on (logged once per pair).
static HUB_PAIRS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// True when a boundary from `src` to `dst` may go server to server.
fn direct_allowed(src: &Conn, dst: &Conn) -> bool {
    if !src.can_copy_to(dst) {
        let why = "a server does not serve the transfer-rpc extension (stock rpc-server?) or TRANSFER_RPC_P2P=0";
        note_hub(src, dst, why);
        return false;
    }
    let pairs = HUB_PAIRS.lock().unwrap_or_else(|p| p.into_inner());
    !pairs
        .iter()
        .any(|(s, d)| s == src.endpoint() && d == dst.endpoint())
}

/// Logs once per pair that its boundaries go through the host.
fn note_hub(src: &Conn, dst: &Conn, why: &str) {
    let mut pairs = HUB_PAIRS.lock().unwrap_or_else(|p| p.into_inner());
    if pairs
        .iter()
        .any(|(s, d)| s == src.endpoint() && d == dst.endpoint())
    {
        return;
    }
    pairs.push((src.endpoint().to_owned(), dst.endpoint().to_owned()));
    drop(pairs);
    host::log(
        LOG_WARN,
        &format!(
            "{} -> {}: boundary copies go through this process (GET_TENSOR + SET_TENSOR): {why}",
            src.endpoint(),
            dst.endpoint()
        ),
    );
}

/// Pairs (source, destination) whose COPY_TENSOR_TO landed once: the
/// source server reaches the destination, so later copies may be ordered
/// by the destination server itself (marks) with no answer awaited.
static REACHED_PAIRS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn note_reached(src: &Conn, dst: &Conn) {
    let mut pairs = REACHED_PAIRS.lock().unwrap_or_else(|p| p.into_inner());
    if !pairs
        .iter()
        .any(|(s, d)| s == src.endpoint() && d == dst.endpoint())
    {
        pairs.push((src.endpoint().to_owned(), dst.endpoint().to_owned()));
    }
}

fn reached(src: &Conn, dst: &Conn) -> bool {
    REACHED_PAIRS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|(s, d)| s == src.endpoint() && d == dst.endpoint())
}

/// The marked path of a boundary (both servers serve the marks, the pair
/// reached each other once; the destination's barrier, if any, is already
/// ahead of this on the source's stream): the source's stream posts
/// COPY_TENSOR_TO_MARK after its graph (its server writes the data into
/// the destination, then PEER_MARK), the destination's stream posts
/// MARK_WAIT before its next command, and neither waits for an answer: the
/// destination server itself holds its next graph until the copy landed.
/// `Ok(false)` when no mark is free (use the answered path). A copy that
/// did not land fails both connections (the destination's wait would
/// otherwise time out): an error, never a hang or stale input.
fn marked_copy(
    sc: &Arc<Conn>,
    dc: &Arc<Conn>,
    s: transfer_rpc::protocol::RpcTensor,
    d: transfer_rpc::protocol::RpcTensor,
    size: u64,
) -> Result<bool> {
    let Some(key) = dc.mark_key()? else {
        return Ok(false);
    };
    let Some(seq) = dc.take_mark() else {
        return Ok(false);
    };
    let dc2 = dc.clone();
    let copy_at = sc.post_at(Box::new(move |c, _| {
        c.post_copy_tensor_to_mark(&s, &d, size, dc2.peer_endpoint(), (key, seq))?;
        check_posted(c).inspect_err(|_| {
            dc2.fail("a copy into it (COPY_TENSOR_TO_MARK) did not land");
        })
    }))?;
    let wait_ms = u32::try_from(dc.timeout().as_millis()).unwrap_or(u32::MAX);
    let wait_at = dc.post_no_read(Box::new(move |c, _| {
        c.post_mark_wait(key, seq, wait_ms)?;
        check_posted(c)
    }))?;
    // The wait ends only once the copy landed (the source server sent the
    // mark after the data): when the destination is known past its wait,
    // the source is known past its copy, and so past its graph.
    dc.note_wait(wait_at, sc, copy_at);
    Ok(true)
}

/// Gives the direct path of a pair up after a failed copy.
fn give_up_direct(src: &Conn, dst: &Conn, why: &str) {
    note_hub(src, dst, why);
}

/// Sets its flag when dropped: a waiter is released whatever path the job
/// takes (success, fallback, error).
struct SetOnDrop(Arc<Done>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Queues on the destination's stream the proof that its earlier commands
/// ran (PEER_BARRIER, skipped when its last command was answered); the
/// returned flag is set once that is known (or the attempt ended).
fn post_barrier(dc: &Arc<Conn>) -> Result<Arc<Done>> {
    let barrier = Arc::new(Done::default());
    let b = SetOnDrop(barrier.clone());
    dc.post_no_read(Box::new(move |c, dst_conn| {
        let _b = b;
        // A stream whose last command was answered needs no
        // barrier: everything before it already ran (the steady
        // state of a decode, where the logits were just read).
        if dst_conn.was_settled() {
            dst_conn.settled_by();
            return Ok(());
        }
        if c.peer_barrier()? {
            dst_conn.settled_by();
            Ok(())
        } else {
            Err(transfer_rpc::RpcError::RemoteFailure {
                call: "PEER_BARRIER",
            })
        }
    }))?;
    Ok(barrier)
}

/// On the source's stream: COPY_TENSOR_TO, or (answered 0: the peer is
/// unreachable or not allowed) GET_TENSOR here and SET_TENSOR on the
/// destination, the pair using the host path from then on.
fn copy_to_or_through_host(
    c: &mut transfer_rpc::client::Client,
    src_conn: &Conn,
    dc: &Conn,
    s: &transfer_rpc::protocol::RpcTensor,
    d: &transfer_rpc::protocol::RpcTensor,
    size: u64,
) -> transfer_rpc::Result<()> {
    if c.copy_tensor_to(s, d, size, dc.peer_endpoint())? {
        src_conn.settled_by();
        note_reached(src_conn, dc);
        return Ok(());
    }
    give_up_direct(
        src_conn,
        dc,
        "it answered 0 to COPY_TENSOR_TO (peer unreachable or not allowed)",
    );
    let data = c.get_tensor(s, 0, size)?;
    dc.run_now(|dst_client| dst_client.set_tensor(d, 0, &data))
        .map_err(|e| transfer_rpc::RpcError::refused("boundary fallback", e.to_string()))
}

/// The engine path of a boundary (both servers run an engine, a lane is
/// open for the destination range; the destination's barrier is already
/// ahead of this on the source's stream): the source's stream posts
/// ENGINE_WRITE after its graph, the destination's stream posts ENGINE_WAIT
/// before its next command, and neither waits for an answer: the
/// destination server itself holds its next graph until the write's
/// immediate arrived, so a decode step crosses the stages without a round
/// trip to this process per boundary (what transfer-rpc's coordinator
/// does). The answers are checked as they are read ([`check_posted`]): a
/// refused write makes the destination's wait fail after the timeout, and
/// the connection with it (an error, never a hang).
fn engine_copy(
    sc: &Arc<Conn>,
    dc: &Arc<Conn>,
    lane: Arc<crate::engine::Lane>,
    s: transfer_rpc::protocol::RpcTensor,
    size: u64,
) -> Result<()> {
    let seq = lane.next_seq();
    let lane_src = lane.clone();
    let write_at = sc.post_at(Box::new(move |c, _| {
        let w = transfer_rpc::client::EngineWrite {
            outbound: lane_src.outbound,
            src: &s,
            src_offset: 0,
            size,
            dst_offset: 0,
            seq,
        };
        c.post_engine_write(&w)?;
        check_posted(c)
    }))?;
    let wait_ms = u32::try_from(dc.timeout().as_millis()).unwrap_or(u32::MAX);
    let wait_at = dc.post_no_read(Box::new(move |c, _| {
        c.post_engine_wait(lane.lane, seq, size, wait_ms)?;
        check_posted(c)
    }))?;
    // The wait ends only once the write landed: when the destination is
    // known past its wait (a later answer there, e.g. the logits' read),
    // the source is known past its write, and so past its graph.
    dc.note_wait(wait_at, sc, write_at);
    Ok(())
}

/// `cpy_tensor_async`, between two of our servers: unless this process
/// already knows that the destination ran every earlier command that may
/// read its buffers ([`Conn::readers_done`]: the steady state of a decode,
/// whose previous step's answers prove it), the destination's stream first
/// proves it (PEER_BARRIER answered); the source's stream then sends COPY_TENSOR_TO after its graph (its
/// server writes the boundary into the destination's buffer and answers
/// once that write landed), and the destination's stream waits for that
/// answer before its next command. No activation byte passes this process.
/// A refused copy (peer unreachable) is redone through this process inside
/// the same ordering and the pair uses the host path from then on.
/// Anything not ours, or a stock server: false (ggml copies synchronously).
unsafe extern "C" fn be_cpy_tensor_async(
    _src_b: BackendT,
    _dst_b: BackendT,
    src: *const GgmlTensor,
    dst: *mut GgmlTensor,
) -> bool {
    guard("be_cpy_tensor_async", false, || {
        let Ok(h) = host::host() else { return false };
        if src.is_null() || dst.is_null() {
            return false;
        }
        // SAFETY: live host tensors; their buffers are NULL or live.
        let (Some(sc), Some(dc)) = (unsafe { buffer_conn((*src).buffer) }, unsafe {
            buffer_conn((*dst).buffer)
        }) else {
            return false;
        };
        let res = (|| -> Result<bool> {
            // SAFETY: live tensors.
            let s = unsafe { serialize::tensor(h, src, None) }?;
            // SAFETY: as above.
            let d = unsafe { serialize::tensor(h, dst, None) }?;
            if Arc::ptr_eq(&sc, &dc) {
                sc.post(Box::new(move |c, _| {
                    if c.copy_tensor(&s, &d)? {
                        Ok(())
                    } else {
                        Err(transfer_rpc::RpcError::RemoteFailure {
                            call: "COPY_TENSOR",
                        })
                    }
                }))?;
                return Ok(true);
            }
            if !direct_allowed(&sc, &dc) {
                return Ok(false);
            }
            // SAFETY: a live tensor.
            let size = unsafe { h.nbytes(src) } as u64;
            if transfer_rpc::client::trace::enabled() {
                transfer_rpc::client::trace::event(format_args!(
                    "{} HOST cpy_tensor_async to {} {size} bytes, readers_done {}",
                    sc.endpoint(),
                    dc.endpoint(),
                    dc.readers_done()
                ));
            }
            // SAFETY: a live host tensor; its buffer is one of ours (dc).
            let dst_base = unsafe { buf_ctx((*dst).buffer) }.map(|b| b.base);
            let lane = match dst_base.and_then(|base| d.data.checked_sub(base)) {
                Some(offset) => crate::engine::lane_for(&sc, &dc, d.buffer, offset, size)?,
                None => None,
            };
            // Write after read: the destination's earlier commands that
            // may read its buffers (its last graph) must have run before
            // the source writes into it. Mostly already known (a decode
            // step's answers prove the previous step ran on every stage,
            // see Conn::readers_done); else the destination's stream
            // proves it (PEER_BARRIER) and the source's waits for that.
            if !dc.readers_done() {
                let barrier = post_barrier(&dc)?;
                sc.wait_for(barrier)?;
            }
            if let Some(lane) = lane {
                return engine_copy(&sc, &dc, lane, s, size).map(|()| true);
            }
            if sc.serves_marks()
                && dc.serves_marks()
                && reached(&sc, &dc)
                && marked_copy(&sc, &dc, s.clone(), d.clone(), size)?
            {
                return Ok(true);
            }
            let landed = Arc::new(Done::default());
            let l = SetOnDrop(landed.clone());
            let dc2 = dc.clone();
            sc.post(Box::new(move |c, src_conn| {
                let _l = l;
                copy_to_or_through_host(c, src_conn, &dc2, &s, &d, size)
            }))?;
            dc.wait_for(landed)?;
            Ok(true)
        })();
        match res {
            Ok(v) => v,
            Err(e) => {
                log_err("cpy_tensor_async", &e);
                false
            }
        }
    })
}
