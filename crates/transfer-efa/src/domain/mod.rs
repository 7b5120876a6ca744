//! [`LibfabricDomain`]: one NIC (one `fi_info` entry) opened for the engine,
//! the functions that open them, and its `impl Domain`. The data path is in
//! `data_path.rs`, connection errors, peer death and timeouts in
//! `connection.rs` (the same split as transfer-verbs' `domain/`).
//!
//! # Remote CQ data and posted receives
//! Providers with the FI_RX_CQ_DATA mode consume a posted receive for
//! every write that carries remote CQ data. This crate does not offer that
//! mode in its hints, so `fi_getinfo` only returns entries whose remote CQ
//! data arrives without a receive (all of tcp, shm, udp, sockets and efa's
//! RDM endpoint on libfabric 1.17); an entry that would still require it
//! is skipped as unusable. That keeps message receives (posted by the
//! engine) and immediates apart: a dedicated pool of small receives would
//! otherwise also catch messages, which untagged matching cannot prevent.

mod connection;
mod data_path;

use data_path::PostError;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Instant;

use transfer_core::{
    BackendKind, Domain, DomainEvent, DomainInfo, DomainMr, MemoryLocation, MemorySpan, NicAddress,
    OpToken, Ordering, PeerId, RecvToken, Registration, RemoteKey, RemoteNicRegion, Result,
    TransferError, WriteOp,
};

use crate::address::{self, AddressFormat};
use crate::av::AddressVector;
use crate::bounce::BounceSlab;
use crate::config::LibfabricConfig;
use crate::context::{SlotKind, SlotPool};
use crate::cq::CompletionQueue;
use crate::devinfo::{self, OwnedInfo};
use crate::doorbell::{Doorbell, PeerBell};
use crate::endpoint::Endpoint;
use crate::fabric::{Fabric, FiDomain};
use crate::gate::Gates;
use crate::library::Library;
use crate::mr::MemoryRegistration;
use crate::ops::Ops;
use crate::peer::Peers;
use crate::posting::{self, Limits, Posting};
use crate::provider::Provider;
use crate::queue::PeerQueues;
use crate::sys;

/// Work accepted but not yet handed to the provider.
pub(crate) enum Pending {
    /// One write of a submit call.
    Write {
        /// Internal op id.
        op: u64,
        /// The write (one or several merged).
        write: Posting,
        /// Whether this is a retry after a broken connection.
        retried: bool,
    },
    /// A send.
    Send {
        /// Internal op id.
        op: u64,
        /// Destination.
        peer: transfer_core::PeerId,
        /// The message.
        data: Vec<u8>,
    },
}

impl Pending {
    /// The peer this work goes to.
    pub(crate) fn peer(&self) -> transfer_core::PeerId {
        match self {
            Pending::Write { write, .. } => write.head.peer,
            Pending::Send { peer, .. } => *peer,
        }
    }
}

/// A receive buffer: waiting to be (re)posted, or posted.
#[derive(Clone, Copy)]
pub(crate) struct PendingRecv {
    pub(crate) token: RecvToken,
    pub(crate) mr: DomainMr,
    pub(crate) buf: *mut u8,
    pub(crate) len: usize,
}

/// One libfabric NIC as a [`transfer_core::Domain`].
///
/// Owns its fabric, domain, CQ, AV and endpoint. Field order is drop
/// order: the endpoint closes first (cancelling what is in flight), then
/// the contexts and registrations it used, then CQ, AV, domain, fabric.
pub struct LibfabricDomain {
    /// The shm endpoint's name (`trx<pid>-<random>-<n>`), whose shared
    /// memory files are removed when the domain is dropped.
    pub(crate) shm_name: Option<String>,
    /// This shm domain's doorbell (see [`crate::doorbell`]): what its
    /// worker blocks on, and the sleep counter peers read.
    pub(crate) bell: Option<Doorbell>,
    /// Doorbells of shm peers of this crate, rung after posting to them
    /// while they may be blocked.
    pub(crate) peer_bells: HashMap<transfer_core::PeerId, PeerBell>,
    /// The endpoint: receives always, writes and sends until shm wedges it
    /// (see `connection::replace_tx`).
    pub(crate) ep: Endpoint,
    /// The endpoint writes and sends go through after shm wedged `ep`'s
    /// transmit side; `None`: `ep`.
    pub(crate) tx: Option<Endpoint>,
    /// Wedged replacement transmit endpoints, kept open: the provider owns
    /// their operations' contexts.
    pub(crate) wedged: Vec<Endpoint>,
    /// What was posted on wedged transmit endpoints, kept alive for the
    /// same reason (a send's payload may still be read by its target).
    /// Bounded: at most `connection::MAX_TX_REPLACEMENTS` wedges.
    pub(crate) abandoned: Vec<crate::context::SlotKind>,
    /// Transmit endpoints replaced so far.
    pub(crate) tx_replacements: usize,
    pub(crate) slots: SlotPool,
    pub(crate) mrs: HashMap<u64, MemoryRegistration>,
    pub(crate) bounce: Option<BounceSlab>,
    pub(crate) cq: CompletionQueue,
    pub(crate) av: AddressVector,
    pub(crate) domain: FiDomain,
    pub(crate) fabric: Fabric,
    pub(crate) info: OwnedInfo,
    pub(crate) lib: Arc<Library>,

