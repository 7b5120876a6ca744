//! Little-endian byte cursor and writer used by every codec.

use crate::error::{Result, RpcError};

/// A bounds-checked little-endian reader over a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    call: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`; `call` names the codec in errors.
    pub fn new(buf: &'a [u8], call: &'static str) -> Self {
        Reader { buf, pos: 0, call }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                RpcError::malformed(
                    self.call,
                    format!(
                        "needs {n} bytes at offset {}, has {}",
                        self.pos,
                        self.remaining()
                    ),
                )
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Takes a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `i32`.
    pub fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Takes everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos.min(self.buf.len())..];
        self.pos = self.buf.len();
        out
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(RpcError::malformed(
                self.call,
                format!("{} trailing bytes", self.remaining()),
            ))
        }
    }
}

/// Appends little-endian values to a byte vector.
pub trait WireWrite {
    /// Appends a `u8`.
    fn put_u8(&mut self, v: u8);
    /// Appends a little-endian `u32`.
    fn put_u32(&mut self, v: u32);
    /// Appends a little-endian `i32`.
    fn put_i32(&mut self, v: i32);
    /// Appends a little-endian `u64`.
    fn put_u64(&mut self, v: u64);
}

impl WireWrite for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i32(&mut self, v: i32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Checks that a fixed-size payload has exactly `expected` bytes.
pub fn expect_len(call: &'static str, payload: &[u8], expected: usize) -> Result<()> {
    if payload.len() == expected {
        Ok(())
    } else {
        Err(RpcError::malformed(
            call,
            format!(
                "payload is {} bytes, expected exactly {expected}",
                payload.len()
            ),
        ))
    }
}
