//! Who gets a connection thread and a session slot.
//!
//! A connection is *pending* from accept until its HELLO, then a *session*.
//! The accept loop never waits for a slot (a server full of silent sockets
//! used to stop accepting altogether): pending connections are bounded in
//! total and per client address, and when a bound is reached the OLDEST
//! pending connection (of that address first) is closed to make room, so a
//! flood of silent sockets cannot keep out a client that says HELLO at once.
//! A pending connection also has a deadline for its HELLO. Sessions are
//! bounded in total and per address; a HELLO that finds no free slot waits
//! for one up to the HELLO deadline, then is refused.
//!
//! [`AdmissionPolicy`] is the bookkeeping alone (no sockets, no threads) so
//! its decisions are unit-tested; [`Admission`] wraps it with the sockets to
//! close and the wait for a slot.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Connection id (the server's session counter).
pub type ConnId = u64;

/// Bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Most sessions (connections past HELLO).
    pub max_sessions: usize,
    /// Most sessions from one client address.
    pub max_sessions_per_address: usize,
    /// Most connections waiting for their HELLO.
    pub max_pending: usize,
    /// Most connections from one address waiting for their HELLO.
    pub max_pending_per_address: usize,
}

/// Why a HELLO was not given a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every session slot is taken.
    ServerFull,
    /// This address holds its share of the slots.
    AddressFull,
    /// The connection was closed (evicted) meanwhile.
    Gone,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::ServerFull => "every session slot is taken (--max-connections)",
            Refusal::AddressFull => "this address holds its share of the sessions",
            Refusal::Gone => "connection closed while waiting for a slot",
        })
    }
}

/// The bookkeeping of pending connections and sessions.
#[derive(Debug)]
pub struct AdmissionPolicy {
    limits: AdmissionLimits,
    /// Pending connections by id; ids grow, so the first is the oldest.
    pending: BTreeMap<ConnId, IpAddr>,
    pending_per_address: HashMap<IpAddr, usize>,
    sessions: usize,
    sessions_per_address: HashMap<IpAddr, usize>,
}

fn dec(map: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = map.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(&ip);
        }
    }
}

impl AdmissionPolicy {
    /// Empty, with these limits (each at least 1).
    pub fn new(limits: AdmissionLimits) -> Self {
        AdmissionPolicy {
            limits: AdmissionLimits {
                max_sessions: limits.max_sessions.max(1),
                max_sessions_per_address: limits.max_sessions_per_address.max(1),
                max_pending: limits.max_pending.max(1),
                max_pending_per_address: limits.max_pending_per_address.max(1),
            },
            pending: BTreeMap::new(),
            pending_per_address: HashMap::new(),
            sessions: 0,
            sessions_per_address: HashMap::new(),
        }
    }

    fn oldest_pending(&self, from: Option<IpAddr>) -> Option<ConnId> {
        self.pending
            .iter()
            .find(|(_, ip)| from.is_none_or(|f| **ip == f))
            .map(|(&id, _)| id)
    }

    /// A connection was accepted. Returns the pending connections to close
    /// to make room for it (at most one per bound).
    pub fn accepted(&mut self, id: ConnId, ip: IpAddr) -> Vec<ConnId> {
        let mut evict = Vec::new();
        let from_ip = self.pending_per_address.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.limits.max_pending_per_address {
            if let Some(victim) = self.oldest_pending(Some(ip)) {
                self.forget_pending(victim);
                evict.push(victim);
            }
        }
        if self.pending.len() >= self.limits.max_pending {
            if let Some(victim) = self.oldest_pending(None) {
                self.forget_pending(victim);
                evict.push(victim);
            }
        }
        self.pending.insert(id, ip);
        *self.pending_per_address.entry(ip).or_insert(0) += 1;
        evict
    }

    fn forget_pending(&mut self, id: ConnId) -> bool {
        match self.pending.remove(&id) {
            Some(ip) => {
                dec(&mut self.pending_per_address, ip);
                true
            }
            None => false,
        }
    }

    /// True while `id` is pending (not evicted, not yet a session).
    pub fn is_pending(&self, id: ConnId) -> bool {
        self.pending.contains_key(&id)
    }

    /// Turns pending `id` into a session if a slot is free.
    pub fn try_promote(&mut self, id: ConnId) -> Result<(), Refusal> {
        let Some(&ip) = self.pending.get(&id) else {
            return Err(Refusal::Gone);
        };
        if self.sessions >= self.limits.max_sessions {
            return Err(Refusal::ServerFull);
        }
        let from_ip = self.sessions_per_address.get(&ip).copied().unwrap_or(0);
        if from_ip >= self.limits.max_sessions_per_address {
            return Err(Refusal::AddressFull);
        }
        self.forget_pending(id);
        self.sessions += 1;
        *self.sessions_per_address.entry(ip).or_insert(0) += 1;
        Ok(())
    }

    /// Connection `id` from `ip` ended; `was_session` after a promotion.
    pub fn closed(&mut self, id: ConnId, ip: IpAddr, was_session: bool) {
        if was_session {
            self.sessions = self.sessions.saturating_sub(1);
            dec(&mut self.sessions_per_address, ip);
        } else {
            self.forget_pending(id);
        }
    }

    /// (pending, sessions).
    pub fn counts(&self) -> (usize, usize) {
        (self.pending.len(), self.sessions)
    }
}