    pub(crate) config: LibfabricConfig,
    pub(crate) mr_mode: i32,
    pub(crate) format: AddressFormat,
    pub(crate) address: NicAddress,
    pub(crate) max_write: u64,
    pub(crate) write_flags: u64,
    /// Whether this domain reports [`Ordering::InOrder`]: it then holds
    /// each write carrying an immediate until the writes of its call
    /// without one have been delivered (see [`crate::gate`]).
    pub(crate) ordered: bool,
    /// The immediates held back (in-order domains only).
    pub(crate) gates: Gates,
    /// How far an in-order domain merges consecutive writes without
    /// immediates into one multi-segment write ([`crate::posting`]).
    pub(crate) merge: Limits,
    pub(crate) next_mr: u64,
    pub(crate) next_key: u64,
    /// Bits an application-chosen key may use (`mr_key_size`).
    pub(crate) key_mask: u64,
    pub(crate) peers: Peers,
    pub(crate) ops: Ops,
    /// Work not posted yet (the provider said EAGAIN, or its peer is at
    /// `peer_cap`), per peer.
    pub(crate) queue: PeerQueues,
    /// Operations posted and not completed, per peer.
    pub(crate) posted_to: HashMap<transfer_core::PeerId, usize>,
    /// Most operations one peer may have posted: half the send queue, so a
    /// peer that stopped answering cannot fill it for everyone until its
    /// timeout (several stuck at once still can, until they time out).
    pub(crate) peer_cap: usize,
    /// Writes waiting to be retried after a broken connection, with the
    /// time they may go.
    pub(crate) retries: Vec<(Instant, Pending)>,
    pub(crate) recv_queue: VecDeque<PendingRecv>,
    pub(crate) ready: Vec<DomainEvent>,
    pub(crate) last_completion: Instant,
    pub(crate) last_timeout_check: Instant,
    pub(crate) cq_buf: Vec<sys::fi_cq_data_entry>,
}

// SAFETY: every libfabric object here is owned exclusively by this value
// and only touched through `&mut self` (or in Drop), so at most one thread
// uses the domain at a time, which is what FI_THREAD_DOMAIN requires; none
// of the objects is bound to the thread that opened it. The raw pointers in
// queued receives point into memory the engine keeps registered.
unsafe impl Send for LibfabricDomain {}

impl LibfabricDomain {
    /// Whether work waiting to be posted cannot go now, so that a worker
    /// may block: the queue is empty, or (where the wait descriptor covers
    /// work in flight) one more drain posted nothing (every peer at its
    /// cap or refused with EAGAIN: a completion or a writable socket
    /// frees it, and both wake the worker).
    fn queue_stuck(&mut self) -> bool {
        if self.queue.is_empty() {
            return true;
        }
        if !transfer_core::Domain::wait_covers_in_flight(self) {
            return false;
        }
        let before = self.queue.iter().count();
        self.drain_queue(self.config.post_batch.max(1));
        self.queue.iter().count() == before
    }
}

