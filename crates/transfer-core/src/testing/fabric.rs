//! The shared state of the in-memory fabric: NICs, their registered memory
//! and their inboxes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::addr::{NicAddress, Ordering};
use crate::error::{Result, TransferError};
use crate::wakeup::EventFd;

use super::domain::TestDomain;

/// How the fabric behaves.
#[derive(Debug, Clone, Copy)]
pub struct TestFabricConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Execute posted operations in random order (unordered delivery, like
    /// EFA SRD) instead of posting order.
    pub reorder: bool,
    /// At most this many operations execute per poll (forces partial progress).
    pub ops_per_poll: usize,
    /// Registrations report virtual addresses (`true`) or offsets (`false`,
    /// like libfabric providers without `FI_MR_VIRT_ADDR`).
    pub virt_addr: bool,
    /// NICs offer a wait descriptor (exercises the workers' blocking idle
    /// path); without, workers park on timers.
    pub wait_fd: bool,
    /// Largest write a NIC accepts ([`crate::DomainInfo::max_write_size`]);
    /// longer ones fail as libfabric fails them, so the engine must split.
    pub max_write_size: u64,
    /// Every submit call sleeps this long (a provider that moves data
    /// inside the call): checks that a baseline's clock covers the call.
    pub submit_delay: std::time::Duration,
}

impl Default for TestFabricConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            reorder: true,
            ops_per_poll: 8,
            virt_addr: true,
            wait_fd: true,
            max_write_size: u64::MAX,
            submit_delay: std::time::Duration::ZERO,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Mr {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    /// Remote address of byte 0 (the pointer, or 0 in offset mode).
    pub(crate) base: u64,
}

#[derive(Default)]
pub(crate) struct Nic {
    pub(crate) remote_mrs: HashMap<u64, Mr>,
    pub(crate) imms: VecDeque<u32>,
    pub(crate) posted: VecDeque<(u64, usize, usize)>,
    pub(crate) received: VecDeque<(u64, usize)>,
    /// Remote address and length of every write posted from this NIC, in
    /// posting order ([`TestFabric::writes_posted`]).
    pub(crate) writes_posted: Vec<(u64, usize)>,
    /// Signalled on every delivery to this NIC.
    pub(crate) event: Option<Arc<EventFd>>,
}

impl Nic {
    pub(crate) fn notify(&self) {
        if let Some(e) = &self.event {
            e.signal();
        }
    }
}

pub(crate) struct FabricState {
    pub(crate) config: TestFabricConfig,
    pub(crate) rng: StdRng,
    pub(crate) nics: HashMap<u64, Nic>,
    pub(crate) next_nic: u64,
    pub(crate) next_key: u64,
    pub(crate) fail_writes: u64,
    pub(crate) refuse_unregisters: u64,
    /// While set, posted operations stay posted (a slow network).
    pub(crate) held: bool,
}

/// The in-memory fabric; clone it to share.
#[derive(Clone)]
pub struct TestFabric(pub(crate) Arc<Mutex<FabricState>>);

impl TestFabric {
    /// A new fabric.
    pub fn new(config: TestFabricConfig) -> Self {
        Self(Arc::new(Mutex::new(FabricState {
            config,
            rng: StdRng::seed_from_u64(config.seed),
            nics: HashMap::new(),
            next_nic: 1,
            next_key: 0x1000,
            fail_writes: 0,
            refuse_unregisters: 0,
            held: false,
        })))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, FabricState> {
        // Test double: a panic in one test thread must not cascade.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a new NIC on the fabric.
    pub fn domain(&self) -> TestDomain {
        let mut s = self.lock();
        let id = s.next_nic;
        s.next_nic += 1;
        let event = if s.config.wait_fd {
            EventFd::new().ok().map(Arc::new)
        } else {
            None
        };
        s.nics.insert(
            id,
            Nic {
                event: event.clone(),
                ..Nic::default()
            },
        );
        let ordering = if s.config.reorder {
            Ordering::Unordered
        } else {
            Ordering::InOrder
        };
        TestDomain::new(self.clone(), id, ordering, event)
    }

    /// `n` NICs.
    pub fn domains(&self, n: usize) -> Vec<TestDomain> {
        (0..n).map(|_| self.domain()).collect()
    }

    /// Makes the next `n` writes (anywhere on the fabric) fail.
    pub fn fail_next_writes(&self, n: u64) {
        self.lock().fail_writes = n;
    }

    /// While `held`, no posted operation executes or completes (as on a
    /// network slower than the test), so "in flight" is a state a test can
    /// rely on; releasing lets them all proceed.
    pub fn hold(&self, held: bool) {
        self.lock().held = held;
    }

    /// Makes the next `n` unregistrations fail as if the NIC still held
    /// transfers it cannot cancel.
    pub fn refuse_next_unregisters(&self, n: u64) {
        self.lock().refuse_unregisters = n;
    }

    /// Remote address and length of every write posted from the NIC at
    /// `addr` so far, in posting order (empty for an unknown NIC): how an
    /// engine spread a transfer over its NICs.
    pub fn writes_posted(&self, addr: &NicAddress) -> Vec<(u64, usize)> {
        decode_nic(addr)
            .ok()
            .and_then(|id| self.lock().nics.get(&id).map(|n| n.writes_posted.clone()))
            .unwrap_or_default()
    }

    /// Removes a NIC as if its host died: operations to it fail.
    pub fn kill(&self, addr: &NicAddress) -> Result<()> {
        let id = decode_nic(addr)?;
        self.lock().nics.remove(&id);
        Ok(())
    }
}

pub(crate) fn encode_nic(id: u64) -> NicAddress {
    let mut v = b"tnic".to_vec();
    v.extend_from_slice(&id.to_le_bytes());
    NicAddress(v)
}

pub(crate) fn decode_nic(addr: &NicAddress) -> Result<u64> {
    let bytes = addr.0.as_slice();
    match bytes.strip_prefix(b"tnic") {
        Some(rest) if rest.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(rest);
            Ok(u64::from_le_bytes(b))
        }
        _ => Err(TransferError::malformed(
            "TestDomain::resolve_peer",
            format!("{} bytes are not a test NIC address", bytes.len()),
        )),
    }
}
