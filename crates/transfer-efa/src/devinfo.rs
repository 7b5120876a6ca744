//! Provider discovery: building `fi_getinfo` hints and owning the results.

use std::ffi::{CStr, CString, c_char};
use std::ptr;
use std::sync::Arc;

use transfer_core::{Result, TransferError};

use crate::config::LibfabricConfig;
use crate::library::Library;
use crate::provider::Provider;
use crate::sys;

/// One `fi_info` entry, owned (duplicated with `fi_dupinfo`, freed with
/// `fi_freeinfo`).
pub(crate) struct OwnedInfo {
    lib: Arc<Library>,
    ptr: *mut sys::fi_info,
}

// SAFETY: the fi_info is plain heap data owned exclusively by this value;
// libfabric keeps no reference to it and it is not tied to any thread.
unsafe impl Send for OwnedInfo {}

impl Drop for OwnedInfo {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from fi_dupinfo/fi_getinfo of this library and
        // is freed exactly once.
        unsafe { (self.lib.freeinfo)(self.ptr) }
    }
}

/// Reads a possibly NULL C string.
fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric strings in fi_info are NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl OwnedInfo {
    /// Replaces the source address with a string address (FI_ADDR_STR).
    pub(crate) fn set_src_addr_str(&mut self, addr: &str) -> Result<()> {
        let new = strdup("source address", addr)?;
        // SAFETY: `ptr` is our own fi_info; its src_addr is NULL or malloc'd
        // by libfabric (fi_dupinfo), so free() matches; the new string is
        // malloc'd by strdup and released by fi_freeinfo.
        unsafe {
            let info = &mut *self.ptr;
            libc::free(info.src_addr);
            info.src_addr = new.cast();
            info.src_addrlen = addr.len() + 1;
        }
        Ok(())
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fi_info {
        self.ptr
    }

    pub(crate) fn library(&self) -> &Arc<Library> {
        &self.lib
    }

    fn info(&self) -> &sys::fi_info {
        // SAFETY: `ptr` is a valid fi_info for our lifetime.
        unsafe { &*self.ptr }
    }

    fn domain_attr(&self) -> Option<&sys::fi_domain_attr> {
        // SAFETY: attribute pointers of a returned fi_info are NULL or valid.
        unsafe { self.info().domain_attr.as_ref() }
    }

    /// The provider's name (e.g. `tcp;ofi_rxm`).
    pub(crate) fn provider_name(&self) -> String {
        // SAFETY: as above.
        unsafe { self.info().fabric_attr.as_ref() }
            .map(|a| c_str(a.prov_name))
            .unwrap_or_default()
    }

    /// The domain (NIC) name.
    pub(crate) fn domain_name(&self) -> String {
        self.domain_attr()
            .map(|a| c_str(a.name))
            .unwrap_or_default()
    }

    /// The fabric name (e.g. `127.0.0.1/32`).
    pub(crate) fn fabric_name(&self) -> String {
        // SAFETY: as above.
        unsafe { self.info().fabric_attr.as_ref() }
            .map(|a| c_str(a.name))
            .unwrap_or_default()
    }

    pub(crate) fn mr_mode(&self) -> i32 {
        self.domain_attr().map(|a| a.mr_mode).unwrap_or(0)
    }

    /// Bytes of an application-chosen memory key (8 when unknown).
    pub(crate) fn mr_key_size(&self) -> usize {
        self.domain_attr()
            .map(|a| a.mr_key_size)
            .filter(|&n| n > 0)
            .unwrap_or(8)
    }

    pub(crate) fn av_type(&self) -> i32 {
        self.domain_attr().map(|a| a.av_type).unwrap_or(0)
    }

    pub(crate) fn cq_data_size(&self) -> usize {
        self.domain_attr().map(|a| a.cq_data_size).unwrap_or(0)
    }

    /// Mode bits the provider requires (info, tx and rx).
    pub(crate) fn mode(&self) -> u64 {
        let info = self.info();
        // SAFETY: as above.
        let tx = unsafe { info.tx_attr.as_ref() }
            .map(|a| a.mode)
            .unwrap_or(0);
        // SAFETY: as above.
        let rx = unsafe { info.rx_attr.as_ref() }
            .map(|a| a.mode)
            .unwrap_or(0);
        info.mode | tx | rx
    }

    pub(crate) fn addr_format(&self) -> u32 {
        self.info().addr_format
    }

    pub(crate) fn max_msg_size(&self) -> u64 {
        // SAFETY: as above.
        unsafe { self.info().ep_attr.as_ref() }
            .map(|a| a.max_msg_size as u64)
            .unwrap_or(0)
    }

    /// Local segments per operation (`tx_attr->iov_limit`; 0 unknown).
    pub(crate) fn iov_limit(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.info().tx_attr.as_ref() }
            .map(|a| a.iov_limit)
            .unwrap_or(0)
    }

    /// Remote segments per RMA operation (`tx_attr->rma_iov_limit`; 0 unknown).
    pub(crate) fn rma_iov_limit(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.info().tx_attr.as_ref() }
            .map(|a| a.rma_iov_limit)
            .unwrap_or(0)
    }

    pub(crate) fn tx_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.info().tx_attr.as_ref() }
            .map(|a| a.size)
            .unwrap_or(0)
    }

    /// Link speed in bits per second, when the provider reports a NIC.
    pub(crate) fn link_speed_bps(&self) -> u64 {
        // SAFETY: `nic` and `link_attr` are NULL or valid.
        unsafe { self.info().nic.as_ref() }
            .and_then(|nic| unsafe { nic.link_attr.as_ref() })
            .map(|l| l.speed as u64)
            .unwrap_or(0)
    }
}