impl Drop for LibfabricDomain {
    /// Closes everything in field order, except on `shm`: libfabric 1.17
    /// shm lets a peer in the same process use this endpoint's shared
    /// region directly, and closing it while that peer still processes
    /// our commands crashes the peer (measured: SIGSEGV inside fi_cq_read
    /// when one engine is dropped with transfers in flight). So an shm
    /// domain leaks its endpoint, CQ, AV, domain, fabric, operation
    /// contexts and send slab (a few MiB, once per closed domain) and only
    /// closes its memory registrations, which refuses later accesses.
    fn drop(&mut self) {
        if self.info.provider_name() != "shm" {
            return;
        }
        self.ep.ptr = std::ptr::null_mut();
        if let Some(tx) = &mut self.tx {
            tx.ptr = std::ptr::null_mut();
        }
        for ep in &mut self.wedged {
            ep.ptr = std::ptr::null_mut();
        }
        std::mem::forget(std::mem::take(&mut self.abandoned));
        self.cq.ptr = std::ptr::null_mut();
        self.av.ptr = std::ptr::null_mut();
        self.domain.ptr = std::ptr::null_mut();
        self.fabric.ptr = std::ptr::null_mut();
        std::mem::forget(std::mem::take(&mut self.slots));
        std::mem::forget(self.bounce.take());
        // The leaked endpoint keeps its mapping; the names go, so that
        // /dev/shm does not fill up with a region per closed domain
        // (measured: 1146 files, 4.3 GB, after a day of test runs).
        if let Some(name) = &self.shm_name {
            // The endpoint's, and those of replacement transmit endpoints.
            remove_shm_files(|f| {
                f.starts_with(&format!("{name}:")) || f.starts_with(&format!("{name}-tx"))
            });
        }
    }
}

/// Removes the files in /dev/shm that `pick` selects (best effort).
fn remove_shm_files(pick: impl Fn(&str) -> bool) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_str().is_some_and(&pick) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Removes shm files of this crate's naming whose process is gone (a
/// process killed before it could drop its domains).
fn remove_stale_shm_files() {
    remove_shm_files(|f| {
        let Some(rest) = f.strip_prefix("trx") else {
            return false;
        };
        let Some((pid, _)) = rest.split_once('-') else {
            return false;
        };
        pid.parse::<u32>()
            .is_ok_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    });
}

impl std::fmt::Debug for LibfabricDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibfabricDomain")
            .field("provider", &self.info.provider_name())
            .field("domain", &self.info.domain_name())
            .field("mr_mode", &self.mr_mode)
            .finish_non_exhaustive()
    }
}

/// The provider to use when the config names none: `TRANSFER_PROVIDER`,
/// else EFA when this machine has it, else `tcp`.
///
/// `tcp` (`tcp;ofi_rxm`) is the fallback because it works everywhere a
/// network does: between processes and between hosts, over any interface,
/// with the same RDM + RMA + remote-CQ-data call path as EFA. `shm` is
/// faster but reaches only processes on the same host, so as a silent
/// default it would turn a multi-host setup into a failure at resolve time.
pub fn default_provider(lib: &Arc<Library>) -> Provider {
    if let Some(p) = Provider::from_env() {
        return p;
    }
    if devinfo::provider_available(lib, &Provider::Efa) {
        Provider::Efa
    } else {
        Provider::Tcp
    }
}

fn provider_of(lib: &Arc<Library>, config: &LibfabricConfig) -> Provider {
    config
        .provider
        .clone()
        .unwrap_or_else(|| default_provider(lib))
}

/// Opens one [`LibfabricDomain`] per NIC (distinct `fi_info` domain) the
/// provider offers.
pub fn open_domains(config: &LibfabricConfig) -> Result<Vec<LibfabricDomain>> {
    let lib = Library::load()?;
    open_domains_with(&lib, config)
}

/// [`open_domains`] with an already loaded library.
pub fn open_domains_with(
    lib: &Arc<Library>,
    config: &LibfabricConfig,
) -> Result<Vec<LibfabricDomain>> {
    let provider = provider_of(lib, config);
    devinfo::get_info(lib, &provider, config)?
        .into_iter()
        .map(|info| LibfabricDomain::open(info, config))
        .collect()
}

