//! The job secret and what the rendezvous does with it: HMAC-SHA256 over
//! each hello (bound to a fresh challenge from rank 0) and over the list
//! rank 0 sends back (bound to the rank's own nonce).
//!
//! The secret never travels: only MACs and random nonces do, and MACs are
//! compared in constant time. Without a secret the rendezvous works as
//! before and protects nothing against whoever reaches rank 0's port (see
//! the README's "Launch on a cluster").

use sha2::{Digest, Sha256};

use crate::error::{LaunchError, Result};

/// The variable a secret is read from, on every rank.
pub const SECRET_ENV: &str = "TRANSFER_JOB_SECRET";

/// Shortest secret accepted, in bytes: a captured hello lets anyone try
/// guesses offline, so a short one would only look protected.
pub const MIN_SECRET: usize = 16;

/// Longest secret accepted, in bytes (a bound on what the environment may hand us).
pub const MAX_SECRET: usize = 4096;

/// Length of a nonce and of a MAC.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;

/// Context strings: a hello's MAC can never stand for a list's, or the reverse.
const HELLO_CONTEXT: &[u8] = b"transfer-launch v2 hello";
const LIST_CONTEXT: &[u8] = b"transfer-launch v2 list";

/// A job's shared secret. Its `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobSecret({} bytes)", self.0.len())
    }
}

impl JobSecret {
    /// A secret from bytes, refused when shorter than [`MIN_SECRET`] or
    /// longer than [`MAX_SECRET`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET || bytes.len() > MAX_SECRET {
            return Err(LaunchError::Env {
                var: SECRET_ENV,
                reason: format!(
                    "{} bytes; a job secret has {MIN_SECRET}..={MAX_SECRET} \
                     (e.g. `openssl rand -hex 32`)",
                    bytes.len()
                ),
            });
        }
        Ok(Self(bytes))
    }

    /// The MAC a rank puts on its hello: over rank 0's challenge and the
    /// hello's encoding without its MAC.
    pub fn hello_mac(&self, challenge: &[u8; NONCE_LEN], unsigned_hello: &[u8]) -> [u8; MAC_LEN] {
        hmac_sha256(&self.0, &[HELLO_CONTEXT, challenge, unsigned_hello])
    }

    /// The MAC rank 0 puts on the list it sends one rank: over that rank's
    /// nonce and the list's encoding without its MAC.
    pub fn list_mac(&self, rank_nonce: &[u8; NONCE_LEN], unsigned_list: &[u8]) -> [u8; MAC_LEN] {
        hmac_sha256(&self.0, &[LIST_CONTEXT, rank_nonce, unsigned_list])
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equality whose time does not depend on where the inputs differ (only
/// on their lengths, which are public).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box: the optimiser may not turn the fold back into an early exit.
    std::hint::black_box(diff) == 0
}

/// A fresh random nonce from the operating system.
pub fn nonce(call: &'static str) -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n).map_err(|e| LaunchError::Io {
        call,
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 1.
        let mac = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            hex(&mac),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2, the message split in parts.
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            &[b"Test Using Larger Than Block-Size Key - Hash Key First"],
        );
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn ct_eq_compares() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_secret() {
        assert!(JobSecret::new("short").is_err());
        let s = JobSecret::new("0123456789abcdef-secret").unwrap();
        assert!(!format!("{s:?}").contains("0123"));
        // The two contexts differ: a hello's MAC is not a list's.
        let n = [7u8; NONCE_LEN];
        assert_ne!(s.hello_mac(&n, b"x"), s.list_mac(&n, b"x"));
    }
}
