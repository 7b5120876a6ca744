//! The packed 296-byte `rpc_tensor` record.

use super::wire::{Reader, WireWrite};
use crate::error::Result;

/// Size of an encoded [`RpcTensor`].
pub const RPC_TENSOR_SIZE: usize = 296;
/// Number of dimensions of a ggml tensor.
pub const MAX_DIMS: usize = 4;
/// Number of sources of a ggml tensor.
pub const MAX_SRC: usize = 10;
/// Number of 32-bit op parameters.
pub const MAX_OP_PARAMS: usize = 16;
/// Length of the name field.
pub const MAX_NAME: usize = 64;

/// A tensor as ggml-rpc sends it. All values are untrusted until validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcTensor {
    /// The client's identity for the tensor (its own pointer); 0 = none.
    pub id: u64,
    /// `ggml_type`.
    pub ty: u32,
    /// Remote buffer handle; 0 = none.
    pub buffer: u64,
    /// Number of elements per dimension.
    pub ne: [u32; MAX_DIMS],
    /// Stride in bytes per dimension.
    pub nb: [u32; MAX_DIMS],
    /// `ggml_op`.
    pub op: u32,
    /// Op parameters.
    pub op_params: [i32; MAX_OP_PARAMS],
    /// `ggml_tensor_flag` bits.
    pub flags: i32,
    /// Source tensor ids; 0 = none.
    pub src: [u64; MAX_SRC],
    /// Id of the tensor this one views; 0 = none.
    pub view_src: u64,
    /// Byte offset of the view into `view_src`.
    pub view_offs: u64,
    /// Remote data address (inside `buffer`).
    pub data: u64,
    /// Name, NUL padded.
    pub name: [u8; MAX_NAME],
    /// Reference count hint from the client.
    pub use_count: i32,
}

impl Default for RpcTensor {
    fn default() -> Self {
        RpcTensor {
            id: 0,
            ty: 0,
            buffer: 0,
            ne: [1; MAX_DIMS],
            nb: [0; MAX_DIMS],
            op: 0,
            op_params: [0; MAX_OP_PARAMS],
            flags: 0,
            src: [0; MAX_SRC],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; MAX_NAME],
            use_count: 0,
        }
    }
}

/// The fields of one record whose length was checked once: each field is
/// a copy out of a fixed array, not a bounds-checked [`Reader`] call (those
/// were ~1/6 of the session thread's time on a 300-node ADD/MUL graph,
/// perf under `tests/graph_overhead.rs`; llama.cpp sends every tensor of a
/// graph this way, each time it sends the graph).
struct Record<'a> {
    b: &'a [u8; RPC_TENSOR_SIZE],
    at: usize,
}

impl Record<'_> {
    /// The next `N` bytes. The fields of a record add up to its size, so
    /// the range is always inside it (zeros otherwise, never a panic).
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(s) = self.b.get(self.at..self.at + N) {
            out.copy_from_slice(s);
        }
        self.at += N;
        out
    }
}