/// Opens `n` independent domains (each its own fabric, domain and
/// endpoint) on the first NIC of the provider: on tcp or shm one NIC is one
/// domain, so this is how tests and single-host benchmarks get N real
/// endpoints for multi-domain sharding. Use [`LibfabricConfig::loopback`] to stay on
/// `127.0.0.1`.
pub fn open_loopback_domains(config: &LibfabricConfig, n: usize) -> Result<Vec<LibfabricDomain>> {
    let lib = Library::load()?;
    let provider = provider_of(&lib, config);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let info = devinfo::get_info(&lib, &provider, config)?
            .into_iter()
            .next()
            .ok_or_else(|| {
                transfer_core::TransferError::invalid("open_loopback_domains", "no NIC")
            })?;
        out.push(LibfabricDomain::open(info, config)?);
    }
    Ok(out)
}

impl LibfabricDomain {
    pub(crate) fn open(mut info: OwnedInfo, config: &LibfabricConfig) -> Result<Self> {
        let mut shm_name = None;
        let mut bell = None;
        if info.provider_name() == "shm" && info.addr_format() == sys::FI_ADDR_STR {
            // shm derives the endpoint's name from the source address plus
            // a counter it restarts, which collides with the endpoints our
            // Drop leaks (fi_enable: EBUSY): give each one a name of its own.
            // The random part keeps a later process that gets the same pid
            // from colliding with files a killed one left (seen: EBUSY).
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, AtomicOrdering::Relaxed);
            let mut r = [0u8; 4];
            let salt = getrandom::getrandom(&mut r).map_or(0, |()| u32::from_le_bytes(r));
            let name = format!("trx{}-{salt:08x}-{n}", std::process::id());
            info.set_src_addr_str(&format!("fi_shm://{name}"))?;
            remove_stale_shm_files();
            // Without a doorbell (files refused, /dev/shm full) the worker
            // parks on timers as before: slower to wake, still correct.
            if config.wait_fd {
                bell = Doorbell::create(&name).ok();
            }
            shm_name = Some(name);
        }
        let lib = info.library().clone();
        let fabric = Fabric::open(&info)?;
        let domain = FiDomain::open(&fabric, &info)?;
        let cq = CompletionQueue::open(&domain, config.cq_size.max(64), config.wait_fd)?;
        let av = AddressVector::open(&domain, info.av_type())?;
        let ep = Endpoint::open(&domain, &info, &cq, &av)?;
        let mr_mode = info.mr_mode();
        let raw = ep.name()?;
        let format = AddressFormat {
            provider: info.provider_name(),
            addr_format: info.addr_format(),
            raw_len: raw.len(),
        };
        let address = address::encode(&format, &raw);
        let mut next_key = 1;
        let key_mask = match info.mr_key_size() {
            n if n >= 8 => u64::MAX,
            n => (1u64 << (8 * n)) - 1,
        };
        let bounce = if mr_mode & sys::FI_MR_LOCAL != 0 {
            let ep_bind = (mr_mode & sys::FI_MR_ENDPOINT != 0).then_some(&ep);
            let slab = BounceSlab::new(
                &domain,
                config.send_slots,
                config.send_slot_size,
                next_key,
                ep_bind,
            )?;
            next_key += 1;
            Some(slab)
        } else {
            None
        };
        let delivery_complete = config.delivery_complete.unwrap_or(true);
        // In order by holding immediates back (crate::gate), which needs
        // delivery completions to know that a write's bytes landed. EFA
        // keeps its unordered semantics (an immediate on every write).
        let ordered = delivery_complete && info.provider_name() != "efa";
        let now = Instant::now();
        // An unknown send queue depth (0) sets no limit.
        let peer_cap = match info.tx_size() {
            0 => usize::MAX,
            n => (n / 2).max(1),
        };
        Ok(Self {
            ep,
            slots: SlotPool::default(),
            mrs: HashMap::new(),
            bounce,
            cq,
            av,
            domain,
            fabric,
            max_write: info.max_msg_size(),
            write_flags: if delivery_complete {
                sys::FI_DELIVERY_COMPLETE
            } else {
                0
            },
            ordered,
            gates: Gates::default(),
            merge: if ordered {
                Limits::new(info.iov_limit(), info.rma_iov_limit(), info.max_msg_size())
            } else {
                Limits::SINGLE
            },
            shm_name,
            bell,
            peer_bells: HashMap::new(),
            tx: None,
            wedged: Vec::new(),
            abandoned: Vec::new(),
            tx_replacements: 0,
            info,
            lib,
            config: config.clone(),
            mr_mode,
            format,
            address,
            next_mr: 0,
            next_key,
            key_mask,
            peers: Peers::default(),
            ops: Ops::default(),
            queue: PeerQueues::default(),
            posted_to: HashMap::new(),
            peer_cap,
            retries: Vec::new(),
            recv_queue: VecDeque::new(),
            ready: Vec::new(),
            last_completion: now,
            last_timeout_check: now,
            cq_buf: (0..64)
                .map(|_| sys::fi_cq_data_entry {
                    op_context: std::ptr::null_mut(),
                    flags: 0,
                    len: 0,
                    buf: std::ptr::null_mut(),
                    data: 0,
                })
                .collect(),
        })
    }

    /// The provider's name as libfabric reports it (e.g. `tcp;ofi_rxm`).
    pub fn provider_name(&self) -> String {
        self.info.provider_name()
    }

    /// The fabric name (e.g. `127.0.0.1/32`).
    pub fn fabric_name(&self) -> String {
        self.info.fabric_name()
    }

    /// The mr_mode bits the provider returned (FI_MR_*).
    pub fn mr_mode(&self) -> i32 {
        self.mr_mode
    }

    /// Whether remote addresses are virtual addresses (FI_MR_VIRT_ADDR);
    /// otherwise they are offsets into the region.
    pub fn virt_addr(&self) -> bool {
        self.mr_mode & sys::FI_MR_VIRT_ADDR != 0
    }

    /// The libfabric API version in use.
    pub fn api_version(&self) -> String {
        self.lib.version_string()
    }

    /// Transmit queue depth the provider reported.
    pub fn tx_queue_size(&self) -> usize {
        self.info.tx_size()
    }

    /// Whether writes use FI_DELIVERY_COMPLETE, so that a write refused by
    /// the target (wrong key, out of range) completes with an error; see
    /// [`LibfabricConfig::delivery_complete`].
    pub fn reports_remote_errors(&self) -> bool {
        self.write_flags & sys::FI_DELIVERY_COMPLETE != 0
    }

    /// Registration `mr`, or why `call` cannot use it.
    pub(crate) fn registration(
        &self,
        call: &'static str,
        mr: DomainMr,
    ) -> Result<&MemoryRegistration> {
        self.mrs
            .get(&mr.0)
            .ok_or(TransferError::RegionUnregistered { call })
    }

    /// Number of submit calls in flight.
    pub fn ops_in_flight(&self) -> usize {
        self.ops.len()
    }

    /// Rings the doorbell of every peer with work posted to it that may be
    /// blocked: shm moves a write only while its target polls, so a sender
    /// waiting for a completion (a large write's later segments come from
    /// the provider's progress, not from a post) wakes a target that went
    /// to sleep meanwhile. One load per such peer while it is awake.
    pub(crate) fn ring_sleeping_peers(&mut self) {
        if self.peer_bells.is_empty() {
            return;
        }
        for peer in self.posted_to.keys() {
            if let Some(b) = self.peer_bells.get_mut(peer) {
                b.ring_if_asleep();
            }
        }
    }

    /// [`Domain::prepare_wait`] of an shm domain with a doorbell: refuses
    /// while work is queued or a peer rang since the last sleep (traffic is
    /// flowing: spin on), else tells peers it may block and polls its CQ
    /// once more (a write posted before they could see that is processed
    /// here; one posted after makes its sender ring).
    fn prepare_doorbell_wait(&mut self) -> bool {
        let Some(bell) = &self.bell else {
            return false;
        };
        if !(self.ready.is_empty()
            && self.queue.is_empty()
            && self.retries.is_empty()
            && self.recv_queue.is_empty())
        {
            return false;
        }
        if bell.drain() {
            return false;
        }
        bell.going_to_sleep();
        self.read_cq();
        if self.ready.is_empty() {
            return true;
        }
        if let Some(b) = &self.bell {
            b.awake();
        }
        false
    }
}

