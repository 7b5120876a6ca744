//! Request payload codecs for every command.

use super::command::Command;
use super::engine::{
    CloseKind, ENGINE_CLOSE_SIZE, ENGINE_WAIT_SIZE, ENGINE_WRITE_SIZE, LaneId, OutboundId,
    put_bounded, read_bounded,
};
use super::graph::GraphPayload;
use super::hello::{HELLO_REQUEST_SIZE, HelloRequest};
use super::tensor::{MAX_SRC, RPC_TENSOR_SIZE, RpcTensor};
use super::wire::{Reader, WireWrite, expect_len};
use crate::error::{Result, RpcError};

/// Longest endpoint string COPY_TENSOR_TO accepts.
pub const MAX_ENDPOINT_LEN: usize = 255;
/// Size of the fixed part of a SET_TENSOR payload (tensor, cache flag, offset).
pub const SET_TENSOR_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 1 + 8;
/// Size of the fixed part of a COPY_TENSOR_TO payload.
pub const COPY_TENSOR_TO_HEADER_SIZE: usize = 2 * RPC_TENSOR_SIZE + 8 + 4;

/// Decodes the fixed part of a SET_TENSOR payload (exactly
/// [`SET_TENSOR_HEADER_SIZE`] bytes): tensor, cache flag, offset. Lets a
/// server check the destination before it reads the data.
pub fn decode_set_tensor_header(p: &[u8]) -> Result<(Box<RpcTensor>, u8, u64)> {
    let call = Command::SetTensor.name();
    expect_len(call, p, SET_TENSOR_HEADER_SIZE)?;
    let mut r = Reader::new(p, call);
    let t = tensor(&mut r)?;
    let flag = r.u8()?;
    let offset = r.u64()?;
    r.finish()?;
    Ok((t, flag, offset))
}

/// Largest payload `cmd` can carry under these limits: commands of a fixed
/// or bounded layout get that bound, SET_TENSOR its header plus the largest
/// buffer, GRAPH_COMPUTE what the graph limits allow. Checked before a
/// payload byte is read.
pub fn max_request_payload(cmd: Command, max_buffer: u64, max_nodes: u64, max_tensors: u64) -> u64 {
    /// Covers every fixed layout (the largest, GET_ALLOC_SIZE, is 3.3 KB)
    /// and the engine commands' bounded strings.
    const SMALL: u64 = 64 << 10;
    match cmd {
        Command::SetTensor => (SET_TENSOR_HEADER_SIZE as u64).saturating_add(max_buffer),
        Command::GraphCompute => 8u64
            .saturating_add(max_nodes.saturating_mul(8))
            .saturating_add(max_tensors.saturating_mul(RPC_TENSOR_SIZE as u64)),
        _ => SMALL,
    }
}

