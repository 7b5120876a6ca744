//! The rendezvous wire format, pure (no sockets) so it is tested and
//! fuzzed on byte slices.
//!
//! Every message is a frame: a big-endian `u32` body length, then the body.
//! A body starts with [`MAGIC`] and [`VERSION`]:
//!
//! - challenge (rank 0 -> a rank, first on every connection): `0x04`,
//!   whether rank 0 requires a job secret (`u8`, 0 or 1), nonce (32 bytes);
//! - hello (rank r -> rank 0): `0x01`, token (`u16` length + bytes), world
//!   size `u32`, rank `u32`, blob (`u32` length + bytes), the rank's nonce
//!   (32 bytes), MAC (`u16` length + bytes: empty without a secret);
//! - accepted (rank 0 -> every rank): `0x02`, count `u32`, then `count`
//!   blobs (`u32` length + bytes each) in rank order, MAC (`u16` length +
//!   bytes: empty without a secret);
//! - refused (rank 0 -> a rank): `0x03`, reason (`u16` length + UTF-8);
//! - busy (rank 0 -> a rank whose connection it dropped to make room for
//!   newer ones; the rank connects again): `0x05`, reason as refused.
//!
//! A MAC covers the message's encoding with an empty MAC field (see
//! [`crate::auth`]). Lengths are checked against [`Limits`] before anything
//! is allocated.

use crate::auth::NONCE_LEN;
use crate::error::{LaunchError, Result};

/// First bytes of every body ("Transfer Launch RendezVous").
pub const MAGIC: [u8; 4] = *b"TLRV";
/// Wire version; a peer with another one is refused. Version 2 added the
/// challenge, the nonces and the MACs.
pub const VERSION: u8 = 2;
/// Longest job token, in bytes.
pub const MAX_TOKEN: usize = 256;
/// Longest refusal reason, in bytes.
pub const MAX_REASON: usize = 1024;

const HELLO: u8 = 1;
const ACCEPTED: u8 = 2;
const REFUSED: u8 = 3;
const CHALLENGE: u8 = 4;
const BUSY: u8 = 5;

/// Longest MAC field accepted (an HMAC-SHA256 tag is 32 bytes).
const MAX_MAC: usize = 64;

/// Bounds on what a rendezvous accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most ranks.
    pub max_world: usize,
    /// Largest blob of one rank, in bytes.
    pub max_blob: usize,
    /// Largest accepted reply (all blobs together), in bytes.
    pub max_total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_world: 4096,
            max_blob: 64 * 1024,
            max_total: 64 << 20,
        }
    }
}

impl Limits {
    /// Largest hello body these limits allow.
    pub fn max_hello(&self) -> usize {
        4 + 1 + 1 + 2 + MAX_TOKEN + 4 + 4 + 4 + self.max_blob + NONCE_LEN + 2 + MAX_MAC
    }

    /// Largest reply body these limits allow.
    pub fn max_reply(&self) -> usize {
        let blobs = self
            .max_total
            .saturating_add(self.max_world.saturating_mul(4));
        (4 + 1 + 1 + 4 + blobs + 2 + MAX_MAC).max(4 + 1 + 1 + 2 + MAX_REASON)
    }
}

/// What rank 0 sends first on every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Whether rank 0 requires hellos authenticated with the job secret.
    pub auth: bool,
    /// Fresh random bytes the hello's MAC must cover (no replay).
    pub nonce: [u8; NONCE_LEN],
}

/// Exact length of a challenge body.
pub const CHALLENGE_LEN: usize = 4 + 1 + 1 + 1 + NONCE_LEN;

/// What a rank tells rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Job token; must equal rank 0's.
    pub token: String,
    /// World size as this rank sees it.
    pub world_size: u32,
    /// This rank.
    pub rank: u32,
    /// This rank's blob.
    pub blob: Vec<u8>,
    /// Fresh random bytes rank 0's list MAC must cover.
    pub nonce: [u8; NONCE_LEN],
    /// HMAC over rank 0's challenge and this hello (empty without a secret).
    pub mac: Vec<u8>,
}

