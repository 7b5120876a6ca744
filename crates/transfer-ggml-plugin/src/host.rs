//! The host's ggml, found at run time: symbols of ggml-base resolved with
//! `dlsym` (the plugin never links ggml), its version, and the struct layout
//! it was built with, confirmed by probing real host objects. A host whose
//! version is not in [`KNOWN`] or whose objects do not look as that version's
//! headers say is refused: the plugin never guesses a vtable layout.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use crate::abi::{
    BUFFER_I_SLOTS, BufT, BufferI, BuftT, GgmlBuffer, GgmlTensor, GraphT, InitParams,
    TENSOR_OVERHEAD,
};
use crate::error::{PluginError, Result};
use crate::names;

/// The backend-struct layouts the plugin has mirrors for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Backend API 2 with the 2D buffer slots (ggml 0.25.x, e.g. the
    /// llama.cpp of llama-cpp-python 0.3.36).
    Api2,
    /// Backend API 3: the buffer type gained `alloc_buffer_n` and
    /// `get_alloc_size_n` (ggml 0.26.x, e.g. llama-cpp-sys-2 0.1.161).
    Api3,
}

impl Layout {
    /// The `api_version` the host's loader compares with.
    pub fn api_version(self) -> c_int {
        match self {
            Layout::Api2 => 2,
            Layout::Api3 => 3,
        }
    }
}

/// ggml releases (major, minor) whose headers were read and mirrored.
pub const KNOWN: [((u32, u32), Layout); 2] = [((0, 25), Layout::Api2), ((0, 26), Layout::Api3)];

/// The layout of a ggml version string (`"0.25.3"`), if it is a known one.
pub fn layout_of_version(version: &str) -> Option<Layout> {
    let mut it = version.trim().split('.');
    let major = it.next()?.parse::<u32>().ok()?;
    let minor = it.next()?.parse::<u32>().ok()?;
    KNOWN
        .iter()
        .find(|(v, _)| *v == (major, minor))
        .map(|&(_, l)| l)
}

/// Which layout a host CPU buffer type's first eight pointer slots say
/// (`true` = non-NULL). API 2: get_name, alloc_buffer, get_alignment,
/// NULL, NULL, is_host, then device and context (both NULL for the CPU
/// type). API 3: get_name, alloc_buffer, NULL (alloc_buffer_n),
/// get_alignment, NULL, NULL, NULL, is_host.
pub fn layout_of_buft_slots(s: [bool; 8]) -> Option<Layout> {
    match s {
        [true, true, true, false, false, true, false, false] => Some(Layout::Api2),
        [true, true, false, true, false, false, false, true] => Some(Layout::Api3),
        _ => None,
    }
}

/// The pattern of a CPU "from pointer" buffer's interface on a host with the
/// 2D slots: free_buffer NULL, get_base, init_tensor NULL, memset, set, get,
/// set_2d NULL, get_2d NULL, cpy_tensor, clear, reset NULL. Without the 2D
/// slots slot 6 would be cpy_tensor (non-NULL).
pub const CPU_FROM_PTR_SLOTS: [bool; BUFFER_I_SLOTS] = [
    false, true, false, true, true, true, false, false, true, true, false,
];

type FnName = unsafe extern "C" fn(c_int) -> *const c_char;

/// The host's ggml-base entry points and layout.
pub struct Host {
    /// `ggml_version()`.
    pub version: String,
    /// The struct layout.
    pub layout: Layout,
    op_name: FnName,
    type_name: FnName,
    unary_op_name: FnName,
    glu_op_name: FnName,
    buffer_init: unsafe extern "C" fn(BuftT, BufferI, *mut c_void, usize) -> BufT,
    nbytes: unsafe extern "C" fn(*const GgmlTensor) -> usize,
    is_quantized: unsafe extern "C" fn(c_int) -> bool,
    op_may_expand: Option<unsafe extern "C" fn(c_int) -> bool>,
    graph_n_nodes: unsafe extern "C" fn(GraphT) -> c_int,
    graph_node: unsafe extern "C" fn(GraphT, c_int) -> *mut GgmlTensor,
    log: Option<unsafe extern "C" fn(c_int, *const c_char, ...)>,
    ops: Mutex<HashMap<c_int, u32>>,
    types: Mutex<HashMap<c_int, u32>>,
}

