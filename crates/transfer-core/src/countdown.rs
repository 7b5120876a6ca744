//! One logical operation made of several parts (shards on several NICs,
//! writes of one batch, work requests to several peers): count the parts
//! down, keep the first error, report exactly one outcome.
//!
//! The engine and every backend need this rule in the same form (one
//! [`DomainEvent::Completed`] per submit call, the first error wins), so it
//! lives here once: [`Countdown`] for one operation, [`Countdowns`] for a
//! backend's table keyed by the engine's [`OpToken`].

use std::collections::HashMap;

use crate::domain::{DomainEvent, OpToken};
use crate::error::{Result, TransferError};

/// The parts of one operation still outstanding, and its first error.
#[derive(Debug, Default)]
pub struct Countdown {
    remaining: usize,
    error: Option<TransferError>,
}

impl Countdown {
    /// An operation of `parts` parts.
    pub fn new(parts: usize) -> Self {
        Self {
            remaining: parts,
            error: None,
        }
    }

    /// Adds `parts` more parts (work found after the operation started).
    pub fn add(&mut self, parts: usize) {
        self.remaining += parts;
    }

    /// Parts not settled yet.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Whether a part already failed (later parts may be skipped).
    pub fn has_failed(&self) -> bool {
        self.error.is_some()
    }

    /// Records an error without settling a part; the first error wins.
    pub fn fail(&mut self, error: TransferError) {
        self.error.get_or_insert(error);
    }

    /// Settles one part. Returns the operation's outcome (its first error,
    /// else success) when that was the last part, `None` while parts remain.
    pub fn settle(&mut self, result: Result<()>) -> Option<Result<()>> {
        if let Err(e) = result {
            self.fail(e);
        }
        self.remaining = self.remaining.saturating_sub(1);
        (self.remaining == 0).then(|| self.take_result())
    }

    /// Ends the operation now, whatever remains: its first error, else
    /// `error` when given, else success.
    pub fn finish(&mut self, error: Option<TransferError>) -> Result<()> {
        self.remaining = 0;
        if let Some(e) = error {
            self.fail(e);
        }
        self.take_result()
    }

    fn take_result(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }
}

/// A backend's submit calls in flight, keyed by the engine's token: each
/// reports exactly one [`DomainEvent::Completed`], once its last part settled.
#[derive(Debug, Default)]
pub struct Countdowns {
    map: HashMap<OpToken, Countdown>,
}

impl Countdowns {
    /// Expects `parts` more parts of `op` (starts tracking it if new).
    pub fn expect(&mut self, op: OpToken, parts: usize) {
        self.map.entry(op).or_default().add(parts);
    }

    /// Settles one part of `op`; returns its `Completed` event when that was
    /// the last part. Unknown tokens (already reported) are ignored.
    pub fn settle(&mut self, op: OpToken, result: Result<()>) -> Option<DomainEvent> {
        let result = self.map.get_mut(&op)?.settle(result)?;
        self.map.remove(&op);
        Some(DomainEvent::Completed { op, result })
    }

    /// Number of calls in flight.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(n: i32) -> TransferError {
        TransferError::Backend {
            call: "test",
            backend: crate::BackendKind::Test,
            code: n,
            message: String::new(),
        }
    }

    #[test]
    fn reports_once_after_the_last_part_with_the_first_error() {
        let mut c = Countdown::new(3);
        assert_eq!(c.settle(Ok(())), None);
        assert_eq!(c.settle(Err(err(1))), None);
        assert!(c.has_failed());
        assert_eq!(c.settle(Err(err(2))), Some(Err(err(1))));
    }

    #[test]
    fn finish_prefers_the_recorded_error() {
        let mut c = Countdown::new(2);
        c.fail(err(1));
        assert_eq!(c.finish(Some(err(2))), Err(err(1)));
        assert_eq!(Countdown::new(2).finish(Some(err(2))), Err(err(2)));
        assert_eq!(Countdown::new(2).finish(None), Ok(()));
    }

    #[test]
    fn a_table_completes_each_token_once() {
        let mut t = Countdowns::default();
        t.expect(OpToken(7), 1);
        t.expect(OpToken(7), 1);
        t.expect(OpToken(8), 1);
        assert_eq!(t.settle(OpToken(7), Ok(())), None);
        assert_eq!(
            t.settle(OpToken(7), Err(err(3))),
            Some(DomainEvent::Completed {
                op: OpToken(7),
                result: Err(err(3)),
            })
        );
        assert_eq!(t.settle(OpToken(7), Ok(())), None);
        assert_eq!(t.len(), 1);
        assert!(t.settle(OpToken(8), Ok(())).is_some());
        assert!(t.is_empty());
    }
}