/// What rank 0 answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Every rank's blob, in rank order, and the MAC over the list and the
    /// rank's nonce (empty without a secret).
    Accepted(Vec<Vec<u8>>, Vec<u8>),
    /// Why this rank (or the whole rendezvous) was refused.
    Refused(String),
    /// Rank 0 dropped this connection unread to make room (too many
    /// connections pending): nothing was decided, connect again.
    Busy(String),
}

fn wire(reason: impl Into<String>) -> LaunchError {
    LaunchError::Wire(reason.into())
}

fn header(kind: u8) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.push(VERSION);
    b.push(kind);
    b
}

/// Wraps a body in a frame.
pub fn frame(body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len()).map_err(|_| wire("frame longer than 4 GiB"))?;
    let mut f = len.to_be_bytes().to_vec();
    f.extend_from_slice(body);
    Ok(f)
}

/// The body length a frame header announces, checked against `max`.
pub fn frame_len(header: [u8; 4], max: usize) -> Result<usize> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(LaunchError::Limit {
            what: "frame length",
            value: len as u64,
            max: max as u64,
        });
    }
    Ok(len)
}

/// Encodes a hello body (refuses what [`decode_hello`] would refuse).
pub fn encode_hello(h: &Hello, limits: &Limits) -> Result<Vec<u8>> {
    check_token(&h.token)?;
    check_blob(h.blob.len(), limits)?;
    let mut b = header(HELLO);
    put_short(&mut b, h.token.as_bytes());
    b.extend_from_slice(&h.world_size.to_be_bytes());
    b.extend_from_slice(&h.rank.to_be_bytes());
    put_long(&mut b, &h.blob)?;
    b.extend_from_slice(&h.nonce);
    check_mac(&h.mac)?;
    put_short(&mut b, &h.mac);
    Ok(b)
}

/// The bytes a hello's MAC covers: its encoding with an empty MAC.
pub fn unsigned_hello(h: &Hello, limits: &Limits) -> Result<Vec<u8>> {
    encode_hello(
        &Hello {
            mac: Vec::new(),
            ..h.clone()
        },
        limits,
    )
}

/// Encodes a challenge body.
pub fn encode_challenge(c: &Challenge) -> Vec<u8> {
    let mut b = header(CHALLENGE);
    b.push(u8::from(c.auth));
    b.extend_from_slice(&c.nonce);
    b
}

/// Decodes a challenge body.
pub fn decode_challenge(body: &[u8]) -> Result<Challenge> {
    let mut r = Reader(body);
    match r.kind()? {
        CHALLENGE => {}
        // Rank 0 may refuse at once (a full queue of pending connections).
        REFUSED => {
            let why = String::from_utf8_lossy(r.short(MAX_REASON)?).into_owned();
            return Err(LaunchError::Refused(why));
        }
        k => {
            return Err(wire(format!(
                "unexpected message kind {k} (want a challenge)"
            )));
        }
    }
    let auth = match r.take(1)?[0] {
        0 => false,
        1 => true,
        a => return Err(wire(format!("unknown authentication scheme {a}"))),
    };
    let nonce = r.nonce()?;
    r.end()?;
    Ok(Challenge { auth, nonce })
}

/// Decodes a hello body.
pub fn decode_hello(body: &[u8], limits: &Limits) -> Result<Hello> {
    let mut r = Reader(body);
    r.header(HELLO)?;
    let token =
        String::from_utf8(r.short(MAX_TOKEN)?.to_vec()).map_err(|_| wire("token is not UTF-8"))?;
    let world_size = r.u32()?;
    let rank = r.u32()?;
    let blob = r.long(limits.max_blob, "blob")?.to_vec();
    let nonce = r.nonce()?;
    let mac = r.short(MAX_MAC)?.to_vec();
    r.end()?;
    Ok(Hello {
        token,
        world_size,
        rank,
        blob,
        nonce,
        mac,
    })
}

