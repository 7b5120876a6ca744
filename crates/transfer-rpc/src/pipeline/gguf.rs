//! A bounded GGUF (v2/v3) reader: metadata, tensor infos and data offsets.
//!
//! Every count and length read from the file is checked against the bytes
//! the file actually has (and against fixed caps) before anything is
//! allocated, so a truncated or hostile file gives an error, never a panic
//! or a huge allocation. Array values (e.g. a tokenizer's vocabulary) are
//! skipped and kept only as (element type, length).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Result, RpcError};
use crate::validate::type_info;

const CALL: &str = "GGUF";
/// Longest key or string value accepted.
const MAX_STRING: u64 = 1 << 20;
/// Most metadata entries accepted.
const MAX_KV: u64 = 1 << 20;
/// Most tensors accepted.
const MAX_TENSORS: u64 = 1 << 20;
/// Most dimensions of one tensor (ggml's limit).
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted.
const MAX_ARRAY_DEPTH: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Any unsigned integer type (u8, u16, u32, u64).
    Uint(u64),
    /// Any signed integer type (i8, i16, i32, i64).
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// A UTF-8 string (lossily decoded).
    Str(String),
    /// An array, skipped: its element type and length.
    Array {
        /// GGUF value type of the elements.
        elem_type: u32,
        /// Number of elements.
        len: u64,
    },
}

impl MetaValue {
    /// The value as u64 when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::Uint(v) => Some(v),
            MetaValue::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as f64 when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::Float(v) => Some(v),
            MetaValue::Uint(v) => Some(v as f64),
            MetaValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Elements per dimension (ggml order: `dims[0]` is the row length),
    /// padded with 1 to four dimensions.
    pub ne: [u64; 4],
    /// Number of dimensions stored in the file.
    pub n_dims: u32,
    /// `ggml_type`.
    pub ty: u32,
    /// Absolute offset of the data in the file.
    pub file_offset: u64,
    /// Size of the data in bytes.
    pub nbytes: u64,
}

/// A parsed GGUF file (header only; tensor data is read on demand).
#[derive(Debug)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Metadata by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    file: File,
    file_len: u64,
}

fn bad<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::malformed(CALL, reason))
}

/// A reader that knows how many bytes are left in the file.
struct Bounded<R> {
    inner: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Bounded<R> {
    fn need(&self, n: u64, what: &str) -> Result<()> {
        if self.len.saturating_sub(self.pos) < n {
            return bad(format!(
                "{what}: needs {n} bytes at offset {} but the file has {}",
                self.pos, self.len
            ));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        self.need(N as u64, what)?;
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| RpcError::io("GGUF read", e))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<()> {
        self.need(n, what)?;
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink())
            .map_err(|e| RpcError::io("GGUF read", e))?;
        if copied != n {
            return bad(format!("{what}: file ended early"));
        }
        self.pos += n;
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return bad(format!("{what}: string of {n} bytes exceeds {MAX_STRING}"));
        }
        self.need(n, what)?;
        let mut b = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| RpcError::io("GGUF read", e))?;
        self.pos += n;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// Width in bytes of a fixed-size value type.
    fn fixed_width(ty: u32) -> Option<u64> {
        match ty {
            0 | 1 | 7 => Some(1),
            2 | 3 => Some(2),
            4..=6 => Some(4),
            10..=12 => Some(8),
            _ => None,
        }
    }

    fn value(&mut self, ty: u32, depth: u32, what: &str) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::Uint(u64::from(self.bytes::<1>(what)?[0])),
            1 => MetaValue::Int(i64::from(self.bytes::<1>(what)?[0] as i8)),
            2 => MetaValue::Uint(u64::from(u16::from_le_bytes(self.bytes(what)?))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(self.bytes(what)?))),
            4 => MetaValue::Uint(u64::from(self.u32(what)?)),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(self.bytes(what)?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.bytes(what)?))),
            7 => MetaValue::Bool(self.bytes::<1>(what)?[0] != 0),
            8 => MetaValue::Str(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return bad(format!(
                        "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let elem_type = self.u32(what)?;
                let len = self.u64(what)?;
                if let Some(w) = Self::fixed_width(elem_type) {
                    let total = len.checked_mul(w).ok_or_else(|| {
                        RpcError::malformed(CALL, format!("{what}: array size overflows"))
                    })?;
                    self.skip(total, what)?;
                } else {
                    // Strings and nested arrays: each element has at least
                    // 8 bytes, so the length is bounded by the file size.
                    self.need(len.saturating_mul(8), what)?;
                    for _ in 0..len {
                        self.value(elem_type, depth + 1, what)?;
                    }
                }
                MetaValue::Array { elem_type, len }
            }
            10 => MetaValue::Uint(self.u64(what)?),
            11 => MetaValue::Int(i64::from_le_bytes(self.bytes(what)?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.bytes(what)?)),
            other => return bad(format!("{what}: unknown value type {other}")),
        })
    }
}

