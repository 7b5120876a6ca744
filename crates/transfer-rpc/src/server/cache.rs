//! The SET_TENSOR_HASH file cache: one file per FNV-1a hash.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Result, RpcError};
use crate::hash::fnv1a64;

/// A directory of cached tensor data named by the hash of their contents.
#[derive(Debug, Clone)]
pub struct HashCache {
    dir: PathBuf,
}

impl HashCache {
    /// Opens (creating if needed) the cache directory.
    pub fn open(dir: &Path) -> Result<HashCache> {
        fs::create_dir_all(dir).map_err(|e| RpcError::io("HashCache::open", e))?;
        Ok(HashCache {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, hash: u64) -> PathBuf {
        self.dir.join(format!("{hash:016x}"))
    }

    /// The cached bytes for `hash` if the file exists, is at most `max_len`
    /// bytes, and still hashes to `hash` (a corrupted or planted file is
    /// ignored).
    pub fn get(&self, hash: u64, max_len: u64) -> Option<Vec<u8>> {
        let path = self.path(hash);
        let meta = fs::metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > max_len {
            return None;
        }
        let data = fs::read(&path).ok()?;
        (fnv1a64(&data) == hash).then_some(data)
    }

    /// Stores `data` under its hash (write to a temporary file, then rename).
    pub fn put(&self, data: &[u8]) -> Result<u64> {
        let hash = fnv1a64(data);
        let path = self.path(hash);
        if path.is_file() {
            return Ok(hash);
        }
        let tmp = self
            .dir
            .join(format!(".{hash:016x}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            RpcError::io("HashCache::put", e)
        })?;
        Ok(hash)
    }
}
