//! [`DomainGroup`]: the NICs one worker thread owns.

use crate::addr::{BackendKind, GroupAddress, Ordering};
use crate::domain::{Domain, DomainEvent};
use crate::error::{Result, TransferError};
use crate::shard::ShardPolicy;

/// 1..N domains (any N) of one backend, owned by one worker thread, so the
/// data path takes no locks. NIC `i` of this group pairs with NIC `i` of the
/// peer's group.
pub struct DomainGroup<D: Domain> {
    domains: Vec<D>,
}

impl<D: Domain> DomainGroup<D> {
    /// Groups `domains`; refuses an empty list or mixed backends.
    pub fn new(domains: Vec<D>) -> Result<Self> {
        const CALL: &str = "DomainGroup::new";
        let Some(first) = domains.first() else {
            return Err(TransferError::invalid(
                CALL,
                "a domain group needs at least one domain",
            ));
        };
        let backend = first.backend();
        if let Some(d) = domains.iter().find(|d| d.backend() != backend) {
            return Err(TransferError::BackendMismatch {
                call: CALL,
                expected: backend,
                got: d.backend(),
            });
        }
        Ok(Self { domains })
    }

    /// Number of NICs.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Always false (construction refuses empty groups).
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The backend of every domain.
    pub fn backend(&self) -> BackendKind {
        self.domains
            .first()
            .map_or(BackendKind::Test, Domain::backend)
    }

    /// Domain `i`.
    pub fn domain_mut(&mut self, i: usize) -> Option<&mut D> {
        self.domains.get_mut(i)
    }

    /// All domains.
    pub fn domains(&self) -> &[D] {
        &self.domains
    }

    /// All domains, mutably.
    pub fn domains_mut(&mut self) -> &mut [D] {
        &mut self.domains
    }

    /// The group's address: InOrder only if every NIC delivers in order;
    /// the write size limit of its most limited NIC.
    pub fn address(&self, shard_policy: ShardPolicy) -> GroupAddress {
        let ordering = if self
            .domains
            .iter()
            .all(|d| d.info().ordering == Ordering::InOrder)
        {
            Ordering::InOrder
        } else {
            Ordering::Unordered
        };
        // 0 (no limit known) must not win the minimum.
        let max_write_size = self
            .domains
            .iter()
            .map(|d| d.info().max_write_size)
            .filter(|&m| m != 0)
            .min()
            .unwrap_or(0);
        GroupAddress {
            nics: self.domains.iter().map(Domain::address).collect(),
            ordering,
            shard_policy,
            max_write_size,
        }
    }

    /// Polls every domain, appending `(nic, event)` pairs.
    pub fn poll(&mut self, scratch: &mut Vec<DomainEvent>, out: &mut Vec<(usize, DomainEvent)>) {
        for (i, d) in self.domains.iter_mut().enumerate() {
            scratch.clear();
            d.poll(scratch);
            out.extend(scratch.drain(..).map(|e| (i, e)));
        }
    }

    /// Whether any domain has operations outstanding.
    pub fn has_pending(&self) -> bool {
        self.domains.iter().any(Domain::has_pending)
    }
}
