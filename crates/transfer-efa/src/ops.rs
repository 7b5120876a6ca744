//! Bookkeeping of submit calls: how many operations each still waits for
//! and its first error (transfer-core's [`Countdown`]), how many are posted,
//! and when it last made progress (for timeouts).

use std::collections::HashMap;
use std::time::Instant;

use transfer_core::{Countdown, DomainEvent, OpToken, TransferError};

/// One submit call in flight.
pub(crate) struct OpState {
    /// The caller's token.
    pub(crate) token: OpToken,
    /// Operations not yet completed (posted or queued), and the first error.
    pub(crate) parts: Countdown,
    /// Operations posted and not yet completed.
    pub(crate) posted: usize,
    /// Last post or completion of this call.
    pub(crate) last_activity: Instant,
    /// When the call was submitted.
    pub(crate) submitted: Instant,
}

/// All submit calls in flight, keyed by an internal id (tokens may be
/// reused by the engine once completed; late provider completions of a
/// timed-out call must not hit a newer call with the same token).
#[derive(Default)]
pub(crate) struct Ops {
    next: u64,
    map: HashMap<u64, OpState>,
}

impl Ops {
    /// Registers a call of `count` operations.
    pub(crate) fn start(&mut self, token: OpToken, count: usize, now: Instant) -> u64 {
        self.next += 1;
        let id = self.next;
        self.map.insert(
            id,
            OpState {
                token,
                parts: Countdown::new(count),
                posted: 0,
                last_activity: now,
                submitted: now,
            },
        );
        id
    }

    /// Whether the call still exists (not completed, failed or timed out).
    pub(crate) fn is_live(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    /// Whether the call already failed (queued operations are then skipped).
    pub(crate) fn has_failed(&self, id: u64) -> bool {
        self.map.get(&id).is_some_and(|o| o.parts.has_failed())
    }

    /// Records that one operation of `id` was posted.
    pub(crate) fn posted(&mut self, id: u64, now: Instant) {
        if let Some(op) = self.map.get_mut(&id) {
            op.posted += 1;
            op.last_activity = now;
        }
    }

    /// Records that a posted operation of `id` came back to the queue.
    pub(crate) fn unpost(&mut self, id: u64) {
        if let Some(op) = self.map.get_mut(&id) {
            op.posted = op.posted.saturating_sub(1);
        }
    }

    /// Records one finished operation (`was_posted`: it reached the
    /// provider); returns the call's `Completed` event when it was the last.
    pub(crate) fn finish_one(
        &mut self,
        id: u64,
        result: Result<(), TransferError>,
        was_posted: bool,
        now: Instant,
    ) -> Option<DomainEvent> {
        let op = self.map.get_mut(&id)?;
        if was_posted {
            op.posted = op.posted.saturating_sub(1);
        }
        op.last_activity = now;
        let result = op.parts.settle(result)?;
        let op = self.map.remove(&id)?;
        Some(DomainEvent::Completed {
            op: op.token,
            result,
        })
    }

    /// Fails the call now (timeout); later completions of it are ignored.
    pub(crate) fn abort(&mut self, id: u64, error: TransferError) -> Option<DomainEvent> {
        let mut op = self.map.remove(&id)?;
        Some(DomainEvent::Completed {
            op: op.token,
            result: op.parts.finish(Some(error)),
        })
    }

    /// Calls that made no progress for `limit`: those with posted
    /// operations idle since their last activity, and those never posted
    /// while the whole domain was idle (`domain_idle_since`).
    pub(crate) fn overdue(
        &self,
        now: Instant,
        limit: std::time::Duration,
        domain_idle_since: Instant,
    ) -> Vec<u64> {
        self.map
            .iter()
            .filter(|(_, op)| {
                if op.posted > 0 {
                    now.saturating_duration_since(op.last_activity) > limit
                } else {
                    now.saturating_duration_since(op.submitted) > limit
                        && now.saturating_duration_since(domain_idle_since) > limit
                }
            })
            .map(|(&id, _)| id)
            .collect()
    }

    /// Number of calls in flight.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no call is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