impl RpcTensor {
    /// Appends the 296-byte encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(RPC_TENSOR_SIZE);
        out.put_u64(self.id);
        out.put_u32(self.ty);
        out.put_u64(self.buffer);
        for v in self.ne {
            out.put_u32(v);
        }
        for v in self.nb {
            out.put_u32(v);
        }
        out.put_u32(self.op);
        for v in self.op_params {
            out.put_i32(v);
        }
        out.put_i32(self.flags);
        for v in self.src {
            out.put_u64(v);
        }
        out.put_u64(self.view_src);
        out.put_u64(self.view_offs);
        out.put_u64(self.data);
        out.extend_from_slice(&self.name);
        out.put_i32(self.use_count);
    }

    /// The 296-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RPC_TENSOR_SIZE);
        self.encode_into(&mut out);
        out
    }

    /// Reads one record from `r`.
    pub fn read(r: &mut Reader<'_>) -> Result<RpcTensor> {
        let b: &[u8; RPC_TENSOR_SIZE] = r
            .bytes(RPC_TENSOR_SIZE)?
            .try_into()
            .map_err(|_| crate::error::RpcError::malformed("rpc_tensor", "record length"))?;
        let mut r = Record { b, at: 0 };
        let id = u64::from_le_bytes(r.take());
        let ty = u32::from_le_bytes(r.take());
        let buffer = u64::from_le_bytes(r.take());
        let mut ne = [0u32; MAX_DIMS];
        for v in &mut ne {
            *v = u32::from_le_bytes(r.take());
        }
        let mut nb = [0u32; MAX_DIMS];
        for v in &mut nb {
            *v = u32::from_le_bytes(r.take());
        }
        let op = u32::from_le_bytes(r.take());
        let mut op_params = [0i32; MAX_OP_PARAMS];
        for v in &mut op_params {
            *v = i32::from_le_bytes(r.take());
        }
        let flags = i32::from_le_bytes(r.take());
        let mut src = [0u64; MAX_SRC];
        for v in &mut src {
            *v = u64::from_le_bytes(r.take());
        }
        let view_src = u64::from_le_bytes(r.take());
        let view_offs = u64::from_le_bytes(r.take());
        let data = u64::from_le_bytes(r.take());
        let name = r.take::<MAX_NAME>();
        let use_count = i32::from_le_bytes(r.take());
        Ok(RpcTensor {
            id,
            ty,
            buffer,
            ne,
            nb,
            op,
            op_params,
            flags,
            src,
            view_src,
            view_offs,
            data,
            name,
            use_count,
        })
    }

    /// Decodes exactly one record.
    pub fn decode(bytes: &[u8]) -> Result<RpcTensor> {
        let mut r = Reader::new(bytes, "rpc_tensor");
        let t = RpcTensor::read(&mut r)?;
        r.finish()?;
        Ok(t)
    }

    /// Sets the name (truncated to 63 bytes, NUL terminated).
    pub fn set_name(&mut self, name: &str) {
        self.name = [0; MAX_NAME];
        let n = name.len().min(MAX_NAME - 1);
        self.name[..n].copy_from_slice(&name.as_bytes()[..n]);
    }

    /// The name up to its first NUL, lossily decoded.
    pub fn name_str(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_layout_offsets() {
        let mut t = RpcTensor {
            id: 0x0102_0304_0506_0708,
            ty: 0x11,
            buffer: 0x2222,
            ne: [1, 2, 3, 4],
            nb: [5, 6, 7, 8],
            op: 0x33,
            flags: 0x44,
            view_src: 0x55,
            view_offs: 0x66,
            data: 0x77,
            use_count: 0x88,
            ..RpcTensor::default()
        };
        t.op_params[0] = 0x99;
        t.op_params[15] = -1;
        t.src[0] = 0xAA;
        t.src[9] = 0xBB;
        t.set_name("abc");
        let b = t.encode();
        assert_eq!(b.len(), RPC_TENSOR_SIZE);
        assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[8..12], &[0x11, 0, 0, 0]);
        assert_eq!(&b[12..20], &0x2222u64.to_le_bytes());
        assert_eq!(&b[20..24], &[1, 0, 0, 0]);
        assert_eq!(&b[32..36], &[4, 0, 0, 0]);
        assert_eq!(&b[36..40], &[5, 0, 0, 0]);
        assert_eq!(&b[48..52], &[8, 0, 0, 0]);
        assert_eq!(&b[52..56], &[0x33, 0, 0, 0]);
        assert_eq!(&b[56..60], &[0x99, 0, 0, 0]);
        assert_eq!(&b[116..120], &[0xFF; 4]);
        assert_eq!(&b[120..124], &[0x44, 0, 0, 0]);
        assert_eq!(&b[124..132], &0xAAu64.to_le_bytes());
        assert_eq!(&b[196..204], &0xBBu64.to_le_bytes());
        assert_eq!(&b[204..212], &0x55u64.to_le_bytes());
        assert_eq!(&b[212..220], &0x66u64.to_le_bytes());
        assert_eq!(&b[220..228], &0x77u64.to_le_bytes());
        assert_eq!(&b[228..231], b"abc");
        assert_eq!(b[231], 0);
        assert_eq!(&b[292..296], &[0x88, 0, 0, 0]);
        assert_eq!(RpcTensor::decode(&b).ok().as_ref(), Some(&t));
        assert_eq!(t.name_str(), "abc");
    }

    #[test]
    fn short_and_long_refused() {
        let b = RpcTensor::default().encode();
        assert!(RpcTensor::decode(&b[..295]).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(RpcTensor::decode(&long).is_err());
    }
}