/// A decoded request. Tensors are untrusted until validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// ALLOC_BUFFER.
    AllocBuffer {
        /// Device index.
        device: u32,
        /// Bytes requested.
        size: u64,
    },
    /// GET_ALIGNMENT.
    GetAlignment {
        /// Device index.
        device: u32,
    },
    /// GET_MAX_SIZE.
    GetMaxSize {
        /// Device index.
        device: u32,
    },
    /// BUFFER_GET_BASE.
    BufferGetBase {
        /// Buffer handle.
        remote_ptr: u64,
    },
    /// FREE_BUFFER.
    FreeBuffer {
        /// Buffer handle.
        remote_ptr: u64,
    },
    /// BUFFER_CLEAR.
    BufferClear {
        /// Buffer handle.
        remote_ptr: u64,
        /// Fill byte.
        value: u8,
    },
    /// SET_TENSOR.
    SetTensor {
        /// Target tensor.
        tensor: Box<RpcTensor>,
        /// Non-zero: the server should store the data in its hash cache.
        cache_flag: u8,
        /// Byte offset into the tensor.
        offset: u64,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// SET_TENSOR_HASH.
    SetTensorHash {
        /// Target tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset into the tensor.
        offset: u64,
        /// FNV-1a of the data.
        hash: u64,
    },
    /// GET_TENSOR.
    GetTensor {
        /// Source tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset into the tensor.
        offset: u64,
        /// Bytes to read.
        size: u64,
    },
    /// COPY_TENSOR.
    CopyTensor {
        /// Source tensor.
        src: Box<RpcTensor>,
        /// Destination tensor.
        dst: Box<RpcTensor>,
    },
    /// GRAPH_COMPUTE.
    GraphCompute(Box<GraphPayload>),
    /// GET_DEVICE_MEMORY.
    GetDeviceMemory {
        /// Device index.
        device: u32,
    },
    /// INIT_TENSOR.
    InitTensor {
        /// Tensor to initialise.
        tensor: Box<RpcTensor>,
    },
    /// GET_ALLOC_SIZE.
    GetAllocSize {
        /// Device index.
        device: u32,
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Its sources (id 0 = none).
        srcs: Box<[RpcTensor; MAX_SRC]>,
    },
    /// HELLO.
    Hello(HelloRequest),
    /// DEVICE_COUNT.
    DeviceCount,
    /// GRAPH_RECOMPUTE.
    GraphRecompute {
        /// Device index.
        device: u32,
    },
    /// MEMSET_TENSOR.
    MemsetTensor {
        /// Target tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset into the tensor.
        offset: u64,
        /// Bytes to fill.
        size: u64,
        /// Fill byte.
        value: u8,
    },
    /// EXT_QUERY (extension).
    ExtQuery,
    /// COPY_TENSOR_TO (extension), or COPY_TENSOR_TO_MARK (mark
    /// extension) when `mark` is set: the copy, then PEER_MARK(key, seq)
    /// to the destination after the data. One variant: the two commands
    /// differ only by the mark between `size` and the endpoint.
    CopyTensorTo {
        /// Source tensor on the server receiving the request.
        src: Box<RpcTensor>,
        /// Destination tensor on the server at `endpoint`.
        dst: Box<RpcTensor>,
        /// Bytes to copy from the start of `src`.
        size: u64,
        /// The destination session's mark key and the mark (> 0):
        /// COPY_TENSOR_TO_MARK.
        mark: Option<(u64, u64)>,
        /// `host:port` of the destination server.
        endpoint: String,
    },
    /// PEER_BARRIER (extension).
    PeerBarrier,
    /// ENGINE_INFO (engine extension).
    EngineInfo,
    /// ENGINE_OPEN_INBOUND (engine extension), sent to the destination.
    EngineOpenInbound {
        /// Destination buffer handle.
        buffer: u64,
        /// Start of the range, in bytes from the buffer's start.
        offset: u64,
        /// Length of the range.
        size: u64,
        /// The sender's `EngineAddress` bytes.
        sender: &'a [u8],
    },
    /// ENGINE_OPEN_OUTBOUND (engine extension), sent to the source.
    EngineOpenOutbound {
        /// The destination's `EngineAddress` bytes.
        destination: &'a [u8],
        /// The `RemoteRegion` bytes ENGINE_OPEN_INBOUND returned.
        descriptor: &'a [u8],
        /// The lane ENGINE_OPEN_INBOUND returned.
        lane: LaneId,
    },
    /// ENGINE_WRITE (engine extension).
    EngineWrite {
        /// Outbound target.
        outbound: OutboundId,
        /// Source tensor on this server.
        src: Box<RpcTensor>,
        /// Offset into the source tensor.
        src_offset: u64,
        /// Bytes to write.
        size: u64,
        /// Offset into the inbound region.
        dst_offset: u64,
        /// Sequence number (low 16 bits go into the immediate).
        seq: u32,
    },
    /// ENGINE_WAIT (engine extension).
    EngineWait {
        /// Inbound lane of this session.
        lane: LaneId,
        /// Sequence number of the write.
        seq: u32,
        /// How long to wait (the server caps it).
        timeout_ms: u32,
        /// Byte count of the write (decides how many shards carry the immediate).
        size: u64,
    },
    /// ENGINE_CLOSE (engine extension).
    EngineClose {
        /// Inbound lane or outbound target.
        kind: CloseKind,
        /// The lane or outbound id.
        id: u32,
    },
    /// MARK_OPEN (mark extension).
    MarkOpen,
    /// MARK_WAIT (mark extension), on the destination's own session.
    MarkWait {
        /// A key this session opened.
        key: u64,
        /// The mark to wait for (> 0).
        seq: u64,
        /// How long to wait (the server caps it).
        timeout_ms: u32,
    },
    /// PEER_MARK (mark extension), from the source server.
    PeerMark {
        /// The destination session's key.
        key: u64,
        /// The mark (> 0).
        seq: u64,
    },
}

