//! Marks: the destination of a direct copy orders its own next command
//! after the copy, without a round trip to the client.
//!
//! COPY_TENSOR_TO is answered to the client once the data landed on the
//! destination, so a client that must run the destination's next graph
//! after the copy waits for that answer: one round trip through the client
//! per stage boundary. With marks, the destination's session holds a key
//! (MARK_OPEN, a random 64-bit secret) and queues MARK_WAIT(key, seq) before
//! its next graph; the client sends COPY_TENSOR_TO_MARK(..., key, seq) to the
//! source, whose server writes the data and then sends PEER_MARK(key, seq)
//! on the same peer connection (so after the data), which completes the
//! destination's wait. Neither answer need be waited for by the client.
//!
//! Isolation: only the key's holder (the session that opened it, and whoever
//! it told) knows the secret; a PEER_MARK with a key nobody holds is
//! answered 0 and changes nothing, so another tenant's marks can neither
//! complete nor delay a wait. A MARK_WAIT names a key of its own session
//! only. Bounds: [`KEYS_PER_SESSION`] keys per session (removed when the
//! session closes), [`SLOTS`] marks in flight per key (mark `seq` lives in
//! slot `seq % SLOTS`; a wait succeeds only on exactly its `seq`, so an
//! overwritten slot makes a wait time out, never end early), and every
//! wait has a deadline (the client's, capped by the server's).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

/// Keys one session may hold at once.
pub const KEYS_PER_SESSION: usize = 4;
/// Marks of one key in flight (sent and not yet waited for) at most.
pub const SLOTS: usize = 64;

struct Entry {
    owner: u64,
    slots: [u64; SLOTS],
}

/// The server's mark table (shared by all sessions).
#[derive(Default)]
pub struct Marks {
    keys: Mutex<HashMap<u64, Entry>>,
    landed: Condvar,
}

impl Marks {
    /// A new key for session `owner`; `None` when the session already
    /// holds [`KEYS_PER_SESSION`] or no randomness is available.
    pub fn open(&self, owner: u64) -> Option<u64> {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.values().filter(|e| e.owner == owner).count() >= KEYS_PER_SESSION {
            return None;
        }
        // 0 is never a key (a zero answer means refused); a collision with a
        // live key is drawn again.
        for _ in 0..4 {
            let mut b = [0u8; 8];
            getrandom::getrandom(&mut b).ok()?;
            let key = u64::from_le_bytes(b);
            if key != 0 && !keys.contains_key(&key) {
                keys.insert(
                    key,
                    Entry {
                        owner,
                        slots: [0; SLOTS],
                    },
                );
                return Some(key);
            }
        }
        None
    }

    /// PEER_MARK: mark `seq` (> 0) of `key` landed. False for a key nobody
    /// holds.
    pub fn mark(&self, key: u64, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(e) = keys.get_mut(&key) else {
            return false;
        };
        if let Some(slot) = e.slots.get_mut(slot_of(seq)) {
            *slot = seq;
        }
        drop(keys);
        self.landed.notify_all();
        true
    }

    /// MARK_WAIT of session `owner`: true once mark `seq` of its `key`
    /// landed, false at `until` or for a key it does not hold.
    pub fn wait(&self, owner: u64, key: u64, seq: u64, until: Instant) -> bool {
        if seq == 0 {
            return false;
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match keys.get(&key) {
                Some(e) if e.owner == owner => {
                    if e.slots.get(slot_of(seq)) == Some(&seq) {
                        return true;
                    }
                }
                _ => return false,
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            keys = match self.landed.wait_timeout(keys, until - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Removes the keys of a closed session.
    pub fn close_session(&self, owner: u64) {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, e| e.owner != owner);
        // A waiter of that session (none: a session waits on its own thread)
        // would see its key gone.
        self.landed.notify_all();
    }

    /// Keys held by all sessions.
    pub fn len(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True when no session holds a key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn slot_of(seq: u64) -> usize {
    (seq % SLOTS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(50)
    }

    #[test]
    fn a_wait_ends_on_its_own_mark_only() {
        let m = Marks::default();
        let Some(k) = m.open(1) else { panic!("no key") };
        assert!(!m.wait(1, k, 3, soon()), "nothing landed");
        assert!(m.mark(k, 3));
        assert!(m.wait(1, k, 3, soon()));
        // Another session cannot wait on it, a wrong key marks nothing.
        assert!(!m.wait(2, k, 3, soon()));
        assert!(!m.mark(k ^ 1, 4));
        assert!(!m.wait(1, k, 4, soon()));
        // seq + SLOTS overwrites the slot: the old wait fails, not passes.
        assert!(m.mark(k, 3 + SLOTS as u64));
        assert!(!m.wait(1, k, 3, soon()));
        assert!(!m.mark(k, 0) && !m.wait(1, k, 0, soon()));
    }

    #[test]
    fn keys_are_bounded_per_session_and_go_with_it() {
        let m = Marks::default();
        let keys: Vec<_> = (0..KEYS_PER_SESSION).filter_map(|_| m.open(7)).collect();
        assert_eq!(keys.len(), KEYS_PER_SESSION);
        assert_eq!(m.open(7), None);
        assert!(m.open(8).is_some(), "another session's bound is its own");
        m.close_session(7);
        assert_eq!(m.len(), 1);
        assert!(keys.iter().all(|&k| !m.mark(k, 1)));
    }

    #[test]
    fn a_mark_from_another_thread_wakes_the_wait() {
        let m = std::sync::Arc::new(Marks::default());
        let Some(k) = m.open(1) else { panic!("no key") };
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            m2.mark(k, 9)
        });
        assert!(m.wait(1, k, 9, Instant::now() + Duration::from_secs(10)));
        assert!(t.join().unwrap_or(false));
    }
}