/// Hints handed to `fi_getinfo`, allocated by libfabric (`fi_allocinfo`)
/// so that `fi_freeinfo` can release them with the strings we set.
struct Hints(OwnedInfo);

fn strdup(lib_err: &str, s: &str) -> Result<*mut c_char> {
    let c = CString::new(s)
        .map_err(|_| TransferError::invalid("fi_getinfo", format!("{lib_err} contains NUL")))?;
    // SAFETY: `c` is a valid C string; strdup allocates with malloc, which
    // fi_freeinfo releases with free.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(TransferError::invalid("fi_getinfo", "out of memory"));
    }
    Ok(p)
}

impl Hints {
    fn new(
        lib: &Arc<Library>,
        provider: &Provider,
        config: &LibfabricConfig,
        virt_addr: bool,
    ) -> Result<Self> {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with
        // every attribute struct allocated.
        let ptr = unsafe { (lib.dupinfo)(ptr::null()) };
        if ptr.is_null() {
            return Err(TransferError::invalid("fi_allocinfo", "out of memory"));
        }
        let hints = Self(OwnedInfo {
            lib: lib.clone(),
            ptr,
        });
        // SAFETY: fi_allocinfo returned a valid fi_info whose attribute
        // pointers are all non-NULL (checked before use).
        unsafe {
            let info = &mut *ptr;
            let hmem = if config.hmem { sys::FI_HMEM } else { 0 };
            info.caps = sys::FI_MSG | sys::FI_RMA | hmem;
            // Modes we can honour: a per-operation fi_context2 that lives
            // until completion. FI_RX_CQ_DATA is not offered; see
            // `crate::domain` for why and what happens on providers that
            // would require it.
            info.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            if let Some(ep) = info.ep_attr.as_mut() {
                ep.type_ = sys::FI_EP_RDM;
            }
            if let Some(d) = info.domain_attr.as_mut() {
                d.threading = sys::FI_THREAD_DOMAIN;
                let hmem_mr = if config.hmem { sys::FI_MR_HMEM } else { 0 };
                d.mr_mode = match provider {
                    Provider::Efa => {
                        sys::FI_MR_LOCAL
                            | sys::FI_MR_VIRT_ADDR
                            | sys::FI_MR_ALLOCATED
                            | sys::FI_MR_PROV_KEY
                            | hmem_mr
                    }
                    // Everything this crate can follow; the provider answers
                    // with the subset it needs (0 on tcp/udp/sockets/shm).
                    // FI_MR_VIRT_ADDR is offered only when the provider
                    // insists (second pass, see `get_info`): measured on
                    // 1.17 shm, virtual-address mode checks neither keys nor
                    // bounds (a wrong key lands, an out-of-range write
                    // corrupts the target), while offset mode refuses both.
                    _ => {
                        sys::FI_MR_LOCAL
                            | sys::FI_MR_ALLOCATED
                            | sys::FI_MR_PROV_KEY
                            | sys::FI_MR_ENDPOINT
                            | hmem_mr
                            | if virt_addr { sys::FI_MR_VIRT_ADDR } else { 0 }
                    }
                };
                if let Some(name) = &config.domain_name {
                    d.name = strdup("domain name", name)?;
                }
            }
            if let Some(f) = info.fabric_attr.as_mut() {
                f.prov_name = strdup("provider name", provider.libfabric_name())?;
            }
        }
        Ok(hints)
    }
}