impl Domain for LibfabricDomain {
    fn backend(&self) -> BackendKind {
        BackendKind::Libfabric
    }

    fn info(&self) -> DomainInfo {
        DomainInfo {
            name: self.info.domain_name(),
            provider: self.info.provider_name(),
            link_speed_bps: self.info.link_speed_bps(),
            numa_node: None,
            // Not the provider's order: tcp, shm and udp deliver in order on
            // one connection, but rxm may spread a peer over several after
            // a reconnect, and EFA (SRD) never orders. In order here means
            // this domain holds each immediate until the writes before it
            // in its call were delivered (crate::gate), so the plan may put
            // one immediate per share instead of one per write.
            ordering: if self.ordered {
                Ordering::InOrder
            } else {
                Ordering::Unordered
            },
            max_write_size: self.max_write,
        }
    }

    fn address(&self) -> NicAddress {
        self.address.clone()
    }

    fn register(&mut self, span: MemorySpan) -> Result<Registration> {
        const CALL: &str = "register";
        if span.ptr.is_null() || span.len == 0 {
            return Err(TransferError::invalid(CALL, "empty span"));
        }
        if let MemoryLocation::Cuda { .. } = span.location {
            if !self.config.hmem {
                return Err(TransferError::invalid(
                    CALL,
                    "device memory needs a domain opened with LibfabricConfig::hmem (FI_HMEM)",
                ));
            }
        }
        let key = if self.mr_mode & sys::FI_MR_PROV_KEY != 0 {
            0
        } else {
            self.take_key()
        };
        let ep = (self.mr_mode & sys::FI_MR_ENDPOINT != 0).then_some(&self.ep);
        let mr = match span.location {
            MemoryLocation::Host => {
                MemoryRegistration::register(&self.domain, span.ptr, span.len, key, ep)?
            }
            // dma-buf registration (FI_MR_DMABUF) arrived after libfabric
            // 1.17; `span.dmabuf_fd` is not used yet.
            MemoryLocation::Cuda { device } => MemoryRegistration::register_cuda(
                &self.domain,
                span.ptr,
                span.len,
                device,
                key,
                ep,
            )?,
        };
        let remote = RemoteNicRegion {
            base: if self.virt_addr() { span.ptr as u64 } else { 0 },
            key: RemoteKey(mr.key()),
        };
        self.next_mr += 1;
        let id = DomainMr(self.next_mr);
        self.mrs.insert(id.0, mr);
        Ok(Registration { mr: id, remote })
    }