/// Encodes a reply body.
pub fn encode_reply(reply: &Reply, limits: &Limits) -> Result<Vec<u8>> {
    match reply {
        Reply::Accepted(blobs, mac) => {
            check_world(blobs.len(), limits)?;
            check_mac(mac)?;
            let mut total = 0usize;
            let count = u32::try_from(blobs.len()).map_err(|_| wire("too many blobs"))?;
            let mut b = header(ACCEPTED);
            b.extend_from_slice(&count.to_be_bytes());
            for blob in blobs {
                check_blob(blob.len(), limits)?;
                total += blob.len();
                if total > limits.max_total {
                    return Err(LaunchError::Limit {
                        what: "blobs in total",
                        value: total as u64,
                        max: limits.max_total as u64,
                    });
                }
                put_long(&mut b, blob)?;
            }
            put_short(&mut b, mac);
            Ok(b)
        }
        Reply::Refused(reason) | Reply::Busy(reason) => {
            let mut b = header(if matches!(reply, Reply::Busy(_)) {
                BUSY
            } else {
                REFUSED
            });
            put_short(&mut b, truncate(reason, MAX_REASON).as_bytes());
            Ok(b)
        }
    }
}

/// A frame of `unsigned` (an encoding whose last field is an empty MAC)
/// carrying `mac` instead, in three pieces written one after the other: the
/// frame header, `unsigned` without its empty MAC field, the MAC field.
/// Rank 0 encodes the list once and signs it for each rank this way.
pub fn signed_frame<'a>(unsigned: &'a [u8], mac: &[u8]) -> Result<([u8; 4], &'a [u8], Vec<u8>)> {
    check_mac(mac)?;
    let prefix = match unsigned.strip_suffix(&[0, 0]) {
        Some(p) => p,
        None => return Err(wire("signing a message without an empty MAC field")),
    };
    let mut tail = Vec::with_capacity(2 + mac.len());
    put_short(&mut tail, mac);
    let len =
        u32::try_from(prefix.len() + tail.len()).map_err(|_| wire("frame longer than 4 GiB"))?;
    Ok((len.to_be_bytes(), prefix, tail))
}

/// Decodes a reply body.
pub fn decode_reply(body: &[u8], limits: &Limits) -> Result<Reply> {
    let mut r = Reader(body);
    let kind = r.kind()?;
    let reply = match kind {
        ACCEPTED => {
            let count = r.u32()? as usize;
            check_world(count, limits)?;
            // Each blob needs at least its 4-byte length: a count the body
            // cannot hold is refused before the vector is sized by it.
            if count > r.0.len() / 4 {
                return Err(wire(format!("{count} blobs announced in a short frame")));
            }
            let mut blobs = Vec::with_capacity(count);
            let mut total = 0usize;
            for _ in 0..count {
                let blob = r.long(limits.max_blob, "blob")?;
                total += blob.len();
                if total > limits.max_total {
                    return Err(LaunchError::Limit {
                        what: "blobs in total",
                        value: total as u64,
                        max: limits.max_total as u64,
                    });
                }
                blobs.push(blob.to_vec());
            }
            let mac = r.short(MAX_MAC)?.to_vec();
            Reply::Accepted(blobs, mac)
        }
        REFUSED => Reply::Refused(String::from_utf8_lossy(r.short(MAX_REASON)?).into_owned()),
        BUSY => Reply::Busy(String::from_utf8_lossy(r.short(MAX_REASON)?).into_owned()),
        k => return Err(wire(format!("unexpected message kind {k} (want a reply)"))),
    };
    r.end()?;
    Ok(reply)
}

/// Refuses `value` above `max`, naming `what`.
fn at_most(what: &'static str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(LaunchError::Limit {
            what,
            value: value as u64,
            max: max as u64,
        });
    }
    Ok(())
}

fn check_mac(mac: &[u8]) -> Result<()> {
    at_most("MAC length", mac.len(), MAX_MAC)
}

