//! Client side of the ENGINE_* extension, and the posted (pipelined) form
//! of ENGINE_WRITE / ENGINE_WAIT.
//!
//! A coordinator opens a lane once per stage boundary:
//! 1. `engine_info` on both servers (the address bytes),
//! 2. `engine_open_inbound` on the destination with the source's address,
//! 3. `engine_open_outbound` on the source with the destination's address,
//!    the descriptor and the lane (`None` = the pair cannot talk: fall back).
//!
//! Then, per step, `post_engine_write` to the source, `post_engine_wait`
//! (followed by GRAPH_RECOMPUTE, which has no answer) to the destination,
//! and one `collect_posted` per server at the end of the step. Commands
//! without a response (SET_TENSOR, GRAPH_RECOMPUTE) are never waited for
//! anyway, so a whole step is sent to every server before anything is read.

use super::connection::Client;
use crate::error::{Result, RpcError};
use crate::protocol::engine::{BACKEND_NONE, CloseKind, LaneId, OutboundId};
use crate::protocol::{Request, Response, RpcTensor};

/// What ENGINE_INFO answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Backend tag (`protocol::engine::BACKEND_*`).
    pub backend: u8,
    /// The engine's `EngineAddress` bytes (empty without an engine).
    pub address: Vec<u8>,
}

impl EngineInfo {
    /// True when the server has an engine.
    pub fn has_engine(&self) -> bool {
        self.backend != BACKEND_NONE && !self.address.is_empty()
    }
}

/// An inbound lane opened on a destination server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundLane {
    /// The lane (hand it to the source's ENGINE_OPEN_OUTBOUND).
    pub lane: LaneId,
    /// The `RemoteRegion` bytes of the range (same).
    pub descriptor: Vec<u8>,
}

/// Arguments of one ENGINE_WRITE.
#[derive(Debug, Clone, Copy)]
pub struct EngineWrite<'a> {
    /// Outbound target on the source server.
    pub outbound: OutboundId,
    /// Source tensor on the source server.
    pub src: &'a RpcTensor,
    /// Offset into the source tensor.
    pub src_offset: u64,
    /// Bytes to write.
    pub size: u64,
    /// Offset into the destination's inbound range.
    pub dst_offset: u64,
    /// Sequence number; the destination waits for the same one.
    pub seq: u32,
}

impl EngineWrite<'_> {
    fn request(&self) -> Request<'static> {
        Request::EngineWrite {
            outbound: self.outbound,
            src: Box::new(self.src.clone()),
            src_offset: self.src_offset,
            size: self.size,
            dst_offset: self.dst_offset,
            seq: self.seq,
        }
    }
}

impl Client {
    fn engine_gate(&self, call: &'static str) -> Result<()> {
        if self.engine_allowed() {
            Ok(())
        } else {
            Err(RpcError::ExtensionUnsupported { call })
        }
    }

    /// ENGINE_INFO: the server's engine backend and address.
    pub fn engine_info(&mut self) -> Result<EngineInfo> {
        self.engine_gate("ENGINE_INFO")?;
        match self.call(&Request::EngineInfo, 0)? {
            Response::EngineInfo { backend, address } => Ok(EngineInfo { backend, address }),
            _ => Err(RpcError::malformed("ENGINE_INFO", "unexpected response")),
        }
    }

    /// ENGINE_OPEN_INBOUND: lets the engine at `sender` (address bytes) write
    /// `size` bytes at `offset` of `buffer` on this (destination) server.
    /// `None` when the server refused (logged there).
    pub fn engine_open_inbound(
        &mut self,
        buffer: u64,
        offset: u64,
        size: u64,
        sender: &[u8],
    ) -> Result<Option<InboundLane>> {
        self.engine_gate("ENGINE_OPEN_INBOUND")?;
        let req = Request::EngineOpenInbound {
            buffer,
            offset,
            size,
            sender,
        };
        match self.call(&req, 0)? {
            Response::EngineInbound { ok: 0, .. } => Ok(None),
            Response::EngineInbound {
                lane, descriptor, ..
            } => Ok(Some(InboundLane { lane, descriptor })),
            _ => Err(RpcError::malformed(
                "ENGINE_OPEN_INBOUND",
                "unexpected response",
            )),
        }
    }