    fn unregister(&mut self, mr: DomainMr) -> Result<()> {
        // A call failed by timeout or a dead peer may still have writes
        // posted (libfabric cannot cancel them) or queued: the provider may
        // read this memory until they come back, so the region stays.
        let posted = self
            .slots
            .posted()
            .filter(|k| matches!(k, SlotKind::Write { write, .. } if write.head.local_mr == mr))
            .count();
        let queued = self
            .queue
            .iter()
            .filter(|p| matches!(p, Pending::Write { write, .. } if write.head.local_mr == mr))
            .count();
        if posted + queued > 0 {
            return Err(TransferError::RegionBusy {
                in_flight: posted + queued,
            });
        }
        self.mrs
            .remove(&mr.0)
            .map(drop)
            .ok_or(TransferError::RegionUnregistered { call: "unregister" })
    }

    fn resolve_peer(&mut self, addr: &NicAddress) -> Result<PeerId> {
        let raw = address::decode(&self.format, addr)?;
        if let Some(id) = self.peers.cached(raw) {
            return Ok(id);
        }
        // An shm peer of this crate: its doorbell, or a refusal when the
        // files its address names are not one.
        let bell = match (&self.shm_name, crate::doorbell::name_of_raw(raw)) {
            (Some(_), Some(name)) => PeerBell::open(name)?,
            _ => None,
        };
        let fi_addr = self.av.insert(raw)?;
        let id = self.peers.add(raw, fi_addr);
        if let Some(b) = bell {
            self.peer_bells.insert(id, b);
        }
        Ok(id)
    }

    fn remove_peer(&mut self, peer: PeerId) {
        self.peer_bells.remove(&peer);
        if let Some(fi_addr) = self.peers.remove(peer) {
            // A failed removal leaves a stale AV entry nobody refers to.
            let _ = self.av.remove(fi_addr);
        }
    }

