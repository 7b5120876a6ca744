//! The server's engine, its address and the registration cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use transfer::{Backend, Domains};
use transfer_core::{
    BackendKind, LocalRegion, MemoryLocation, MemorySpan, Notify, RemoteTarget, TransferEngine,
    TransferError,
};

use super::config::EngineLinkConfig;
use super::lanes::LaneTable;
use crate::error::{Result, RpcError};
use crate::protocol::engine::{
    BACKEND_LIBFABRIC, BACKEND_TEST, BACKEND_VERBS, IMM_SEQ_BITS, LaneId, PROBE_LANE, lane_imm,
};
use crate::server::BufferRegistry;
use crate::server::registry::Buffer;

/// A buffer registered with the engine. Holding the buffer's `Arc` keeps
/// its memory allocated for as long as the NICs may touch it.
struct Registered {
    region: LocalRegion,
    buffer: Arc<Buffer>,
}

/// Turns an engine error into this crate's error, naming the call.
pub(crate) fn engine_error(call: &'static str, e: TransferError) -> RpcError {
    RpcError::refused(call, e.to_string())
}

/// A server's TransferEngine, shared by its sessions.
///
/// Field order is drop order: the engine (its workers and NICs) goes
/// first, then the registrations and the buffers they keep alive.
pub struct EngineLink {
    engine: TransferEngine,
    address: Vec<u8>,
    backend_tag: u8,
    description: String,
    config: EngineLinkConfig,
    lanes: LaneTable,
    /// Live registrations by buffer handle.
    regions: Mutex<HashMap<u64, Registered>>,
    /// Write targets of inbound lanes, by lane: each registers exactly the
    /// lane's range, so a sender holding the descriptor (or forging one
    /// from it) reaches those bytes and nothing else of the buffer.
    targets: Mutex<HashMap<LaneId, Registered>>,
    /// Registrations whose buffer is gone but whose unregister was refused
    /// (a write still posted): kept, memory included, and retried.
    retired: Mutex<Vec<Registered>>,
    /// Engine-owned regions (lane slot rings) whose unregister was refused.
    retired_own: Mutex<Vec<LocalRegion>>,
}

impl std::fmt::Debug for EngineLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLink")
            .field("engine", &self.description)
            .field("lanes", &self.lanes)
            .finish_non_exhaustive()
    }
}

/// The provider name that selects the native ibverbs backend instead of a
/// libfabric provider (libfabric's own `verbs` provider stays `verbs`).
pub const NATIVE_VERBS: &str = "ibverbs";

/// The backend `config` names: native verbs on `config.domain` (default:
/// the first device with an active port; port and GID index from the
/// TRANSFER_VERBS_* environment), else the libfabric provider bound to
/// `config.node`, only the domain `config.domain` when given. `nics`: 0 is
/// every NIC the provider lists (verbs: one domain), n is n domains.
fn backend_of(config: &EngineLinkConfig) -> Backend {
    let backend = if config.provider == NATIVE_VERBS {
        Backend::verbs(config.domain.as_deref())
    } else {
        let mut b = Backend::libfabric(&config.provider).peer_timeout(config.peer_timeout);
        if let Some(node) = &config.node {
            b = b.bind(node.clone());
        }
        if let Some(domain) = &config.domain {
            b = b.domain_name(domain.clone());
        }
        b
    };
    backend.nics(config.nics)
}