/// Runs `fi_getinfo` for `provider` and returns every matching entry,
/// one per distinct domain (NIC), in the provider's order.
pub(crate) fn get_info(
    lib: &Arc<Library>,
    provider: &Provider,
    config: &LibfabricConfig,
) -> Result<Vec<OwnedInfo>> {
    match get_info_pass(lib, provider, config, false) {
        Ok(v) => Ok(v),
        // A provider that needs virtual addresses (FI_MR_VIRT_ADDR) offers
        // nothing without it: ask again, allowing it.
        Err(_) if *provider != Provider::Efa => get_info_pass(lib, provider, config, true),
        Err(e) => Err(e),
    }
}

fn get_info_pass(
    lib: &Arc<Library>,
    provider: &Provider,
    config: &LibfabricConfig,
    virt_addr: bool,
) -> Result<Vec<OwnedInfo>> {
    let hints = Hints::new(lib, provider, config, virt_addr)?;
    let node = match (&config.node, provider.is_ip_based()) {
        (Some(n), true) => Some(
            CString::new(n.as_str())
                .map_err(|_| TransferError::invalid("fi_getinfo", "node contains NUL"))?,
        ),
        _ => None,
    };
    let service = match (&config.service, provider.is_ip_based()) {
        (Some(s), true) => Some(
            CString::new(s.as_str())
                .map_err(|_| TransferError::invalid("fi_getinfo", "service contains NUL"))?,
        ),
        _ => None,
    };
    let flags = if node.is_some() || service.is_some() {
        sys::FI_SOURCE
    } else {
        0
    };
    let mut list: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; node/service are NULL or C strings
    // that outlive the call; `list` receives an allocated list or stays NULL.
    let ret = unsafe {
        (lib.getinfo)(
            lib.version(),
            node.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            service.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            flags,
            hints.0.as_ptr(),
            &mut list,
        )
    };
    if ret != 0 {
        return Err(lib.error("fi_getinfo", ret as isize));
    }
    let list_owner = OwnedInfo {
        lib: lib.clone(),
        ptr: list,
    };
    let mut out: Vec<OwnedInfo> = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list fi_getinfo returned, owned by `list_owner`.
        let dup = unsafe { (lib.dupinfo)(cur) };
        // SAFETY: as above.
        let next = unsafe { (*cur).next };
        cur = next;
        if dup.is_null() {
            continue;
        }
        let entry = OwnedInfo {
            lib: lib.clone(),
            ptr: dup,
        };
        if !usable(&entry) || out.iter().any(|e| e.domain_name() == entry.domain_name()) {
            continue;
        }
        out.push(entry);
    }
    drop(list_owner);
    if out.is_empty() {
        return Err(TransferError::Backend {
            call: "fi_getinfo",
            backend: transfer_core::BackendKind::Libfabric,
            code: sys::FI_ENODATA,
            message: format!("provider {provider} offers no usable RDM endpoint with FI_RMA"),
        });
    }
    Ok(out)
}

/// Whether this crate can drive an entry: 32-bit CQ data at least, keys
/// that fit in 64 bits, and no mode bit it did not offer.
fn usable(info: &OwnedInfo) -> bool {
    let supported_modes = sys::FI_CONTEXT | sys::FI_CONTEXT2;
    info.cq_data_size() >= 4
        && info.mr_mode() & sys::FI_MR_RAW == 0
        && info.mode()
            & !supported_modes
            & (sys::FI_RX_CQ_DATA | sys::FI_MSG_PREFIX | sys::FI_ASYNC_IOV | sys::FI_LOCAL_MR)
            == 0
}

/// Whether `provider` has at least one usable entry on this machine.
pub(crate) fn provider_available(lib: &Arc<Library>, provider: &Provider) -> bool {
    get_info(lib, provider, &LibfabricConfig::default()).is_ok()
}
