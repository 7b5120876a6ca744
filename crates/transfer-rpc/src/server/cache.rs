//! The SET_TENSOR_HASH file cache: data named by the 64-bit FNV-1a hash the
//! ggml-rpc protocol uses, bounded in bytes (least recently used entries are
//! evicted), each entry checked against a SHA-256 of its content.
//!
//! FNV-1a is not collision resistant: anyone can make two contents with one
//! FNV hash. The protocol gives the server nothing stronger to look up by,
//! so the cache guarantees what it can:
//! - an entry is served only if its bytes still have the SHA-256 recorded
//!   when they were stored (a file changed or planted on disk is ignored);
//! - when a second, different content arrives under a stored FNV hash, that
//!   hash is *poisoned*: both copies are dropped and the hash is never
//!   served again (the client then sends the data itself).
//!
//! It cannot tell which of two colliding contents a client meant if only
//! one was ever uploaded. Every client of a server with `--cache` therefore
//! trusts every other client not to plant content for the hashes of
//! tensors it expects; the README says so.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};

use crate::error::{Result, RpcError};
use crate::hash::Fnv1a64;

/// Most hashes remembered as poisoned; past it nothing new is stored
/// (an attacker minting collisions cannot grow the set without bound).
const MAX_POISONED: usize = 1 << 16;

#[derive(Debug, Clone, Copy)]
struct Entry {
    len: u64,
    sha: [u8; 32],
    last_used: u64,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<u64, Entry>,
    poisoned: HashSet<u64>,
    bytes: u64,
    tick: u64,
}

impl Index {
    /// Records a stored entry as the most recently used.
    fn insert(&mut self, hash: u64, len: u64, sha: [u8; 32]) {
        self.tick += 1;
        let last_used = self.tick;
        self.entries.insert(
            hash,
            Entry {
                len,
                sha,
                last_used,
            },
        );
        self.bytes = self.bytes.saturating_add(len);
    }
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
}