    /// ENGINE_OPEN_OUTBOUND on the source server: resolves the destination
    /// engine and region once and checks that the pair can talk. `None`
    /// when it cannot (fall back to another path).
    pub fn engine_open_outbound(
        &mut self,
        destination: &[u8],
        descriptor: &[u8],
        lane: LaneId,
    ) -> Result<Option<OutboundId>> {
        self.engine_gate("ENGINE_OPEN_OUTBOUND")?;
        let req = Request::EngineOpenOutbound {
            destination,
            descriptor,
            lane,
        };
        match self.call(&req, 0)? {
            Response::EngineOutbound { ok: 0, .. } => Ok(None),
            Response::EngineOutbound { id, .. } => Ok(Some(id)),
            _ => Err(RpcError::malformed(
                "ENGINE_OPEN_OUTBOUND",
                "unexpected response",
            )),
        }
    }

    /// ENGINE_WRITE: `true` once the write is posted (not completed); `false`
    /// when it was refused or an earlier write of this session failed.
    pub fn engine_write(&mut self, w: &EngineWrite<'_>) -> Result<bool> {
        self.engine_gate("ENGINE_WRITE")?;
        self.call_status(&w.request())
    }

    /// ENGINE_WAIT: `true` when every immediate of write `seq` (of `size`
    /// bytes) on `lane` arrived within `timeout_ms` (capped by the server).
    pub fn engine_wait(
        &mut self,
        lane: LaneId,
        seq: u32,
        size: u64,
        timeout_ms: u32,
    ) -> Result<bool> {
        self.engine_gate("ENGINE_WAIT")?;
        self.call_status(&Request::EngineWait {
            lane,
            seq,
            timeout_ms,
            size,
        })
    }

    /// ENGINE_CLOSE: closes an inbound lane or an outbound target of this
    /// session; `false` when the id was unknown.
    pub fn engine_close(&mut self, kind: CloseKind, id: u32) -> Result<bool> {
        self.engine_gate("ENGINE_CLOSE")?;
        self.call_status(&Request::EngineClose { kind, id })
    }

    /// ENGINE_WRITE without reading the answer (see [`Client::collect_posted`]).
    pub fn post_engine_write(&mut self, w: &EngineWrite<'_>) -> Result<()> {
        self.engine_gate("ENGINE_WRITE")?;
        self.post_status(&w.request())
    }

    /// ENGINE_WAIT without reading the answer (see [`Client::collect_posted`]).
    pub fn post_engine_wait(
        &mut self,
        lane: LaneId,
        seq: u32,
        size: u64,
        timeout_ms: u32,
    ) -> Result<()> {
        self.engine_gate("ENGINE_WAIT")?;
        self.post_status(&Request::EngineWait {
            lane,
            seq,
            timeout_ms,
            size,
        })
    }
}

/// A stage boundary opened between two servers: the source writes with
/// `outbound`, the destination waits on `lane`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineBoundary {
    /// Inbound lane on the destination.
    pub lane: LaneId,
    /// Outbound target on the source.
    pub outbound: OutboundId,
    /// Bytes of the destination range.
    pub size: u64,
}

/// Opens a boundary from the server of `src` into `size` bytes at
/// `dst_offset` of buffer `dst_buffer` on the server of `dst`: ENGINE_INFO
/// on both, ENGINE_OPEN_INBOUND on `dst`, ENGINE_OPEN_OUTBOUND on `src`.
/// `Ok(None)` when either server has no engine or the pair cannot talk
/// (use another path); a half-open lane is closed again.
pub fn open_engine_boundary(
    src: &mut Client,
    dst: &mut Client,
    dst_buffer: u64,
    dst_offset: u64,
    size: u64,
) -> Result<Option<EngineBoundary>> {
    if !src.supports_engine() || !dst.supports_engine() {
        return Ok(None);
    }
    let (from, to) = (src.engine_info()?, dst.engine_info()?);
    if !from.has_engine() || !to.has_engine() || from.backend != to.backend {
        return Ok(None);
    }
    let Some(inbound) = dst.engine_open_inbound(dst_buffer, dst_offset, size, &from.address)?
    else {
        return Ok(None);
    };
    match src.engine_open_outbound(&to.address, &inbound.descriptor, inbound.lane)? {
        Some(outbound) => Ok(Some(EngineBoundary {
            lane: inbound.lane,
            outbound,
            size,
        })),
        None => {
            dst.engine_close(CloseKind::Inbound, inbound.lane.0)?;
            Ok(None)
        }
    }
}
