//! Response payload codecs.

use super::command::Command;
use super::engine::{
    BACKEND_NONE, ENGINE_OUTBOUND_RESPONSE_SIZE, LaneId, MAX_ENGINE_BYTES, OutboundId, check_rest,
};
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
    /// ENGINE_INFO: backend tag ([`super::engine::BACKEND_NONE`] = no
    /// engine) and the engine's address bytes.
    EngineInfo {
        /// Backend tag (`BACKEND_*`).
        backend: u8,
        /// `EngineAddress` bytes (empty without an engine).
        address: Vec<u8>,
    },
    /// ENGINE_OPEN_INBOUND: 1 and the lane and descriptor, or 0.
    EngineInbound {
        /// 1 = opened.
        ok: u8,
        /// The lane (0 when refused).
        lane: LaneId,
        /// `RemoteRegion` bytes of the range (empty when refused).
        descriptor: Vec<u8>,
    },
    /// ENGINE_OPEN_OUTBOUND: 1 and the outbound id, or 0.
    EngineOutbound {
        /// 1 = resolved, the pair can talk.
        ok: u8,
        /// The outbound id (0 when refused).
        id: OutboundId,
    },
}

/// How large the response to a command may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseSize {
    /// Exactly this many bytes.
    Exact(usize),
    /// Between the two bounds, inclusive (ENGINE_INFO, ENGINE_OPEN_INBOUND).
    Between(usize, usize),
}

impl ResponseSize {
    /// True when a declared size is allowed.
    pub fn allows(self, size: usize) -> bool {
        match self {
            ResponseSize::Exact(n) => size == n,
            ResponseSize::Between(lo, hi) => (lo..=hi).contains(&size),
        }
    }
}

/// The allowed payload sizes of the response to `cmd` (`expected_data` for
/// GET_TENSOR); `None` for commands without a response.
pub fn response_size(cmd: Command, expected_data: usize) -> Option<ResponseSize> {
    match cmd {
        Command::EngineInfo => Some(ResponseSize::Between(1, 1 + MAX_ENGINE_BYTES)),
        Command::EngineOpenInbound => Some(ResponseSize::Between(5, 5 + MAX_ENGINE_BYTES)),
        _ => expected_size(cmd, expected_data).map(ResponseSize::Exact),
    }
}

/// The exact payload size of the response to `cmd` (`expected_data` for
/// GET_TENSOR); `None` for commands without a response. For the two
/// variable-size engine responses it is the upper bound; a client checks a
/// declared size against [`response_size`] before reading anything.
pub fn expected_size(cmd: Command, expected_data: usize) -> Option<usize> {
    match cmd {
        Command::EngineInfo => Some(1 + MAX_ENGINE_BYTES),
        Command::EngineOpenInbound => Some(5 + MAX_ENGINE_BYTES),
        Command::EngineOpenOutbound => Some(ENGINE_OUTBOUND_RESPONSE_SIZE),
        Command::EngineWrite | Command::EngineWait | Command::EngineClose => Some(1),
        Command::MarkWait | Command::PeerMark | Command::CopyTensorToMark => Some(1),
        Command::MarkOpen => Some(8),
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
            Response::EngineInfo { backend, address } => {
                o.put_u8(*backend);
                o.extend_from_slice(address);
            }
            Response::EngineInbound {
                ok,
                lane,
                descriptor,
            } => {
                o.put_u8(*ok);
                o.put_u32(lane.0);
                o.extend_from_slice(descriptor);
            }
            Response::EngineOutbound { ok, id } => {
                o.put_u8(*ok);
                o.put_u32(id.0);
            }
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
            | Command::GetAllocSize
            | Command::MarkOpen => {
                expect_len(call, p, 8)?;
                Response::U64(r.u64()?)
            }
            Command::SetTensorHash
            | Command::CopyTensor
            | Command::CopyTensorTo
            | Command::PeerBarrier
            | Command::EngineWrite
            | Command::EngineWait
            | Command::EngineClose
            | Command::MarkWait
            | Command::PeerMark
            | Command::CopyTensorToMark => {
                expect_len(call, p, 1)?;
                Response::Status(r.u8()?)
            }
            Command::EngineInfo => {
                let backend = r.u8()?;
                let address = r.rest();
                check_rest(call, "address", address)?;
                if backend == BACKEND_NONE && !address.is_empty() {
                    return Err(RpcError::malformed(call, "an address without an engine"));
                }
                Response::EngineInfo {
                    backend,
                    address: address.to_vec(),
                }
            }
            Command::EngineOpenInbound => {
                let ok = r.u8()?;
                let lane = LaneId(r.u32()?);
                let descriptor = r.rest();
                check_rest(call, "descriptor", descriptor)?;
                if ok == 0 && !descriptor.is_empty() {
                    return Err(RpcError::malformed(call, "a descriptor with ok = 0"));
                }
                Response::EngineInbound {
                    ok,
                    lane,
                    descriptor: descriptor.to_vec(),
                }
            }
            Command::EngineOpenOutbound => {
                expect_len(call, p, ENGINE_OUTBOUND_RESPONSE_SIZE)?;
                Response::EngineOutbound {
                    ok: r.u8()?,
                    id: OutboundId(r.u32()?),
                }
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