/// Provider and NICs, for logs.
fn describe(backend: &Backend, config: &EngineLinkConfig, domains: &Domains) -> String {
    match domains {
        Domains::Libfabric(nics) => {
            let names: Vec<String> = nics.iter().map(|d| d.fabric_name()).collect();
            format!("libfabric {}: {}", backend.name(), names.join(", "))
        }
        Domains::Verbs(nics) => format!(
            "ibverbs {} x{}",
            config.domain.as_deref().unwrap_or("(first active device)"),
            nics.len()
        ),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EngineLink {
    /// Opens the backend of `config` and starts an engine on it: the native
    /// ibverbs backend for provider [`NATIVE_VERBS`], else that libfabric
    /// provider. Opening is the `transfer` crate's (one copy of "provider
    /// name -> domains" for the bench, the server and the Python package).
    pub fn open(config: EngineLinkConfig) -> Result<Arc<EngineLink>> {
        const CALL: &str = "EngineLink::open";
        let backend = backend_of(&config);
        let domains = backend
            .open_domains()
            .map_err(|e| RpcError::refused(CALL, e.to_string()))?;
        let description = describe(&backend, &config, &domains);
        let engine = domains
            .add_to(TransferEngine::builder())
            .build()
            .map_err(|e| engine_error(CALL, e))?;
        EngineLink::with_engine(engine, description, config)
    }

    /// Wraps an already built engine (any backend).
    pub fn with_engine(
        engine: TransferEngine,
        description: String,
        config: EngineLinkConfig,
    ) -> Result<Arc<EngineLink>> {
        let address = engine
            .address()
            .to_bytes()
            .map_err(|e| engine_error("EngineLink::with_engine", e))?;
        // Immediates are `lane << IMM_SEQ_BITS | seq`: each lane is a
        // partition charged to the session that owns it, so a tenant that
        // floods its own lane fills its own account, not an engine-wide
        // cap every tenant shares (and arrivals on lanes nobody holds,
        // the probe lane included, are not kept).
        engine.account_imms(IMM_SEQ_BITS);
        let backend_tag = match engine.address().backend {
            BackendKind::Libfabric => BACKEND_LIBFABRIC,
            BackendKind::Verbs => BACKEND_VERBS,
            BackendKind::Test => BACKEND_TEST,
        };
        Ok(Arc::new(EngineLink {
            engine,
            address,
            backend_tag,
            description,
            config,
            lanes: LaneTable::new(),
            regions: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            retired_own: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
        }))
    }

    /// The engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    /// The engine's `EngineAddress` bytes (ENGINE_INFO).
    pub fn address_bytes(&self) -> &[u8] {
        &self.address
    }

    /// Backend tag for ENGINE_INFO.
    pub fn backend_tag(&self) -> u8 {
        self.backend_tag
    }

    /// Provider and NICs, for logs.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The configuration.
    pub fn config(&self) -> &EngineLinkConfig {
        &self.config
    }

    /// The server-wide lane table.
    pub fn lanes(&self) -> &LaneTable {
        &self.lanes
    }

    /// Buffers currently registered as write sources.
    pub fn registrations(&self) -> usize {
        lock(&self.regions).len()
    }

    /// Inbound lanes currently registered as write targets.
    pub fn targets(&self) -> usize {
        lock(&self.targets).len()
    }

    /// Registers exactly `[offset, offset + size)` of `buffer` as the write
    /// target of `lane` and returns its descriptor. The range must be
    /// inside the buffer (checked by the caller and again here).
    pub fn register_target(
        &self,
        call: &'static str,
        lane: LaneId,
        buffer: &Arc<Buffer>,
        offset: u64,
        size: u64,
    ) -> Result<transfer_core::RemoteRegion> {
        let (ptr, len) = buffer.host_memory();
        let end = offset
            .checked_add(size)
            .filter(|&e| size > 0 && e <= len as u64)
            .ok_or_else(|| RpcError::refused(call, "range is not inside the buffer"))?;
        let start = usize::try_from(offset).map_err(|_| RpcError::refused(call, "offset"))?;
        let span = MemorySpan {
            // SAFETY: `start < end <= len`, so the pointer stays inside the
            // buffer's memory.
            ptr: unsafe { ptr.add(start) },
            len: usize::try_from(end - offset).map_err(|_| RpcError::refused(call, "size"))?,
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        // SAFETY: the span lies inside `buffer`'s memory, which never moves
        // and stays allocated while the `Arc` kept next to the registration
        // lives: until `unregister` succeeded (`close_target`, `release`,
        // `sweep`, `retry_retired`) or the engine is gone.
        let region =
            unsafe { self.engine.register_raw(span, 0) }.map_err(|e| engine_error(call, e))?;
        let remote = region.remote().clone();
        let old = lock(&self.targets).insert(
            lane,
            Registered {
                region,
                buffer: Arc::clone(buffer),
            },
        );
        if let Some(old) = old {
            self.retire(old);
        }
        Ok(remote)
    }

    /// Unregisters the target of `lane` (closed by its session).
    pub fn close_target(&self, lane: LaneId) {
        let old = lock(&self.targets).remove(&lane);
        if let Some(old) = old {
            self.retire(old);
        }
        // Immediates that arrived for the lane and were never waited for
        // leave with it.
        self.engine.release_imm_partition(lane.0);
    }

    /// Registrations kept after their buffer was freed, because a write
    /// was still posted when it was.
    pub fn retired(&self) -> usize {
        lock(&self.retired).len()
    }

    /// Allocates a lane for `session`, its immediates charged to the
    /// session's account. A reused id first has any leftover immediates of
    /// its previous owner discarded.
    pub fn alloc_lane(&self, session: u64) -> Option<LaneId> {
        let new = self.lanes.alloc(session)?;
        if new.reused {
            self.engine.release_imm_partition(new.lane.0);
        }
        self.engine
            .set_imm_account(session, self.config.max_unexpected_imms_per_session);
        self.engine.assign_imm_partition(new.lane.0, session);
        Some(new.lane)
    }

    /// Forgets `session`'s immediate account (its lanes were closed).
    pub fn end_session(&self, session: u64) {
        self.engine.remove_imm_account(session);
    }

    /// The registration of `buffer` (the whole buffer, registered once and
    /// cached by handle).
    pub fn region_for(&self, call: &'static str, buffer: &Arc<Buffer>) -> Result<LocalRegion> {
        let mut regions = lock(&self.regions);
        if let Some(r) = regions.get(&buffer.handle) {
            if Arc::ptr_eq(&r.buffer, buffer) {
                return Ok(r.region.clone());
            }
        }
        let (ptr, len) = buffer.host_memory();
        let span = MemorySpan {
            ptr,
            len,
            location: MemoryLocation::Host,
            dmabuf_fd: None,
        };
        // SAFETY: the memory belongs to `buffer`, which never moves or frees
        // it while alive; the `Arc` stored next to the region keeps it alive
        // until `unregister` succeeded (`release`, `retry_retired`) or the
        // engine, dropped before the registrations, is gone.
        let region =
            unsafe { self.engine.register_raw(span, 0) }.map_err(|e| engine_error(call, e))?;
        if let Some(old) = regions.insert(
            buffer.handle,
            Registered {
                region: region.clone(),
                buffer: Arc::clone(buffer),
            },
        ) {
            drop(regions);
            self.retire(old);
        }
        Ok(region)
    }

    /// Drops the registration of buffer `handle` (after the buffer was freed).
    pub fn release(&self, handle: u64) {
        let old = lock(&self.regions).remove(&handle);
        if let Some(old) = old {
            self.retire(old);
        }
        // Lanes into the freed buffer stay open, but nothing can land in
        // it any more: their writes fail and their waits time out.
        let targets: Vec<Registered> = {
            let mut t = lock(&self.targets);
            let lanes: Vec<LaneId> = t
                .iter()
                .filter(|(_, r)| r.buffer.handle == handle)
                .map(|(l, _)| *l)
                .collect();
            lanes.into_iter().filter_map(|l| t.remove(&l)).collect()
        };
        for r in targets {
            self.retire(r);
        }
        self.retry_retired();
    }

    /// Drops every registration whose buffer is no longer live in `registry`.
    pub fn sweep(&self, registry: &BufferRegistry) {
        let dead: Vec<Registered> = {
            let mut regions = lock(&self.regions);
            let handles: Vec<u64> = regions
                .iter()
                .filter(|(h, r)| {
                    !registry
                        .get(**h)
                        .is_some_and(|live| Arc::ptr_eq(&live, &r.buffer))
                })
                .map(|(h, _)| *h)
                .collect();
            handles
                .into_iter()
                .filter_map(|h| regions.remove(&h))
                .collect()
        };
        let dead_targets: Vec<Registered> = {
            let mut t = lock(&self.targets);
            let lanes: Vec<LaneId> = t
                .iter()
                .filter(|(_, r)| {
                    !registry
                        .get(r.buffer.handle)
                        .is_some_and(|live| Arc::ptr_eq(&live, &r.buffer))
                })
                .map(|(l, _)| *l)
                .collect();
            lanes.into_iter().filter_map(|l| t.remove(&l)).collect()
        };
        for r in dead.into_iter().chain(dead_targets) {
            self.retire(r);
        }
        self.retry_retired();
    }

    fn retire(&self, r: Registered) {
        match self.engine.unregister(&r.region) {
            Ok(()) | Err(TransferError::RegionUnregistered { .. }) => {}
            Err(_) => lock(&self.retired).push(r),
        }
    }

    /// Unregisters an engine-owned region (a slot ring), or keeps it until
    /// a later retry when a write still touches it.
    pub fn drop_region(&self, region: LocalRegion) {
        match self.engine.unregister(&region) {
            Ok(()) | Err(TransferError::RegionUnregistered { .. }) => {}
            Err(_) => lock(&self.retired_own).push(region),
        }
    }

    /// Tries again to unregister retired regions; frees those that went.
    pub fn retry_retired(&self) {
        lock(&self.retired_own).retain(|r| {
            !matches!(
                self.engine.unregister(r),
                Ok(()) | Err(TransferError::RegionUnregistered { .. })
            )
        });
        let mut retired = lock(&self.retired);
        retired.retain(|r| {
            !matches!(
                self.engine.unregister(&r.region),
                Ok(()) | Err(TransferError::RegionUnregistered { .. })
            )
        });
    }

    /// Checks that this engine can reach `target`: a zero-byte write with
    /// the probe immediate (lane 0, never waited for), bounded by the peer
    /// timeout. On failure the peer is forgotten, so that a later attempt
    /// resolves it afresh.
    pub fn probe(&self, target: &RemoteTarget) -> std::result::Result<(), String> {
        let (notify, pending) = Notify::pending();
        let imm = lane_imm(LaneId(PROBE_LANE), 0);
        let result = self
            .engine
            .submit_barrier(std::slice::from_ref(target), imm, notify)
            .and_then(|()| pending.wait_timeout(self.config.peer_timeout + Duration::from_secs(1)));
        result.map_err(|e| {
            let _ = self.engine.forget_peer(target.peer());
            e.to_string()
        })
    }
}