struct State {
    policy: AdmissionPolicy,
    /// Handles to close pending connections chosen for eviction.
    streams: HashMap<ConnId, TcpStream>,
}

/// [`AdmissionPolicy`] with the sockets it closes, shared by the accept
/// loop and the connection threads.
pub struct Admission {
    state: Mutex<State>,
    freed: Condvar,
}

/// A session slot; released on drop.
pub struct SessionSlot {
    admission: Arc<Admission>,
    id: ConnId,
    ip: IpAddr,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.admission.lock().policy.closed(self.id, self.ip, true);
        self.admission.freed.notify_all();
    }
}

impl Admission {
    /// With these limits.
    pub fn new(limits: AdmissionLimits) -> Arc<Admission> {
        Arc::new(Admission {
            state: Mutex::new(State {
                policy: AdmissionPolicy::new(limits),
                streams: HashMap::new(),
            }),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an accepted connection (`stream` is a clone used only to
    /// close it on eviction) and closes the pending connections it evicts.
    pub fn accepted(&self, id: ConnId, ip: IpAddr, stream: Option<TcpStream>) -> usize {
        let victims = {
            let mut st = self.lock();
            let victims = st.policy.accepted(id, ip);
            if let Some(s) = stream {
                st.streams.insert(id, s);
            }
            victims
                .into_iter()
                .filter_map(|v| st.streams.remove(&v))
                .collect::<Vec<_>>()
        };
        for s in &victims {
            // The victim's thread sees its read fail and ends.
            let _ = s.shutdown(Shutdown::Both);
        }
        if !victims.is_empty() {
            self.freed.notify_all();
        }
        victims.len()
    }

    /// Promotes pending `id` to a session, waiting up to `wait` for a slot.
    pub fn promote(
        self: &Arc<Self>,
        id: ConnId,
        ip: IpAddr,
        wait: Duration,
    ) -> Result<SessionSlot, Refusal> {
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            match st.policy.try_promote(id) {
                Ok(()) => {
                    st.streams.remove(&id);
                    return Ok(SessionSlot {
                        admission: Arc::clone(self),
                        id,
                        ip,
                    });
                }
                // This address's own sessions hold its share: only they can
                // free a slot, and a client that opens one more while its
                // others live gains nothing from waiting. Told at once (the
                // connection closes now, not at its HELLO deadline).
                Err(r @ (Refusal::Gone | Refusal::AddressFull)) => return Err(r),
                Err(r) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(r);
                    }
                    st = self
                        .freed
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// A connection that never became a session ended.
    pub fn pending_closed(&self, id: ConnId, ip: IpAddr) {
        let mut st = self.lock();
        st.policy.closed(id, ip, false);
        st.streams.remove(&id);
    }

    /// (pending, sessions).
    pub fn counts(&self) -> (usize, usize) {
        self.lock().policy.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    fn limits() -> AdmissionLimits {
        AdmissionLimits {
            max_sessions: 3,
            max_sessions_per_address: 2,
            max_pending: 4,
            max_pending_per_address: 3,
        }
    }

    #[test]
    fn silent_connections_are_evicted_oldest_first() {
        let mut p = AdmissionPolicy::new(limits());
        // 500 silent connections from one address: never more than 3 held,
        // each new one evicts the oldest of that address.
        let mut evicted = Vec::new();
        for id in 1..=500 {
            evicted.extend(p.accepted(id, ip(1)));
        }
        assert_eq!(p.counts(), (3, 0));
        assert_eq!(evicted.len(), 497);
        assert_eq!(&evicted[..3], &[1, 2, 3]);
        // A fresh client (same address) is admitted and promoted at once.
        assert_eq!(p.accepted(501, ip(1)), vec![498]);
        assert_eq!(p.try_promote(501), Ok(()));
        assert_eq!(p.counts(), (2, 1));
        // Another address: the total pending bound evicts the oldest overall.
        assert_eq!(p.accepted(600, ip(2)), Vec::<ConnId>::new());
        assert_eq!(p.accepted(601, ip(2)), Vec::<ConnId>::new());
        assert_eq!(p.accepted(602, ip(2)), vec![499]);
        assert!(!p.is_pending(499) && p.is_pending(500));
    }

    #[test]
    fn sessions_are_bounded_in_total_and_per_address() {
        let mut p = AdmissionPolicy::new(limits());
        for id in 1..=3 {
            p.accepted(id, ip(1));
        }
        assert_eq!(p.try_promote(1), Ok(()));
        assert_eq!(p.try_promote(2), Ok(()));
        assert_eq!(p.try_promote(3), Err(Refusal::AddressFull));
        p.accepted(4, ip(2));
        p.accepted(5, ip(3));
        assert_eq!(p.try_promote(4), Ok(()));
        assert_eq!(p.try_promote(5), Err(Refusal::ServerFull));
        p.closed(1, ip(1), true);
        assert_eq!(p.try_promote(5), Ok(()));
        assert_eq!(p.try_promote(99), Err(Refusal::Gone));
        p.closed(3, ip(1), false);
        assert_eq!(p.counts(), (0, 3));
        for id in [2, 4, 5] {
            let addr = if id == 2 { ip(1) } else { ip(id as u8 - 2) };
            p.closed(id, addr, true);
        }
        assert_eq!(p.counts(), (0, 0));
        assert!(p.sessions_per_address.is_empty() && p.pending_per_address.is_empty());
    }
}