/// A directory of cached tensor data.
#[derive(Debug, Clone)]
pub struct HashCache {
    inner: Arc<Inner>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl HashCache {
    /// Opens (creating if needed) the cache directory, holding at most
    /// `max_bytes` of data. Entries from an earlier run are kept when their
    /// SHA-256 record is there (and checked again when served).
    pub fn open(dir: &Path, max_bytes: u64) -> Result<HashCache> {
        fs::create_dir_all(dir).map_err(|e| RpcError::io("HashCache::open", e))?;
        let cache = HashCache {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                max_bytes,
                index: Mutex::new(Index::default()),
            }),
        };
        let listing = fs::read_dir(dir).map_err(|e| RpcError::io("HashCache::open", e))?;
        let mut found = Vec::new();
        for item in listing.flatten() {
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(hash) = u64::from_str_radix(name, 16) else {
                continue;
            };
            if name.len() != 16 {
                continue;
            }
            let Ok(meta) = item.metadata() else { continue };
            let sha = fs::read_to_string(cache.sha_path(hash))
                .ok()
                .and_then(|s| unhex(&s));
            if let (true, Some(sha)) = (meta.is_file(), sha) {
                found.push((hash, meta.len(), sha));
            }
        }
        {
            let mut ix = cache.lock();
            for (hash, len, sha) in found {
                ix.insert(hash, len, sha);
            }
            cache.evict_until(&mut ix, 0);
        }
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.inner
            .index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, hash: u64) -> PathBuf {
        self.inner.dir.join(format!("{hash:016x}"))
    }

    fn sha_path(&self, hash: u64) -> PathBuf {
        self.inner.dir.join(format!("{hash:016x}.sha256"))
    }

    fn remove_files(&self, hash: u64) {
        let _ = fs::remove_file(self.path(hash));
        let _ = fs::remove_file(self.sha_path(hash));
    }

    /// Evicts least recently used entries until `extra` more bytes fit.
    fn evict_until(&self, ix: &mut Index, extra: u64) {
        while ix.bytes.saturating_add(extra) > self.inner.max_bytes {
            let Some((&victim, _)) = ix.entries.iter().min_by_key(|(_, e)| e.last_used) else {
                break;
            };
            if let Some(e) = ix.entries.remove(&victim) {
                ix.bytes = ix.bytes.saturating_sub(e.len);
            }
            self.remove_files(victim);
        }
    }

    /// Bytes of data held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// True when `hash` was poisoned by a collision.
    pub fn is_poisoned(&self, hash: u64) -> bool {
        self.lock().poisoned.contains(&hash)
    }

    /// The length of the entry for `hash`, if there is one.
    pub fn entry_len(&self, hash: u64) -> Option<u64> {
        self.lock().entries.get(&hash).map(|e| e.len)
    }

    /// The cached bytes for `hash` when present, at most `max_len` bytes,
    /// not poisoned, and still equal to what was stored (SHA-256).
    pub fn get(&self, hash: u64, max_len: u64) -> Option<Vec<u8>> {
        let entry = {
            let mut ix = self.lock();
            ix.tick += 1;
            let tick = ix.tick;
            let e = ix.entries.get_mut(&hash)?;
            if e.len > max_len {
                return None;
            }
            e.last_used = tick;
            *e
        };
        let data = fs::read(self.path(hash)).ok()?;
        let sha: [u8; 32] = Sha256::digest(&data).into();
        if data.len() as u64 != entry.len || sha != entry.sha || Fnv1a64::of(&data) != hash {
            // Changed on disk behind our back: never serve it.
            let mut ix = self.lock();
            if let Some(e) = ix.entries.remove(&hash) {
                ix.bytes = ix.bytes.saturating_sub(e.len);
            }
            drop(ix);
            self.remove_files(hash);
            return None;
        }
        Some(data)
    }

    /// A writer for `len` bytes of new content, or `None` when the content
    /// could never fit the cache.
    pub fn writer(&self, len: u64) -> Option<CacheWriter> {
        if len > self.inner.max_bytes {
            return None;
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .inner
            .dir
            .join(format!(".{}.{n}.tmp", std::process::id()));
        let file = fs::File::create(&tmp).ok()?;
        Some(CacheWriter {
            cache: self.clone(),
            tmp,
            file: Some(file),
            fnv: Fnv1a64::new(),
            sha: Sha256::new(),
            len: 0,
            expected: len,
        })
    }

    /// Stores `data` (in one piece); returns its FNV hash.
    pub fn put(&self, data: &[u8]) -> Result<u64> {
        let mut w = self
            .writer(data.len() as u64)
            .ok_or_else(|| RpcError::refused("HashCache::put", "larger than the cache"))?;
        w.write(data);
        w.finish()
    }

    fn commit(&self, tmp: &Path, hash: u64, len: u64, sha: [u8; 32]) -> Result<u64> {
        let call = "HashCache::put";
        let mut ix = self.lock();
        if ix.poisoned.contains(&hash) {
            return Err(RpcError::refused(
                call,
                format!("hash {hash:016x} is poisoned"),
            ));
        }
        if let Some(e) = ix.entries.get(&hash).copied() {
            if e.sha == sha && e.len == len {
                ix.tick += 1;
                let tick = ix.tick;
                if let Some(e) = ix.entries.get_mut(&hash) {
                    e.last_used = tick;
                }
                return Ok(hash);
            }
            // Two contents, one FNV hash: serve neither, ever.
            ix.entries.remove(&hash);
            ix.bytes = ix.bytes.saturating_sub(e.len);
            if ix.poisoned.len() < MAX_POISONED {
                ix.poisoned.insert(hash);
            }
            drop(ix);
            self.remove_files(hash);
            return Err(RpcError::refused(
                call,
                format!("FNV collision on {hash:016x}: the hash is poisoned"),
            ));
        }
        if ix.poisoned.len() >= MAX_POISONED {
            return Err(RpcError::refused(call, "too many poisoned hashes"));
        }
        self.evict_until(&mut ix, len);
        let write = || -> std::io::Result<()> {
            fs::write(self.sha_path(hash), hex(&sha))?;
            fs::rename(tmp, self.path(hash))
        };
        write().map_err(|e| {
            self.remove_files(hash);
            RpcError::io(call, e)
        })?;
        ix.insert(hash, len, sha);
        Ok(hash)
    }
}

