//! Reading declared-size payloads without trusting the declaration.

use std::io::Read;

use crate::error::{Result, RpcError};

/// Most bytes reserved ahead of the data that has actually arrived.
const CHUNK: usize = 8 << 20;

/// Reads exactly `size` bytes. Memory is reserved chunk by chunk as data
/// arrives, with fallible reservation: a peer that declares a large size
/// and sends little costs little, and an allocation failure is an error,
/// not an abort.
pub fn read_payload(r: &mut impl Read, size: usize, call: &'static str) -> Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    while out.len() < size {
        let want = (size - out.len()).min(CHUNK);
        out.try_reserve_exact(want)
            .map_err(|_| RpcError::refused(call, format!("cannot allocate {size} bytes")))?;
        let start = out.len();
        out.resize(start + want, 0);
        if let Err(e) = r.read_exact(&mut out[start..]) {
            return Err(RpcError::io(call, e));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_an_error() {
        let data = [1u8; 10];
        assert!(read_payload(&mut &data[..], 11, "t").is_err());
        assert_eq!(
            read_payload(&mut &data[..], 10, "t").ok().as_deref(),
            Some(&data[..])
        );
        assert!(read_payload(&mut &data[..], 0, "t").is_ok_and(|v| v.is_empty()));
    }
}