/// Size of a MARK_WAIT payload.
pub const MARK_WAIT_SIZE: usize = 20;
/// Size of a PEER_MARK payload.
pub const PEER_MARK_SIZE: usize = 16;

/// The `endpoint_len u32 | endpoint` tail of COPY_TENSOR_TO(_MARK).
fn endpoint_tail(call: &'static str, r: &mut Reader<'_>) -> Result<String> {
    let len = r.u32()? as usize;
    if len == 0 || len > MAX_ENDPOINT_LEN || len != r.remaining() {
        return Err(RpcError::malformed(
            call,
            format!(
                "endpoint length {len} (max {MAX_ENDPOINT_LEN}, {} bytes follow)",
                r.remaining()
            ),
        ));
    }
    Ok(std::str::from_utf8(r.bytes(len)?)
        .map_err(|_| RpcError::malformed(call, "endpoint is not UTF-8"))?
        .to_owned())
}

fn device_only(call: &'static str, r: &mut Reader<'_>) -> Result<u32> {
    if r.remaining() != 4 {
        return Err(RpcError::malformed(call, "payload must be exactly 4 bytes"));
    }
    r.u32()
}

fn handle_only(call: &'static str, r: &mut Reader<'_>) -> Result<u64> {
    if r.remaining() != 8 {
        return Err(RpcError::malformed(call, "payload must be exactly 8 bytes"));
    }
    r.u64()
}

fn tensor(r: &mut Reader<'_>) -> Result<Box<RpcTensor>> {
    RpcTensor::read(r).map(Box::new)
}

impl<'a> Request<'a> {
    /// The command this request is sent with.
    pub fn command(&self) -> Command {
        match self {
            Request::AllocBuffer { .. } => Command::AllocBuffer,
            Request::GetAlignment { .. } => Command::GetAlignment,
            Request::GetMaxSize { .. } => Command::GetMaxSize,
            Request::BufferGetBase { .. } => Command::BufferGetBase,
            Request::FreeBuffer { .. } => Command::FreeBuffer,
            Request::BufferClear { .. } => Command::BufferClear,
            Request::SetTensor { .. } => Command::SetTensor,
            Request::SetTensorHash { .. } => Command::SetTensorHash,
            Request::GetTensor { .. } => Command::GetTensor,
            Request::CopyTensor { .. } => Command::CopyTensor,
            Request::GraphCompute(_) => Command::GraphCompute,
            Request::GetDeviceMemory { .. } => Command::GetDeviceMemory,
            Request::InitTensor { .. } => Command::InitTensor,
            Request::GetAllocSize { .. } => Command::GetAllocSize,
            Request::Hello(_) => Command::Hello,
            Request::DeviceCount => Command::DeviceCount,
            Request::GraphRecompute { .. } => Command::GraphRecompute,
            Request::MemsetTensor { .. } => Command::MemsetTensor,
            Request::ExtQuery => Command::ExtQuery,
            Request::CopyTensorTo { mark: None, .. } => Command::CopyTensorTo,
            Request::CopyTensorTo { mark: Some(_), .. } => Command::CopyTensorToMark,
            Request::PeerBarrier => Command::PeerBarrier,
            Request::EngineInfo => Command::EngineInfo,
            Request::EngineOpenInbound { .. } => Command::EngineOpenInbound,
            Request::EngineOpenOutbound { .. } => Command::EngineOpenOutbound,
            Request::EngineWrite { .. } => Command::EngineWrite,
            Request::EngineWait { .. } => Command::EngineWait,
            Request::EngineClose { .. } => Command::EngineClose,
            Request::MarkOpen => Command::MarkOpen,
            Request::MarkWait { .. } => Command::MarkWait,
            Request::PeerMark { .. } => Command::PeerMark,
        }
    }