/// Size in bytes of a tensor of type `ty` and shape `ne`, checked.
pub fn tensor_nbytes(ty: u32, ne: &[u64; 4]) -> Result<u64> {
    let Some(info) = type_info(ty) else {
        return bad(format!("unknown ggml type {ty}"));
    };
    if ne[0] % info.block_size != 0 {
        return bad(format!(
            "row length {} is not a multiple of the {} block size {}",
            ne[0], info.name, info.block_size
        ));
    }
    let rows = ne[1..]
        .iter()
        .try_fold(1u64, |a, &n| a.checked_mul(n))
        .ok_or_else(|| RpcError::malformed(CALL, "tensor element count overflows"))?;
    (ne[0] / info.block_size)
        .checked_mul(info.type_size)
        .and_then(|row| row.checked_mul(rows))
        .ok_or_else(|| RpcError::malformed(CALL, "tensor size overflows"))
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| RpcError::io("GGUF open", e))?;
        let file_len = file
            .metadata()
            .map_err(|e| RpcError::io("GGUF open", e))?
            .len();
        let reader = file.try_clone().map_err(|e| RpcError::io("GGUF open", e))?;
        let mut r = Bounded {
            inner: BufReader::new(reader),
            pos: 0,
            len: file_len,
        };
        if &r.bytes::<4>("magic")? != b"GGUF" {
            return bad("not a GGUF file (bad magic)");
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return bad(format!(
                "GGUF version {version} (only 2 and 3, little-endian, are supported)"
            ));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        if n_tensors > MAX_TENSORS || n_kv > MAX_KV {
            return bad(format!(
                "{n_tensors} tensors / {n_kv} metadata entries exceed the limits"
            ));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32("metadata type")?;
            let v = r.value(ty, 0, "metadata value")?;
            if metadata.insert(key.clone(), v).is_some() {
                return bad(format!("duplicate metadata key {key:?}"));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => return bad("general.alignment is not a power of two up to 1 MiB"),
            },
        };
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string("tensor name")?;
            let n_dims = r.u32("tensor dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return bad(format!("tensor {name:?}: {n_dims} dimensions"));
            }
            let mut ne = [1u64; 4];
            for d in ne.iter_mut().take(n_dims as usize) {
                *d = r.u64("tensor shape")?;
            }
            let ty = r.u32("tensor type")?;
            let rel = r.u64("tensor offset")?;
            if rel % alignment != 0 {
                return bad(format!("tensor {name:?}: offset {rel} is not aligned"));
            }
            let nbytes = tensor_nbytes(ty, &ne)
                .map_err(|e| RpcError::malformed(CALL, format!("tensor {name:?}: {e}")))?;
            infos.push((name, ne, n_dims, ty, rel, nbytes));
        }
        let data_start = r.pos.next_multiple_of(alignment);
        let mut tensors = Vec::with_capacity(infos.len());
        let mut seen = std::collections::HashSet::new();
        for (name, ne, n_dims, ty, rel, nbytes) in infos {
            let file_offset = data_start
                .checked_add(rel)
                .filter(|o| o.checked_add(nbytes).is_some_and(|e| e <= file_len))
                .ok_or_else(|| {
                    RpcError::malformed(
                        CALL,
                        format!("tensor {name:?}: data lies outside the {file_len}-byte file"),
                    )
                })?;
            if !seen.insert(name.clone()) {
                return bad(format!("duplicate tensor name {name:?}"));
            }
            tensors.push(TensorInfo {
                name,
                ne,
                n_dims,
                ty,
                file_offset,
                nbytes,
            });
        }
        Ok(GgufFile {
            version,
            alignment,
            metadata,
            tensors,
            file,
            file_len,
        })
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The info of a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads the data of a tensor (its size was checked against the file
    /// when the header was parsed).
    pub fn read_tensor(&mut self, info: &TensorInfo) -> Result<Vec<u8>> {
        let len = usize::try_from(info.nbytes)
            .map_err(|_| RpcError::refused(CALL, "tensor does not fit in memory"))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| RpcError::refused(CALL, format!("cannot allocate {len} bytes")))?;
        buf.resize(len, 0);
        self.file
            .seek(SeekFrom::Start(info.file_offset))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|e| RpcError::io("GGUF read tensor", e))?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::synthetic::GgufWriter;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("trpc-gguf-{}-{name}", std::process::id()))
    }

    #[test]
    fn round_trip_and_truncation() -> Result<()> {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama");
        w.add_u32("llama.block_count", 3);
        w.add_f32("x", 0.5);
        w.add_tensor_f32("a", &[4, 2], &[1.0; 8])?;
        w.add_tensor_f32("b", &[3], &[2.0; 3])?;
        let bytes = w.to_bytes();
        let p = temp("rt");
        std::fs::write(&p, &bytes).map_err(|e| RpcError::io("test", e))?;
        let mut g = GgufFile::open(&p)?;
        assert_eq!(g.version, 3);
        assert_eq!(
            g.get("general.architecture").and_then(MetaValue::as_str),
            Some("llama")
        );
        assert_eq!(
            g.get("llama.block_count").and_then(MetaValue::as_u64),
            Some(3)
        );
        let b = g.tensor("b").cloned();
        assert!(
            b.as_ref()
                .is_some_and(|b| b.ne == [3, 1, 1, 1] && b.nbytes == 12)
        );
        if let Some(b) = b {
            assert_eq!(
                g.read_tensor(&b)?,
                [2.0f32; 3]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>()
            );
        }
        // Every truncation is an error, never a panic.
        // (The last 20 bytes are padding after the 12 data bytes of "b".)
        for cut in [3usize, 10, 30, bytes.len() / 2, bytes.len() - 21] {
            std::fs::write(&p, &bytes[..cut]).map_err(|e| RpcError::io("test", e))?;
            assert!(GgufFile::open(&p).is_err(), "cut at {cut}");
        }
        // A huge string length is refused before allocation.
        let mut evil = bytes[..24].to_vec();
        evil.extend_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&p, &evil).map_err(|e| RpcError::io("test", e))?;
        assert!(GgufFile::open(&p).is_err());
        let _ = std::fs::remove_file(&p);
        Ok(())
    }
}