fn check_token(token: &str) -> Result<()> {
    at_most("job token length", token.len(), MAX_TOKEN)
}

pub(crate) fn check_blob(len: usize, limits: &Limits) -> Result<()> {
    at_most("blob length", len, limits.max_blob)
}

pub(crate) fn check_world(n: usize, limits: &Limits) -> Result<()> {
    at_most("world size", n, limits.max_world)
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn put_short(b: &mut Vec<u8>, bytes: &[u8]) {
    // Callers bound `bytes` by MAX_TOKEN / MAX_REASON, far below u16::MAX.
    let len = bytes.len().min(u16::MAX as usize);
    b.extend_from_slice(&(len as u16).to_be_bytes());
    b.extend_from_slice(&bytes[..len]);
}

fn put_long(b: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| wire("blob longer than 4 GiB"))?;
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(bytes);
    Ok(())
}

/// A cursor that never reads past its slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.0.len() {
            return Err(wire(format!(
                "truncated: {n} bytes wanted, {} left",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn kind(&mut self) -> Result<u8> {
        if self.take(4)? != MAGIC {
            return Err(wire("bad magic (not a transfer-launch peer)"));
        }
        let version = self.take(1)?[0];
        if version != VERSION {
            return Err(wire(format!(
                "wire version {version}, this build speaks {VERSION}"
            )));
        }
        Ok(self.take(1)?[0])
    }

    fn header(&mut self, want: u8) -> Result<()> {
        match self.kind()? {
            k if k == want => Ok(()),
            k => Err(wire(format!("unexpected message kind {k}, want {want}"))),
        }
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn nonce(&mut self) -> Result<[u8; NONCE_LEN]> {
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(self.take(NONCE_LEN)?);
        Ok(n)
    }

    fn short(&mut self, max: usize) -> Result<&'a [u8]> {
        let b = self.take(2)?;
        let len = u16::from_be_bytes([b[0], b[1]]) as usize;
        if len > max {
            return Err(LaunchError::Limit {
                what: "string length",
                value: len as u64,
                max: max as u64,
            });
        }
        self.take(len)
    }

    fn long(&mut self, max: usize, what: &'static str) -> Result<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(LaunchError::Limit {
                what,
                value: len as u64,
                max: max as u64,
            });
        }
        self.take(len)
    }

    fn end(&self) -> Result<()> {
        if !self.0.is_empty() {
            return Err(wire(format!("{} trailing bytes", self.0.len())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            token: "slurm:42.0".into(),
            world_size: 3,
            rank: 2,
            blob: b"10.0.0.3:7470".to_vec(),
            nonce: [9; NONCE_LEN],
            mac: vec![1; 32],
        }
    }

    #[test]
    fn hello_round_trips() {
        let l = Limits::default();
        let b = encode_hello(&hello(), &l).unwrap();
        assert!(b.len() <= l.max_hello());
        assert_eq!(decode_hello(&b, &l).unwrap(), hello());
    }

    #[test]
    fn replies_round_trip() {
        let l = Limits::default();
        for r in [
            Reply::Accepted(
                vec![b"a".to_vec(), Vec::new(), b"ccc".to_vec()],
                vec![2; 32],
            ),
            Reply::Accepted(Vec::new(), Vec::new()),
            Reply::Refused("rank 1 already joined".into()),
            Reply::Busy("64 connections pending".into()),
        ] {
            let b = encode_reply(&r, &l).unwrap();
            assert!(b.len() <= l.max_reply());
            assert_eq!(decode_reply(&b, &l).unwrap(), r);
        }
    }

    #[test]
    fn challenges_round_trip_and_a_signed_frame_is_the_signed_encoding() {
        for auth in [false, true] {
            let c = Challenge {
                auth,
                nonce: [auth as u8 + 3; NONCE_LEN],
            };
            let b = encode_challenge(&c);
            assert_eq!(b.len(), CHALLENGE_LEN);
            assert_eq!(decode_challenge(&b).unwrap(), c);
        }
        let refused = encode_reply(&Reply::Refused("full".into()), &Limits::default()).unwrap();
        assert!(matches!(decode_challenge(&refused), Err(LaunchError::Refused(w)) if w == "full"));
        let l = Limits::default();
        let blobs = vec![b"a".to_vec(), b"bb".to_vec()];
        let unsigned = encode_reply(&Reply::Accepted(blobs.clone(), Vec::new()), &l).unwrap();
        let (head, prefix, tail) = signed_frame(&unsigned, &[5; 32]).unwrap();
        let mut body = prefix.to_vec();
        body.extend_from_slice(&tail);
        assert_eq!(frame_len(head, l.max_reply()).unwrap(), body.len());
        assert_eq!(
            decode_reply(&body, &l).unwrap(),
            Reply::Accepted(blobs, vec![5; 32])
        );
        let h = hello();
        let mut unsigned_h = unsigned_hello(&h, &l).unwrap();
        assert_eq!(decode_hello(&unsigned_h, &l).unwrap().mac, Vec::<u8>::new());
        unsigned_h.truncate(unsigned_h.len() - 2);
        put_short(&mut unsigned_h, &h.mac);
        assert_eq!(unsigned_h, encode_hello(&h, &l).unwrap());
    }

    #[test]
    fn limits_hold_both_ways() {
        let l = Limits {
            max_world: 2,
            max_blob: 4,
            max_total: 6,
        };
        let mut h = hello();
        h.blob = vec![0; 5];
        assert!(matches!(
            encode_hello(&h, &l),
            Err(LaunchError::Limit { .. })
        ));
        let big = encode_hello(&h, &Limits::default()).unwrap();
        assert!(matches!(
            decode_hello(&big, &l),
            Err(LaunchError::Limit { .. })
        ));
        let three = Reply::Accepted(vec![vec![0; 1]; 3], Vec::new());
        assert!(encode_reply(&three, &l).is_err());
        let over_total = Reply::Accepted(vec![vec![0; 4]; 2], Vec::new());
        assert!(encode_reply(&over_total, &l).is_err());
        let ok = encode_reply(&over_total, &Limits::default()).unwrap();
        assert!(decode_reply(&ok, &l).is_err());
        assert!(frame_len(100u32.to_be_bytes(), 99).is_err());
        assert_eq!(frame_len(99u32.to_be_bytes(), 99).unwrap(), 99);
    }

    #[test]
    fn foreign_bytes_are_refused() {
        let l = Limits::default();
        assert!(decode_hello(b"GET / HTTP/1.1\r\n", &l).is_err());
        let mut b = encode_hello(&hello(), &l).unwrap();
        b[4] = VERSION + 1;
        assert!(
            decode_hello(&b, &l)
                .unwrap_err()
                .to_string()
                .contains("version")
        );
        let mut b = encode_hello(&hello(), &l).unwrap();
        b.push(0);
        assert!(
            decode_hello(&b, &l)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
        let r = encode_reply(&Reply::Refused("x".into()), &l).unwrap();
        assert!(decode_hello(&r, &l).is_err(), "a reply is not a hello");
        // A count of 2^32-1 blobs in a 10-byte body: refused without allocating.
        let mut lie = header(ACCEPTED);
        lie.extend_from_slice(&u32::MAX.to_be_bytes());
        let big = Limits {
            max_world: usize::MAX,
            ..l
        };
        assert!(decode_reply(&lie, &big).is_err());
    }

    #[test]
    fn long_reasons_are_cut_on_a_character_boundary() {
        let l = Limits::default();
        let reason = "é".repeat(MAX_REASON);
        let b = encode_reply(&Reply::Refused(reason), &l).unwrap();
        let Reply::Refused(back) = decode_reply(&b, &l).unwrap() else {
            panic!("not refused")
        };
        assert!(back.len() <= MAX_REASON && back.chars().all(|c| c == 'é'));
    }
}