    /// Decodes the payload of `cmd`. Fixed-size requests must match their
    /// size exactly; variable ones are checked field by field.
    pub fn decode(cmd: Command, p: &'a [u8]) -> Result<Request<'a>> {
        let call = cmd.name();
        let mut r = Reader::new(p, call);
        let req = match cmd {
            Command::AllocBuffer => {
                expect_len(call, p, 12)?;
                Request::AllocBuffer {
                    device: r.u32()?,
                    size: r.u64()?,
                }
            }
            Command::GetAlignment => Request::GetAlignment {
                device: device_only(call, &mut r)?,
            },
            Command::GetMaxSize => Request::GetMaxSize {
                device: device_only(call, &mut r)?,
            },
            Command::BufferGetBase => Request::BufferGetBase {
                remote_ptr: handle_only(call, &mut r)?,
            },
            Command::FreeBuffer => Request::FreeBuffer {
                remote_ptr: handle_only(call, &mut r)?,
            },
            Command::BufferClear => {
                expect_len(call, p, 9)?;
                Request::BufferClear {
                    remote_ptr: r.u64()?,
                    value: r.u8()?,
                }
            }
            Command::SetTensor => {
                if p.len() < SET_TENSOR_HEADER_SIZE {
                    return Err(RpcError::malformed(call, "shorter than its header"));
                }
                Request::SetTensor {
                    tensor: tensor(&mut r)?,
                    cache_flag: r.u8()?,
                    offset: r.u64()?,
                    data: r.rest(),
                }
            }
            Command::SetTensorHash => {
                expect_len(call, p, RPC_TENSOR_SIZE + 16)?;
                Request::SetTensorHash {
                    tensor: tensor(&mut r)?,
                    offset: r.u64()?,
                    hash: r.u64()?,
                }
            }
            Command::GetTensor => {
                expect_len(call, p, RPC_TENSOR_SIZE + 16)?;
                Request::GetTensor {
                    tensor: tensor(&mut r)?,
                    offset: r.u64()?,
                    size: r.u64()?,
                }
            }
            Command::CopyTensor => {
                expect_len(call, p, 2 * RPC_TENSOR_SIZE)?;
                Request::CopyTensor {
                    src: tensor(&mut r)?,
                    dst: tensor(&mut r)?,
                }
            }
            Command::GraphCompute => {
                return Ok(Request::GraphCompute(Box::new(GraphPayload::decode(p)?)));
            }
            Command::GetDeviceMemory => Request::GetDeviceMemory {
                device: device_only(call, &mut r)?,
            },
            Command::InitTensor => {
                expect_len(call, p, RPC_TENSOR_SIZE)?;
                Request::InitTensor {
                    tensor: tensor(&mut r)?,
                }
            }
            Command::GetAllocSize => {
                expect_len(call, p, 4 + RPC_TENSOR_SIZE * (1 + MAX_SRC))?;
                let device = r.u32()?;
                let t = tensor(&mut r)?;
                let mut srcs: Box<[RpcTensor; MAX_SRC]> = Box::default();
                for s in srcs.iter_mut() {
                    *s = RpcTensor::read(&mut r)?;
                }
                Request::GetAllocSize {
                    device,
                    tensor: t,
                    srcs,
                }
            }
            Command::Hello => {
                expect_len(call, p, HELLO_REQUEST_SIZE)?;
                Request::Hello(HelloRequest {
                    conn_caps: r.array()?,
                })
            }
            Command::DeviceCount => {
                expect_len(call, p, 0)?;
                Request::DeviceCount
            }
            Command::GraphRecompute => Request::GraphRecompute {
                device: device_only(call, &mut r)?,
            },
            Command::MemsetTensor => {
                expect_len(call, p, RPC_TENSOR_SIZE + 17)?;
                Request::MemsetTensor {
                    tensor: tensor(&mut r)?,
                    offset: r.u64()?,
                    size: r.u64()?,
                    value: r.u8()?,
                }
            }
            Command::ExtQuery => {
                expect_len(call, p, 0)?;
                Request::ExtQuery
            }
            Command::CopyTensorTo | Command::CopyTensorToMark => {
                let src = tensor(&mut r)?;
                let dst = tensor(&mut r)?;
                let size = r.u64()?;
                let mark = if cmd == Command::CopyTensorToMark {
                    Some((r.u64()?, r.u64()?))
                } else {
                    None
                };
                let endpoint = endpoint_tail(call, &mut r)?;
                Request::CopyTensorTo {
                    src,
                    dst,
                    size,
                    mark,
                    endpoint,
                }
            }
            Command::MarkOpen => {
                expect_len(call, p, 0)?;
                Request::MarkOpen
            }
            Command::MarkWait => {
                expect_len(call, p, MARK_WAIT_SIZE)?;
                Request::MarkWait {
                    key: r.u64()?,
                    seq: r.u64()?,
                    timeout_ms: r.u32()?,
                }
            }
            Command::PeerMark => {
                expect_len(call, p, PEER_MARK_SIZE)?;
                Request::PeerMark {
                    key: r.u64()?,
                    seq: r.u64()?,
                }
            }
            Command::PeerBarrier => {
                expect_len(call, p, 0)?;
                Request::PeerBarrier
            }
            Command::EngineInfo => {
                expect_len(call, p, 0)?;
                Request::EngineInfo
            }
            Command::EngineOpenInbound => {
                if p.len() < 28 {
                    return Err(RpcError::malformed(call, "shorter than its header"));
                }
                Request::EngineOpenInbound {
                    buffer: r.u64()?,
                    offset: r.u64()?,
                    size: r.u64()?,
                    sender: read_bounded(&mut r, call, "sender address")?,
                }
            }
            Command::EngineOpenOutbound => Request::EngineOpenOutbound {
                destination: read_bounded(&mut r, call, "destination address")?,
                descriptor: read_bounded(&mut r, call, "descriptor")?,
                lane: LaneId(r.u32()?),
            },
            Command::EngineWrite => {
                expect_len(call, p, ENGINE_WRITE_SIZE)?;
                Request::EngineWrite {
                    outbound: OutboundId(r.u32()?),
                    src: tensor(&mut r)?,
                    src_offset: r.u64()?,
                    size: r.u64()?,
                    dst_offset: r.u64()?,
                    seq: r.u32()?,
                }
            }
            Command::EngineWait => {
                expect_len(call, p, ENGINE_WAIT_SIZE)?;
                Request::EngineWait {
                    lane: LaneId(r.u32()?),
                    seq: r.u32()?,
                    timeout_ms: r.u32()?,
                    size: r.u64()?,
                }
            }
            Command::EngineClose => {
                expect_len(call, p, ENGINE_CLOSE_SIZE)?;
                Request::EngineClose {
                    kind: CloseKind::from_byte(call, r.u8()?)?,
                    id: r.u32()?,
                }
            }
        };
        r.finish()?;
        Ok(req)
    }

    /// Encodes the payload (without the frame header).
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Request::AllocBuffer { device, size } => {
                o.put_u32(*device);
                o.put_u64(*size);
            }
            Request::GetAlignment { device }
            | Request::GetMaxSize { device }
            | Request::GetDeviceMemory { device }
            | Request::GraphRecompute { device } => o.put_u32(*device),
            Request::BufferGetBase { remote_ptr } | Request::FreeBuffer { remote_ptr } => {
                o.put_u64(*remote_ptr)
            }
            Request::BufferClear { remote_ptr, value } => {
                o.put_u64(*remote_ptr);
                o.put_u8(*value);
            }
            Request::SetTensor {
                tensor,
                cache_flag,
                offset,
                data,
            } => {
                o.reserve(SET_TENSOR_HEADER_SIZE + data.len());
                tensor.encode_into(&mut o);
                o.put_u8(*cache_flag);
                o.put_u64(*offset);
                o.extend_from_slice(data);
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                tensor.encode_into(&mut o);
                o.put_u64(*offset);
                o.put_u64(*hash);
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                tensor.encode_into(&mut o);
                o.put_u64(*offset);
                o.put_u64(*size);
            }
            Request::CopyTensor { src, dst } => {
                src.encode_into(&mut o);
                dst.encode_into(&mut o);
            }
            Request::GraphCompute(g) => o = g.encode(),
            Request::InitTensor { tensor } => tensor.encode_into(&mut o),
            Request::GetAllocSize {
                device,
                tensor,
                srcs,
            } => {
                o.put_u32(*device);
                tensor.encode_into(&mut o);
                for s in srcs.iter() {
                    s.encode_into(&mut o);
                }
            }
            Request::Hello(h) => o.extend_from_slice(&h.conn_caps),
            Request::DeviceCount
            | Request::ExtQuery
            | Request::PeerBarrier
            | Request::EngineInfo
            | Request::MarkOpen => {}
            Request::MarkWait {
                key,
                seq,
                timeout_ms,
            } => {
                o.put_u64(*key);
                o.put_u64(*seq);
                o.put_u32(*timeout_ms);
            }
            Request::PeerMark { key, seq } => {
                o.put_u64(*key);
                o.put_u64(*seq);
            }
            Request::EngineOpenInbound {
                buffer,
                offset,
                size,
                sender,
            } => {
                o.put_u64(*buffer);
                o.put_u64(*offset);
                o.put_u64(*size);
                put_bounded(&mut o, sender);
            }
            Request::EngineOpenOutbound {
                destination,
                descriptor,
                lane,
            } => {
                put_bounded(&mut o, destination);
                put_bounded(&mut o, descriptor);
                o.put_u32(lane.0);
            }
            Request::EngineWrite {
                outbound,
                src,
                src_offset,
                size,
                dst_offset,
                seq,
            } => {
                o.reserve(ENGINE_WRITE_SIZE);
                o.put_u32(outbound.0);
                src.encode_into(&mut o);
                o.put_u64(*src_offset);
                o.put_u64(*size);
                o.put_u64(*dst_offset);
                o.put_u32(*seq);
            }
            Request::EngineWait {
                lane,
                seq,
                timeout_ms,
                size,
            } => {
                o.put_u32(lane.0);
                o.put_u32(*seq);
                o.put_u32(*timeout_ms);
                o.put_u64(*size);
            }
            Request::EngineClose { kind, id } => {
                o.put_u8(kind.byte());
                o.put_u32(*id);
            }
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                tensor.encode_into(&mut o);
                o.put_u64(*offset);
                o.put_u64(*size);
                o.put_u8(*value);
            }
            Request::CopyTensorTo {
                src,
                dst,
                size,
                mark,
                endpoint,
            } => {
                src.encode_into(&mut o);
                dst.encode_into(&mut o);
                o.put_u64(*size);
                if let Some((key, seq)) = mark {
                    o.put_u64(*key);
                    o.put_u64(*seq);
                }
                o.put_u32(endpoint.len() as u32);
                o.extend_from_slice(endpoint.as_bytes());
            }
        }
        o
    }

    /// Encodes the whole frame (header and payload).
    pub fn encode_frame(&self) -> Vec<u8> {
        super::frame::encode_request(self.command(), &self.encode_payload())
    }
}
