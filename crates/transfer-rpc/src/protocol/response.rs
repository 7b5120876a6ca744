//! Response payload codecs.

use super::command::Command;
use super::hello::{ExtInfo, HelloResponse};
use super::wire::{Reader, WireWrite, expect_len};
use crate::error::{Result, RpcError};

/// A decoded response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// ALLOC_BUFFER: handle (0 = failure) and size.
    AllocBuffer {
        /// Buffer handle; 0 when allocation failed.
        remote_ptr: u64,
        /// Allocated size.
        remote_size: u64,
    },
    /// GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, GET_ALLOC_SIZE.
    U64(u64),
    /// SET_TENSOR_HASH, COPY_TENSOR, COPY_TENSOR_TO, PEER_BARRIER: 1 = success.
    Status(u8),
    /// GET_DEVICE_MEMORY.
    DeviceMemory {
        /// Free bytes.
        free: u64,
        /// Total bytes.
        total: u64,
    },
    /// DEVICE_COUNT.
    DeviceCount(u32),
    /// HELLO.
    Hello(HelloResponse),
    /// EXT_QUERY.
    Ext(ExtInfo),
    /// GET_TENSOR: the bytes.
    Data(Vec<u8>),
}

/// The exact payload size of the response to `cmd` (`expected_data` for
/// GET_TENSOR); `None` for commands without a response. A client checks a
/// declared size against it before reading anything.
pub fn expected_size(cmd: Command, expected_data: usize) -> Option<usize> {
    match cmd {
        Command::AllocBuffer | Command::GetDeviceMemory | Command::ExtQuery => Some(16),
        Command::GetAlignment
        | Command::GetMaxSize
        | Command::BufferGetBase
        | Command::GetAllocSize => Some(8),
        Command::SetTensorHash
        | Command::CopyTensor
        | Command::CopyTensorTo
        | Command::PeerBarrier => Some(1),
        Command::DeviceCount => Some(4),
        Command::Hello => Some(super::hello::HELLO_RESPONSE_SIZE),
        Command::GetTensor => Some(expected_data),
        Command::FreeBuffer
        | Command::BufferClear
        | Command::SetTensor
        | Command::GraphCompute
        | Command::InitTensor
        | Command::GraphRecompute
        | Command::MemsetTensor => None,
    }
}

impl Response {
    /// Encodes the payload (without the size header).
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Response::AllocBuffer {
                remote_ptr,
                remote_size,
            } => {
                o.put_u64(*remote_ptr);
                o.put_u64(*remote_size);
            }
            Response::U64(v) => o.put_u64(*v),
            Response::Status(v) => o.put_u8(*v),
            Response::DeviceMemory { free, total } => {
                o.put_u64(*free);
                o.put_u64(*total);
            }
            Response::DeviceCount(n) => o.put_u32(*n),
            Response::Hello(h) => o = h.encode(),
            Response::Ext(e) => o = e.encode(),
            Response::Data(d) => o.extend_from_slice(d),
        }
        o
    }

    /// Decodes the response to `cmd`. `expected_data` is the size a
    /// GET_TENSOR asked for; every other response has a fixed size.
    pub fn decode(cmd: Command, p: &[u8], expected_data: usize) -> Result<Response> {
        let call = cmd.name();
        let mut r = Reader::new(p, call);
        let resp = match cmd {
            Command::AllocBuffer => {
                expect_len(call, p, 16)?;
                Response::AllocBuffer {
                    remote_ptr: r.u64()?,
                    remote_size: r.u64()?,
                }
            }
            Command::GetAlignment
            | Command::GetMaxSize
            | Command::BufferGetBase
            | Command::GetAllocSize => {
                expect_len(call, p, 8)?;
                Response::U64(r.u64()?)
            }
            Command::SetTensorHash
            | Command::CopyTensor
            | Command::CopyTensorTo
            | Command::PeerBarrier => {
                expect_len(call, p, 1)?;
                Response::Status(r.u8()?)
            }
            Command::GetDeviceMemory => {
                expect_len(call, p, 16)?;
                Response::DeviceMemory {
                    free: r.u64()?,
                    total: r.u64()?,
                }
            }
            Command::DeviceCount => {
                expect_len(call, p, 4)?;
                Response::DeviceCount(r.u32()?)
            }
            Command::Hello => return Ok(Response::Hello(HelloResponse::decode(p)?)),
            Command::ExtQuery => return Ok(Response::Ext(ExtInfo::decode(p)?)),
            Command::GetTensor => {
                expect_len(call, p, expected_data)?;
                return Ok(Response::Data(p.to_vec()));
            }
            Command::FreeBuffer
            | Command::BufferClear
            | Command::SetTensor
            | Command::GraphCompute
            | Command::InitTensor
            | Command::GraphRecompute
            | Command::MemsetTensor => {
                return Err(RpcError::malformed(call, "this command has no response"));
            }
        };
        r.finish()?;
        Ok(resp)
    }
}