    fn post_recv(
        &mut self,
        token: RecvToken,
        mr: DomainMr,
        buf: *mut u8,
        len: usize,
    ) -> Result<()> {
        const CALL: &str = "post_recv";
        let reg = self.registration(CALL, mr)?;
        if !reg.contains(buf as usize, len) {
            return Err(TransferError::invalid(
                CALL,
                "receive buffer lies outside its registration",
            ));
        }
        let r = PendingRecv {
            token,
            mr,
            buf,
            len,
        };
        match self.post_recv_now(&r) {
            Ok(()) => Ok(()),
            Err(PostError::Again) => {
                self.recv_queue.push_back(r);
                Ok(())
            }
            Err(PostError::Fail(e)) => Err(e),
        }
    }

    fn submit_send(&mut self, op: OpToken, peer: PeerId, data: Vec<u8>) {
        const CALL: &str = "submit_send";
        if let Err(e) = self.peers.fi_addr(CALL, peer) {
            return self.fail_now(op, e);
        }
        if data.len() as u64 > self.max_write {
            return self.fail_now(
                op,
                TransferError::invalid(CALL, "message exceeds the provider's maximum"),
            );
        }
        let id = self.ops.start(op, 1, Instant::now());
        self.post_or_queue(Pending::Send { op: id, peer, data });
    }

    fn submit_writes(&mut self, op: OpToken, writes: &[WriteOp]) {
        if writes.is_empty() {
            self.ready
                .push(DomainEvent::Completed { op, result: Ok(()) });
            return;
        }
        if let Some(e) = writes.iter().find_map(|w| self.check_write(w).err()) {
            return self.fail_now(op, e);
        }
        // Unordered, every write carries its immediate and goes alone.
        let postings = posting::merge(writes, self.merge);
        let id = self.ops.start(op, postings.len(), Instant::now());
        let now = if self.ordered {
            let mut now = Vec::with_capacity(postings.len());
            self.gates.admit(id, &postings, |p| now.push(*p));
            now
        } else {
            postings
        };
        let mut iter = now.into_iter();
        if let Some(first) = iter.next() {
            let eager = Pending::Write {
                op: id,
                write: first,
                retried: false,
            };
            self.post_or_queue(eager);
        }
        for w in iter {
            self.queue.push_back(Pending::Write {
                op: id,
                write: w,
                retried: false,
            });
        }
    }

    fn poll(&mut self, events: &mut Vec<DomainEvent>) {
        if let Some(b) = &self.bell {
            b.awake();
        }
        self.read_cq();
        self.drain_queue(self.config.post_batch.max(1));
        self.check_timeouts();
        let ops = &self.ops;
        self.gates.retain_live(|op| ops.is_live(op));
        self.ring_sleeping_peers();
        events.append(&mut self.ready);
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.cq.wait_fd.or(self.bell.as_ref().map(Doorbell::fd))
    }

    fn prepare_wait(&mut self) -> bool {
        if self.cq.wait_fd.is_none() && self.bell.is_some() {
            return self.prepare_doorbell_wait();
        }
        // fi_trywait only on a CQ with a wait object (1.17 shm crashes in
        // fi_trywait on one without).
        self.cq.wait_fd.is_some()
            && self.ready.is_empty()
            && self.queue_stuck()
            && self.retries.is_empty()
            && self.recv_queue.is_empty()
            && self.fabric.trywait(self.cq.ptr)
    }

    /// tcp (`tcp;ofi_rxm`): the CQ's wait descriptor is the provider's
    /// poll set of its sockets, which holds POLLIN always and POLLOUT
    /// while a send met a full socket (libfabric's xnet progress), so it
    /// fires for everything a write in flight waits on: room in the
    /// socket, the peer's delivery acknowledgement. Blocking there instead
    /// of spinning until the last completion matters where the link, not
    /// the CPU, is the limit and cores are shared. Measured: kv --quick
    /// between two namespace hosts of a 2-core machine at load ~10,
    /// interleaved, ours / link rate: 1 Gbit/s tbf 0.45 -> 0.59 (C=0) and
    /// 0.41 -> 0.62 (C=500 µs); 200 Mbit/s 0.99 either way, the sender's
    /// worker CPU 1.77 -> 0.33 s per run.
    fn wait_covers_in_flight(&self) -> bool {
        self.cq.wait_fd.is_some() && self.info.provider_name().starts_with("tcp")
    }

    fn has_pending(&self) -> bool {
        !self.ops.is_empty()
            || !self.queue.is_empty()
            || !self.retries.is_empty()
            || !self.ready.is_empty()
    }
}