static HOST: OnceLock<std::result::Result<Host, String>> = OnceLock::new();

/// The host, probed once (no threads, no sockets; the probe allocates and
/// frees one small ggml context and one buffer struct).
pub fn host() -> Result<&'static Host> {
    HOST.get_or_init(Host::probe)
        .as_ref()
        .map_err(|e| PluginError::UnknownHost(e.clone()))
}

/// Looks a symbol up in the global scope, then in an already loaded
/// ggml-base (a host that dlopened it RTLD_LOCAL).
fn sym(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    if !p.is_null() {
        return Some(p);
    }
    for lib in [c"libggml-base.so.0", c"libggml-base.so"] {
        // SAFETY: RTLD_NOLOAD never loads anything: it only returns a handle
        // to a library already in the process (refcount +1, kept: the
        // host's ggml-base outlives the plugin anyway).
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            // SAFETY: as above, on a valid handle.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if !p.is_null() {
                return Some(p);
            }
        }
    }
    None
}

macro_rules! need {
    ($name:literal, $ty:ty) => {{
        let p = sym($name).ok_or_else(|| format!("no `{}` in the host", $name))?;
        // SAFETY: a non-NULL address of the exported ggml function of that
        // name; `$ty` is its signature in both known hosts' headers.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: ggml's name functions return static NUL-terminated strings.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Host {
    fn probe() -> std::result::Result<Host, String> {
        let version_fn = need!("ggml_version", unsafe extern "C" fn() -> *const c_char);
        // SAFETY: ggml_version takes nothing and returns a static string.
        let version = cstr(unsafe { version_fn() }).unwrap_or_default();
        let layout = layout_of_version(&version).ok_or_else(|| {
            format!(
                "ggml {version:?} is not a version whose backend structs this plugin mirrors (known: 0.25.x = API 2, 0.26.x = API 3)"
            )
        })?;
        let host = Host {
            version,
            layout,
            op_name: need!("ggml_op_name", FnName),
            type_name: need!("ggml_type_name", FnName),
            unary_op_name: need!("ggml_unary_op_name", FnName),
            glu_op_name: need!("ggml_glu_op_name", FnName),
            buffer_init: need!(
                "ggml_backend_buffer_init",
                unsafe extern "C" fn(BuftT, BufferI, *mut c_void, usize) -> BufT
            ),
            nbytes: need!(
                "ggml_nbytes",
                unsafe extern "C" fn(*const GgmlTensor) -> usize
            ),
            is_quantized: need!("ggml_is_quantized", unsafe extern "C" fn(c_int) -> bool),
            op_may_expand: sym("ggml_op_alloc_size_may_expand").map(|p| {
                // SAFETY: the exported function of that name, `bool(enum ggml_op)`.
                unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> bool>(p)
                }
            }),
            graph_n_nodes: need!("ggml_graph_n_nodes", unsafe extern "C" fn(GraphT) -> c_int),
            graph_node: need!(
                "ggml_graph_node",
                unsafe extern "C" fn(GraphT, c_int) -> *mut GgmlTensor
            ),
            log: sym("ggml_log_internal").map(|p| {
                // SAFETY: `void ggml_log_internal(enum ggml_log_level, const char *, ...)`.
                unsafe {
                    std::mem::transmute::<
                        *mut c_void,
                        unsafe extern "C" fn(c_int, *const c_char, ...),
                    >(p)
                }
            }),
            ops: Mutex::new(HashMap::new()),
            types: Mutex::new(HashMap::new()),
        };
        host.probe_tensor()?;
        host.probe_buffer()?;
        host.probe_buft()?;
        Ok(host)
    }

    /// `ggml_tensor`: the overhead the host reports and the fields of a real
    /// 4D tensor read through our mirror.
    fn probe_tensor(&self) -> std::result::Result<(), String> {
        let overhead = need!("ggml_tensor_overhead", unsafe extern "C" fn() -> usize);
        let init = need!("ggml_init", unsafe extern "C" fn(InitParams) -> *mut c_void);
        let free = need!("ggml_free", unsafe extern "C" fn(*mut c_void));
        let new4d = need!(
            "ggml_new_tensor_4d",
            unsafe extern "C" fn(*mut c_void, c_int, i64, i64, i64, i64) -> *mut GgmlTensor
        );
        // SAFETY: a pure size query.
        let o = unsafe { overhead() };
        if o != TENSOR_OVERHEAD {
            return Err(format!(
                "ggml_tensor_overhead() = {o}, the mirrored ggml_tensor needs {TENSOR_OVERHEAD}"
            ));
        }
        // SAFETY: a no_alloc context with room for two tensor headers; it is
        // freed below and nothing else sees it.
        let ctx = unsafe {
            init(InitParams {
                mem_size: 4 * o,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        if ctx.is_null() {
            return Err("ggml_init failed".into());
        }
        // SAFETY: ctx is live; type 0 is F32 in every ggml.
        let t = unsafe { new4d(ctx, 0, 2, 3, 5, 7) };
        let ok = if t.is_null() {
            false
        } else {
            // SAFETY: t points to a tensor header ggml just built.
            let t = unsafe { &*t };
            // SAFETY: as above.
            let nbytes = unsafe { (self.nbytes)(t) };
            t.ty == 0
                && t.ne == [2, 3, 5, 7]
                && t.nb == [4, 8, 24, 120]
                && t.op == 0
                && t.buffer.is_null()
                && t.view_src.is_null()
                && t.data.is_null()
                && nbytes == 840
        };
        // SAFETY: ctx came from ggml_init and is freed once.
        unsafe { free(ctx) };
        if ok {
            Ok(())
        } else {
            Err(
                "a ggml_tensor read through the mirror does not hold what ggml_new_tensor_4d made"
                    .into(),
            )
        }
    }

    /// `ggml_backend_buffer_i`: a CPU buffer over our own memory, with the
    /// 2D slots where the mirror has them.
    fn probe_buffer(&self) -> std::result::Result<(), String> {
        let from_ptr = need!(
            "ggml_backend_cpu_buffer_from_ptr",
            unsafe extern "C" fn(*mut c_void, usize) -> BufT
        );
        let buf_free = need!("ggml_backend_buffer_free", unsafe extern "C" fn(BufT));
        // ggml asserts (aborts) unless the pointer is TENSOR_ALIGNMENT (32)
        // aligned.
        #[repr(C, align(64))]
        struct Aligned([u8; 64]);
        let mut mem = Aligned([0u8; 64]);
        // SAFETY: the buffer only records the pointer and size; it is freed
        // below (from_ptr buffers do not own their memory).
        let b = unsafe { from_ptr(mem.0.as_mut_ptr().cast(), mem.0.len()) };
        if b.is_null() {
            return Err("ggml_backend_cpu_buffer_from_ptr failed".into());
        }
        // SAFETY: b is a live ggml_backend_buffer; its first 11 words are
        // the interface in every ggml with the 2D slots, and the struct is
        // larger than that in every ggml (iface + buft + context + size).
        let (slots, size) = unsafe {
            let words = b.cast::<usize>();
            let mut s = [false; BUFFER_I_SLOTS];
            for (i, v) in s.iter_mut().enumerate() {
                *v = *words.add(i) != 0;
            }
            (s, (*b.cast::<GgmlBuffer>()).size)
        };
        // SAFETY: b came from ggml and is freed once.
        unsafe { buf_free(b) };
        if slots != CPU_FROM_PTR_SLOTS || size != mem.0.len() {
            return Err(format!(
                "a host CPU buffer's interface slots are {slots:?} (size {size}), not the 2D-slot layout {CPU_FROM_PTR_SLOTS:?}"
            ));
        }
        Ok(())
    }

    /// `ggml_backend_buffer_type_i`: API 2 or 3, must agree with the version.
    fn probe_buft(&self) -> std::result::Result<(), String> {
        let cpu_buft = need!(
            "ggml_backend_cpu_buffer_type",
            unsafe extern "C" fn() -> BuftT
        );
        // SAFETY: returns a static buffer type.
        let b = unsafe { cpu_buft() };
        if b.is_null() {
            return Err("ggml_backend_cpu_buffer_type returned NULL".into());
        }
        let mut s = [false; 8];
        // SAFETY: the buffer type struct is at least 8 words long in both
        // layouts (API 2: 6 slots + device + context).
        unsafe {
            let words = b.cast::<usize>();
            for (i, v) in s.iter_mut().enumerate() {
                *v = *words.add(i) != 0;
            }
        }
        match layout_of_buft_slots(s) {
            Some(l) if l == self.layout => Ok(()),
            found => Err(format!(
                "ggml {} should have the {:?} buffer type but its CPU buffer type looks like {found:?} ({s:?})",
                self.version, self.layout
            )),
        }
    }

    /// Wire op number of a host op.
    pub fn wire_op(&self, op: c_int) -> Result<u32> {
        lookup(&self.ops, op, || {
            // SAFETY: `op` comes from a live host tensor, so it is a valid
            // index of the host's name table.
            let name = cstr(unsafe { (self.op_name)(op) });
            name.as_deref()
                .and_then(names::wire_op)
                .ok_or_else(|| PluginError::Unsupported {
                    call: "graph_compute",
                    reason: format!("host op {op} ({name:?}) has no ggml-rpc 7.0 number"),
                })
        })
    }

    /// Wire type number of a host type.
    pub fn wire_type(&self, ty: c_int) -> Result<u32> {
        lookup(&self.types, ty, || {
            // SAFETY: ggml_type_name bounds-checks and answers "NONE" (or
            // NULL for a removed number).
            let name = cstr(unsafe { (self.type_name)(ty) });
            name.as_deref()
                .and_then(names::wire_type)
                .ok_or_else(|| PluginError::Unsupported {
                    call: "tensor",
                    reason: format!("host type {ty} ({name:?}) has no ggml-rpc 7.0 number"),
                })
        })
    }

    /// Wire number of a host `ggml_unary_op`.
    pub fn wire_unary(&self, op: i32) -> Result<i32> {
        // SAFETY: taken from a live UNARY tensor's op_params[0].
        let name = cstr(unsafe { (self.unary_op_name)(op) });
        name.as_deref()
            .and_then(names::wire_unary)
            .ok_or_else(|| PluginError::Unsupported {
                call: "graph_compute",
                reason: format!("host unary op {op} ({name:?}) unknown to the wire"),
            })
    }

    /// Wire number of a host `ggml_glu_op`.
    pub fn wire_glu(&self, op: i32) -> Result<i32> {
        // SAFETY: taken from a live GLU tensor's op_params[0].
        let name = cstr(unsafe { (self.glu_op_name)(op) });
        name.as_deref()
            .and_then(names::wire_glu)
            .ok_or_else(|| PluginError::Unsupported {
                call: "graph_compute",
                reason: format!("host glu op {op} ({name:?}) unknown to the wire"),
            })
    }

    /// `ggml_nbytes`.
    ///
    /// # Safety
    /// `t` must be a live host tensor.
    pub unsafe fn nbytes(&self, t: *const GgmlTensor) -> usize {
        // SAFETY: the caller's contract.
        unsafe { (self.nbytes)(t) }
    }

    /// `ggml_is_quantized`.
    pub fn is_quantized(&self, ty: c_int) -> bool {
        // SAFETY: bounds-checked lookup in ggml's type table.
        unsafe { (self.is_quantized)(ty) }
    }

    /// `ggml_op_alloc_size_may_expand` (false where the host lacks it).
    pub fn op_may_expand(&self, op: c_int) -> bool {
        // SAFETY: a switch on the op number.
        self.op_may_expand.is_some_and(|f| unsafe { f(op) })
    }

    /// `ggml_backend_buffer_init`.
    ///
    /// # Safety
    /// `buft` must be one of our buffer types and `ctx` the context our
    /// buffer functions expect.
    pub unsafe fn buffer_init(
        &self,
        buft: BuftT,
        iface: BufferI,
        ctx: *mut c_void,
        size: usize,
    ) -> BufT {
        // SAFETY: the caller's contract.
        unsafe { (self.buffer_init)(buft, iface, ctx, size) }
    }

    /// The nodes of a host graph.
    ///
    /// # Safety
    /// `g` must be a live host graph.
    pub unsafe fn graph_nodes(&self, g: GraphT) -> Vec<*mut GgmlTensor> {
        // SAFETY: the caller's contract; indices below n_nodes.
        unsafe {
            let n = (self.graph_n_nodes)(g).max(0);
            (0..n).map(|i| (self.graph_node)(g, i)).collect()
        }
    }

    /// One line through ggml's logger (llama.cpp's log callback sees it).
    pub fn log(&self, level: c_int, msg: &str) {
        let line = CString::new(format!("transfer-ggml-plugin: {msg}\n").replace('\0', " "))
            .unwrap_or_default();
        match self.log {
            // SAFETY: a "%s" format with one NUL-terminated string argument.
            Some(f) => unsafe { f(level, c"%s".as_ptr(), line.as_ptr()) },
            None => eprint!("{}", line.to_string_lossy()),
        }
    }
}

fn lookup(
    cache: &Mutex<HashMap<c_int, u32>>,
    key: c_int,
    miss: impl FnOnce() -> Result<u32>,
) -> Result<u32> {
    if let Some(&v) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(v);
    }
    let v = miss()?;
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, v);
    Ok(v)
}

/// Logs through the host's logger when the host is known, else to stderr.
pub fn log(level: c_int, msg: &str) {
    match HOST.get() {
        Some(Ok(h)) => h.log(level, msg),
        _ => eprintln!("transfer-ggml-plugin: {msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(layout_of_version("0.25.3"), Some(Layout::Api2));
        assert_eq!(layout_of_version("0.26.0"), Some(Layout::Api3));
        assert_eq!(layout_of_version("0.9.7"), None);
        assert_eq!(layout_of_version("0.27.0"), None);
        assert_eq!(layout_of_version("garbage"), None);
        assert_eq!(layout_of_version(""), None);
    }

    #[test]
    fn buft_patterns() {
        let t = true;
        let f = false;
        assert_eq!(
            layout_of_buft_slots([t, t, t, f, f, t, f, f]),
            Some(Layout::Api2)
        );
        assert_eq!(
            layout_of_buft_slots([t, t, f, t, f, f, f, t]),
            Some(Layout::Api3)
        );
        assert_eq!(layout_of_buft_slots([t, t, t, t, t, t, t, t]), None);
    }

    /// The test binary links no ggml: the probe must refuse, not crash.
    #[test]
    fn no_ggml_in_process_is_a_refusal() {
        match host() {
            Err(PluginError::UnknownHost(msg)) => assert!(msg.contains("ggml_version"), "{msg}"),
            Err(e) => panic!("unexpected error {e}"),
            Ok(h) => panic!("found a host ggml {} in a test binary", h.version),
        }
    }
}