/// Content being stored, hashed as it is written.
pub struct CacheWriter {
    cache: HashCache,
    tmp: PathBuf,
    file: Option<fs::File>,
    fnv: Fnv1a64,
    sha: Sha256,
    len: u64,
    expected: u64,
}

impl CacheWriter {
    /// Appends a piece (a failed write makes `finish` an error).
    pub fn write(&mut self, piece: &[u8]) {
        self.fnv.update(piece);
        self.sha.update(piece);
        self.len = self.len.saturating_add(piece.len() as u64);
        if let Some(f) = self.file.as_mut() {
            if f.write_all(piece).is_err() {
                self.file = None;
            }
        }
    }

    /// Stores the content under its FNV hash; returns the hash.
    pub fn finish(mut self) -> Result<u64> {
        let call = "HashCache::put";
        let Some(f) = self.file.take() else {
            return Err(RpcError::refused(call, "writing the cache file failed"));
        };
        if self.len != self.expected {
            return Err(RpcError::refused(call, "content shorter than announced"));
        }
        f.sync_all().map_err(|e| RpcError::io(call, e))?;
        drop(f);
        let hash = self.fnv.finish();
        let sha: [u8; 32] = std::mem::take(&mut self.sha).finalize().into();
        self.cache.commit(&self.tmp, hash, self.len, sha)
    }
}

impl Drop for CacheWriter {
    fn drop(&mut self) {
        // Renamed away on success; otherwise a leftover.
        let _ = fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trpc-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// A second content under a stored FNV hash poisons it: neither is
    /// served again and nothing new is stored under it. (A real FNV-1a
    /// collision is not needed to test the rule: the commit step sees only
    /// the hash and the SHA-256.)
    #[test]
    fn a_collision_poisons_the_hash() -> Result<()> {
        let d = dir("poison");
        let c = HashCache::open(&d, 1 << 20)?;
        let victim = b"weights the victim uploads".to_vec();
        let h = c.put(&victim)?;
        assert_eq!(c.get(h, 1 << 20), Some(victim.clone()));
        // The attacker's content with the same FNV hash.
        let tmp = d.join("attacker.tmp");
        fs::write(&tmp, b"planted").map_err(|e| RpcError::io("t", e))?;
        assert!(c.commit(&tmp, h, 7, [7u8; 32]).is_err());
        assert!(c.is_poisoned(h));
        assert!(c.get(h, 1 << 20).is_none(), "neither content is served");
        assert!(c.put(&victim).is_err(), "nothing is stored under it again");
        assert!(c.get(h, 1 << 20).is_none());
        assert_eq!(c.bytes(), 0);
        let _ = fs::remove_dir_all(&d);
        Ok(())
    }

    #[test]
    fn evicts_lru_and_verifies_content() -> Result<()> {
        let d = dir("lru");
        let c = HashCache::open(&d, 100)?;
        let a = c.put(&[1u8; 40])?;
        let b = c.put(&[2u8; 40])?;
        assert_eq!(c.bytes(), 80);
        assert!(c.get(a, 100).is_some(), "a is now the most recent");
        let x = c.put(&[3u8; 40])?;
        assert!(c.get(b, 100).is_none(), "b was the least recently used");
        assert!(c.get(a, 100).is_some() && c.get(x, 100).is_some());
        assert!(c.bytes() <= 100);
        assert!(c.writer(101).is_none(), "never fits");
        // Changed on disk: not served.
        fs::write(d.join(format!("{a:016x}")), [9u8; 40]).map_err(|e| RpcError::io("t", e))?;
        assert!(c.get(a, 100).is_none());
        // Reopened: entries with their records come back, bounded again.
        drop(c);
        let c = HashCache::open(&d, 40)?;
        assert!(c.bytes() <= 40);
        let _ = fs::remove_dir_all(&d);
        Ok(())
    }
}
