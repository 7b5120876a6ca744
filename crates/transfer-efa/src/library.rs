//! Loading `libfabric.so.1` at run time and the few symbols it exports.
//!
//! Search order: the `TRANSFER_LIBFABRIC_PATH` environment variable, then
//! the AWS EFA installer's `/opt/amazon/efa/lib/libfabric.so.1` when
//! present, then the system loader's `libfabric.so.1`. Everything else in
//! libfabric is reached through the ops vtables of the objects these
//! functions return (see [`crate::sys`]).

use std::ffi::{CStr, c_int};
use std::path::Path;
use std::sync::Arc;

use transfer_core::{BackendKind, Result, TransferError};

use crate::sys;

/// Environment variable naming the libfabric shared object to load.
pub const LIBRARY_PATH_ENV: &str = "TRANSFER_LIBFABRIC_PATH";
/// Where the AWS EFA installer puts its libfabric.
pub const EFA_INSTALLER_LIBRARY: &str = "/opt/amazon/efa/lib/libfabric.so.1";
const DEFAULT_LIBRARY: &str = "libfabric.so.1";
const INSTALL_HINT: &str = "apt-get install libfabric1";

/// The loaded libfabric and its exported entry points.
pub struct Library {
    pub(crate) getinfo: sys::FiGetinfo,
    pub(crate) freeinfo: sys::FiFreeinfo,
    pub(crate) dupinfo: sys::FiDupinfo,
    pub(crate) fabric: sys::FiFabric,
    pub(crate) strerror: sys::FiStrerror,
    version: u32,
    path: String,
    // Keeps the code behind the function pointers above mapped; dropped last.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("version", &self.version_string())
            .finish()
    }
}

fn missing(reason: String) -> TransferError {
    TransferError::LibraryMissing {
        library: "libfabric.so.1",
        reason,
        install_hint: INSTALL_HINT,
    }
}

impl Library {
    /// Loads libfabric following the search order in the module docs.
    pub fn load() -> Result<Arc<Self>> {
        let path = match std::env::var(LIBRARY_PATH_ENV) {
            Ok(p) if !p.is_empty() => p,
            _ if Path::new(EFA_INSTALLER_LIBRARY).exists() => EFA_INSTALLER_LIBRARY.to_owned(),
            _ => DEFAULT_LIBRARY.to_owned(),
        };
        Self::load_from(&path)
    }

    /// Loads libfabric from an explicit path or soname.
    pub fn load_from(path: &str) -> Result<Arc<Self>> {
        // SAFETY: loading libfabric runs its constructors, which only
        // initialise libfabric's own global state.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| missing(format!("{path}: {e}")))?;
        // SAFETY: each symbol is looked up with the signature of the
        // libfabric 1.x prototype of the same name (see `sys`).
        let lib_fns = unsafe {
            let getinfo = *lib
                .get::<sys::FiGetinfo>(b"fi_getinfo\0")
                .map_err(|e| missing(e.to_string()))?;
            let freeinfo = *lib
                .get::<sys::FiFreeinfo>(b"fi_freeinfo\0")
                .map_err(|e| missing(e.to_string()))?;
            let dupinfo = *lib
                .get::<sys::FiDupinfo>(b"fi_dupinfo\0")
                .map_err(|e| missing(e.to_string()))?;
            let fabric = *lib
                .get::<sys::FiFabric>(b"fi_fabric\0")
                .map_err(|e| missing(e.to_string()))?;
            let version = *lib
                .get::<sys::FiVersion>(b"fi_version\0")
                .map_err(|e| missing(e.to_string()))?;
            let strerror = *lib
                .get::<sys::FiStrerror>(b"fi_strerror\0")
                .map_err(|e| missing(e.to_string()))?;
            (getinfo, freeinfo, dupinfo, fabric, version, strerror)
        };
        let (getinfo, freeinfo, dupinfo, fabric, version_fn, strerror) = lib_fns;
        // SAFETY: fi_version takes no argument and only returns a constant.
        let version = unsafe { version_fn() };
        if version >> 16 != 1 {
            return Err(missing(format!(
                "{path}: unsupported libfabric API version {}.{}",
                version >> 16,
                version & 0xffff
            )));
        }
        Ok(Arc::new(Self {
            getinfo,
            freeinfo,
            dupinfo,
            fabric,
            strerror,
            version,
            path: path.to_owned(),
            _lib: lib,
        }))
    }

    /// The API version the loaded library reports (`fi_version()`); the
    /// crate asks `fi_getinfo` for exactly this version, never a newer one.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `major.minor` of [`Self::version`].
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.version >> 16, self.version & 0xffff)
    }

    /// The path or soname the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `fi_strerror` for a positive libfabric error code.
    pub fn strerror(&self, code: i32) -> String {
        // SAFETY: fi_strerror returns a pointer to a static string (or NULL).
        let p = unsafe { (self.strerror)(code as c_int) };
        if p.is_null() {
            return format!("error {code}");
        }
        // SAFETY: non-NULL results are NUL-terminated static strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Builds the typed error for a failed libfabric call returning `ret` (< 0).
    pub(crate) fn error(&self, call: &'static str, ret: isize) -> TransferError {
        let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
        TransferError::Backend {
            call,
            backend: BackendKind::Libfabric,
            code,
            message: self.strerror(code),
        }
    }
}
