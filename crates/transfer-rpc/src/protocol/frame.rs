//! Framing: `cmd u8 | size u64 | payload` requests, `size u64 | payload` responses.

use super::command::Command;
use crate::error::{Result, RpcError};

/// Bytes before a request payload.
pub const REQUEST_HEADER_SIZE: usize = 9;
/// Bytes before a response payload.
pub const RESPONSE_HEADER_SIZE: usize = 8;
/// Default largest message accepted (request or response payload): 4 GiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 4 << 30;

/// Size limits applied before any payload byte is read or allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload, in bytes, of any request or response.
    pub max_message_size: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

impl Limits {
    /// Checks a declared payload size; returns it as `usize`.
    pub fn check(&self, call: &'static str, size: u64) -> Result<usize> {
        if size > self.max_message_size {
            return Err(RpcError::MessageTooLarge {
                call,
                size,
                limit: self.max_message_size,
            });
        }
        usize::try_from(size).map_err(|_| RpcError::MessageTooLarge {
            call,
            size,
            limit: usize::MAX as u64,
        })
    }
}

/// Encodes a complete request frame.
pub fn encode_request(cmd: Command, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REQUEST_HEADER_SIZE + payload.len());
    out.push(cmd.byte());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Encodes a complete response frame.
pub fn encode_response(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RESPONSE_HEADER_SIZE + payload.len());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes a request header; refuses unknown commands and oversized payloads.
pub fn decode_request_header(
    header: &[u8; REQUEST_HEADER_SIZE],
    limits: &Limits,
) -> Result<(Command, usize)> {
    let cmd = Command::from_byte(header[0])?;
    let mut size = [0u8; 8];
    size.copy_from_slice(&header[1..]);
    let size = limits.check("request header", u64::from_le_bytes(size))?;
    Ok((cmd, size))
}

/// Decodes a response header; refuses oversized payloads.
pub fn decode_response_header(
    header: &[u8; RESPONSE_HEADER_SIZE],
    limits: &Limits,
) -> Result<usize> {
    limits.check("response header", u64::from_le_bytes(*header))
}

/// Splits one complete request frame off the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, else the command, its
/// payload and the number of bytes consumed.
pub fn split_request<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Command, &'a [u8], usize)>> {
    let Some(header) = buf.get(..REQUEST_HEADER_SIZE) else {
        return Ok(None);
    };
    let mut h = [0u8; REQUEST_HEADER_SIZE];
    h.copy_from_slice(header);
    let (cmd, size) = decode_request_header(&h, limits)?;
    let end = REQUEST_HEADER_SIZE
        .checked_add(size)
        .ok_or_else(|| RpcError::malformed("split_request", "size overflows"))?;
    match buf.get(REQUEST_HEADER_SIZE..end) {
        Some(payload) => Ok(Some((cmd, payload, end))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request_and_response_frames() {
        let f = encode_request(Command::GetAlignment, &[7, 0, 0, 0]);
        assert_eq!(f, vec![1, 4, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0]);
        let r = encode_response(&[1]);
        assert_eq!(r, vec![1, 0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn split_needs_more_and_refuses_oversize() {
        let limits = Limits {
            max_message_size: 16,
        };
        let f = encode_request(Command::DeviceCount, &[]);
        assert!(matches!(split_request(&f[..5], &limits), Ok(None)));
        let split = split_request(&f, &limits)
            .ok()
            .flatten()
            .map(|(c, p, n)| (c, p.len(), n));
        assert_eq!(split, Some((Command::DeviceCount, 0, 9)));
        let big = encode_request(Command::SetTensor, &[0u8; 17]);
        assert!(matches!(
            split_request(&big, &limits),
            Err(RpcError::MessageTooLarge { .. })
        ));
        let mut huge = vec![6u8];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(split_request(&huge, &Limits::default()).is_err());
        assert!(split_request(&[18, 0, 0, 0, 0, 0, 0, 0, 0], &limits).is_err());
    }
}
