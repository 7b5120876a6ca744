//! Placing tensors in remote buffers.
//!
//! Each stage has three buffers: weights (written once), state (KV cache,
//! step inputs; kept for the whole run) and compute (every graph
//! intermediate). All three are filled by a linear allocator with the
//! server's GET_ALIGNMENT, without liveness-based reuse. Why that is
//! enough: a decode graph carries B tokens, so an intermediate is at most
//! `B * max(n_ff, n_vocab) * 4` bytes; a layer has ~25 of them, i.e. for
//! B = 4 and a 7B-shaped layer (n_ff 11008) about 4.4 MB per layer against
//! ~800 MB of F32 (~200 MB of F16) weights per layer: under 2.5% of the
//! stage's memory. Reuse would save that at the cost of a liveness pass and
//! of aliasing bugs that only show as wrong tokens.

use crate::client::Client;
use crate::error::{Result, RpcError};

/// A buffer allocated on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuffer {
    /// Buffer handle.
    pub handle: u64,
    /// Remote base address.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Hands out aligned offsets inside one buffer.
#[derive(Debug, Clone, Copy)]
pub struct LinearAllocator {
    alignment: u64,
    used: u64,
}

impl LinearAllocator {
    /// An empty allocator; `alignment` must be a power of two.
    pub fn new(alignment: u64) -> Result<Self> {
        if !alignment.is_power_of_two() {
            return Err(RpcError::malformed(
                "GET_ALIGNMENT",
                format!("alignment {alignment} is not a power of two"),
            ));
        }
        Ok(LinearAllocator { alignment, used: 0 })
    }

    /// Reserves `size` bytes and returns their offset.
    pub fn alloc(&mut self, size: u64) -> Result<u64> {
        let offset = self.used;
        self.used = size
            .checked_next_multiple_of(self.alignment)
            .and_then(|s| offset.checked_add(s))
            .ok_or_else(|| RpcError::refused("remote allocation", "size overflows"))?;
        Ok(offset)
    }

    /// Bytes needed so far (at least one alignment unit, so that every
    /// buffer can be allocated).
    pub fn size(&self) -> u64 {
        self.used.max(self.alignment)
    }
}

/// Allocates a buffer of `size` bytes on device 0 and asks for its base.
pub fn alloc_remote(client: &mut Client, size: u64, max_size: u64) -> Result<RemoteBuffer> {
    if size > max_size {
        return Err(RpcError::refused(
            "ALLOC_BUFFER",
            format!("{size} bytes exceed the server's largest buffer of {max_size} bytes"),
        ));
    }
    let Some((handle, got)) = client.alloc_buffer(0, size)? else {
        return Err(RpcError::refused(
            "ALLOC_BUFFER",
            format!("the server refused {size} bytes (quota?)"),
        ));
    };
    if got < size {
        return Err(RpcError::malformed(
            "ALLOC_BUFFER",
            format!("asked for {size} bytes, got {got}"),
        ));
    }
    let base = client.buffer_get_base(handle)?;
    if base.checked_add(got).is_none() || base == 0 {
        return Err(RpcError::malformed(
            "BUFFER_GET_BASE",
            format!("base {base:#x} of a {got}-byte buffer"),
        ));
    }
    Ok(RemoteBuffer {
        handle,
        base,
        size: got,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_offsets() -> Result<()> {
        let mut a = LinearAllocator::new(64)?;
        assert_eq!(a.alloc(10)?, 0);
        assert_eq!(a.alloc(64)?, 64);
        assert_eq!(a.alloc(1)?, 128);
        assert_eq!(a.size(), 192);
        assert!(LinearAllocator::new(48).is_err());
        assert!(a.alloc(u64::MAX).is_err());
        Ok(())
    }
}
