//! How the hidden state crosses each server-to-server stage boundary.
//!
//! Per step the coordinator drives every stage in order:
//!
//! ```text
//! for s in stages:
//!     send s's step inputs
//!     if s > 0: boundary[s-1].before_dst_compute(stage s-1, stage s)
//!     stage s: GRAPH_RECOMPUTE
//!     if s < last: boundary[s].after_src_compute(stage s, stage s+1)
//! read the logits from the last stage
//! collect the answers the engine path posted (Pipeline::step)
//! ```
//!
//! - `Hub`: `after_src_compute` reads the output of stage s (GET_TENSOR,
//!   which waits for its compute) and writes it into stage s+1
//!   (SET_TENSOR).
//! - `Direct`: `after_src_compute` sends COPY_TENSOR_TO to stage s's server,
//!   which answers once the data has landed on s+1 (PEER_BARRIER), so the
//!   coordinator waits for it.
//! - `Engine`: the source server writes the hidden state into the
//!   destination's registered input with a write-with-immediate
//!   (`engine_link` on the servers). `after_src_compute` posts ENGINE_WRITE
//!   on the source and `before_dst_compute` posts ENGINE_WAIT on the
//!   destination, both without reading the answer, so the coordinator never
//!   waits between stages and no source thread is blocked for the transfer;
//!   the pipeline collects the answers once the step's logits are read, and
//!   a failed engine step is redone from that boundary on
//!   [`Boundary::fallback_path`].
//!
//! [`Boundary::negotiate`] chooses the path: `--arm engine` falls back to
//! direct, then hub, when a pair cannot do it, each fallback recorded with
//! its reason.

use std::fmt;

use super::stage::{Stage, stage_error, tensor_bytes};
use crate::client::{EngineBoundary, EngineWrite, open_engine_boundary};
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;
use crate::protocol::engine::CloseKind;

/// The boundary path a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arm {
    /// Through the coordinator: GET_TENSOR then SET_TENSOR.
    Hub,
    /// Server to server over TCP (COPY_TENSOR_TO).
    Direct,
    /// Server to server over a TransferEngine (write with immediate).
    Engine,
}

impl Arm {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Hub => "hub",
            Arm::Direct => "direct",
            Arm::Engine => "engine",
        }
    }

    /// Parses `hub`, `direct` or `engine`.
    pub fn parse(s: &str) -> Result<Arm> {
        match s {
            "hub" => Ok(Arm::Hub),
            "direct" => Ok(Arm::Direct),
            "engine" => Ok(Arm::Engine),
            other => Err(RpcError::refused(
                "--arm",
                format!("{other:?} (expected hub, direct or engine)"),
            )),
        }
    }
}

impl fmt::Display for Arm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A boundary that could not use the requested path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// Boundary index (between stage `boundary` and `boundary + 1`).
    pub boundary: usize,
    /// What was asked for.
    pub from: Arm,
    /// What is used instead.
    pub to: Arm,
    /// Why.
    pub reason: String,
}

/// The path a boundary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundaryPath {
    /// GET_TENSOR from the source, SET_TENSOR to the destination.
    Hub,
    /// COPY_TENSOR_TO on the source's connection.
    Direct,
    /// ENGINE_WRITE posted on the source, ENGINE_WAIT on the destination.
    Engine(EngineBoundary),
}

impl BoundaryPath {
    /// The arm this path implements.
    pub fn arm(self) -> Arm {
        match self {
            BoundaryPath::Hub => Arm::Hub,
            BoundaryPath::Direct => Arm::Direct,
            BoundaryPath::Engine(_) => Arm::Engine,
        }
    }
}

/// One stage boundary: the source stage's output and the destination
/// stage's hidden-state input.
#[derive(Debug, Clone)]
pub struct Boundary {
    /// Boundary index: between stage `index` and `index + 1`.
    pub index: usize,
    /// The path in use.
    pub path: BoundaryPath,
    /// Source tensor (output of stage `index`).
    pub src: RpcTensor,
    /// Destination tensor (hidden input of stage `index + 1`).
    pub dst: RpcTensor,
    /// Bytes per step.
    pub bytes: u64,
    /// What this boundary switches to when an engine step fails at run
    /// time (direct when both servers serve it, else hub).
    pub fallback_path: BoundaryPath,
    /// Sequence number of the last engine write (the destination waits for
    /// the same one).
    pub seq: u32,
    /// How long the destination waits for an engine write's immediates.
    pub engine_wait_ms: u32,
    /// Steps on which a direct copy was refused by the servers (answer 0)
    /// and the data went through the hub instead, or an engine step failed
    /// and the boundary switched to [`Boundary::fallback_path`].
    pub runtime_fallbacks: u64,
    /// Why the engine path was given up at run time, if it was.
    pub last_failure: Option<String>,
}

/// Why a server-to-server TCP copy is not possible between two stages,
/// or `None` when it is.
fn direct_unavailable(src: &Stage, dst: &Stage) -> Option<String> {
    if !src.client.config().p2p {
        return Some("p2p disabled in the client configuration".into());
    }
    if !src.client.supports_copy_to() {
        return Some(format!("{} does not serve COPY_TENSOR_TO", src.endpoint));
    }
    if !dst.client.supports_peer_barrier() {
        return Some(format!("{} does not serve PEER_BARRIER", dst.endpoint));
    }
    None
}

/// Opens the engine path between two stages: ENGINE_INFO on both servers,
/// an inbound lane over the destination's hidden-state input, an outbound
/// target on the source. `Err(reason)` when the pair cannot do it (a
/// server without ENGINE_*, engines of different backends, or engines that
/// cannot reach each other); a half-open lane is closed again.
fn open_engine(
    src: &mut Stage,
    dst: &mut Stage,
    dst_tensor: &RpcTensor,
    bytes: u64,
) -> Result<std::result::Result<EngineBoundary, String>> {
    for s in [&*src, &*dst] {
        if !s.client.supports_engine() {
            return Ok(Err(format!("{} does not serve ENGINE_*", s.endpoint)));
        }
    }
    let Some(buffer) = dst.buffers.iter().find(|b| b.handle == dst_tensor.buffer) else {
        return Err(stage_error(
            dst.index,
            &dst.endpoint,
            RpcError::refused(
                "engine boundary",
                "hidden-state input outside the stage's buffers",
            ),
        ));
    };
    let offset = dst_tensor.data.checked_sub(buffer.base).ok_or_else(|| {
        stage_error(
            dst.index,
            &dst.endpoint,
            RpcError::refused(
                "engine boundary",
                "hidden-state input below its buffer's base",
            ),
        )
    })?;
    let opened = open_engine_boundary(
        &mut src.client,
        &mut dst.client,
        buffer.handle,
        offset,
        bytes,
    )
    .map_err(|e| stage_error(src.index, &src.endpoint, e))?;
    Ok(opened.ok_or_else(|| {
        format!(
            "the engines of {} and {} cannot reach each other (different backends or unreachable)",
            src.endpoint, dst.endpoint
        )
    }))
}

impl Boundary {
    /// Chooses the path for the boundary between `src` and `dst` for the
    /// requested arm, falling back engine → direct → hub; every fallback is
    /// returned.
    pub fn negotiate(
        requested: Arm,
        src: &mut Stage,
        dst: &mut Stage,
        engine_wait_ms: u32,
    ) -> Result<(Boundary, Vec<Fallback>)> {
        let index = src.index;
        let (s, d) = (src.graph.output.clone(), dst.graph.hidden_in.clone());
        let bytes = tensor_bytes("boundary source", &s)
            .map_err(|e| stage_error(src.index, &src.endpoint, e))?;
        let dst_bytes = tensor_bytes("boundary destination", &d)
            .map_err(|e| stage_error(dst.index, &dst.endpoint, e))?;
        if bytes != dst_bytes || s.ty != d.ty {
            return Err(stage_error(
                dst.index,
                &dst.endpoint,
                RpcError::refused(
                    "boundary",
                    format!("source has {bytes} bytes, destination {dst_bytes}"),
                ),
            ));
        }
        let mut fallbacks = Vec::new();
        let mut engine = None;
        if requested == Arm::Engine {
            match open_engine(src, dst, &d, bytes)? {
                Ok(e) => engine = Some(e),
                Err(reason) => fallbacks.push(Fallback {
                    boundary: index,
                    from: Arm::Engine,
                    to: Arm::Direct,
                    reason,
                }),
            }
        }
        // Where a server-to-server path goes when it cannot be used: now
        // (recorded as a fallback), or when an engine step fails at run
        // time (recorded then).
        let direct_or_hub = match (requested, direct_unavailable(src, dst)) {
            (Arm::Hub, _) => BoundaryPath::Hub,
            (_, None) => BoundaryPath::Direct,
            (_, Some(reason)) => {
                if engine.is_none() {
                    fallbacks.push(Fallback {
                        boundary: index,
                        from: Arm::Direct,
                        to: Arm::Hub,
                        reason,
                    });
                }
                BoundaryPath::Hub
            }
        };
        let path = engine.map_or(direct_or_hub, BoundaryPath::Engine);
        Ok((
            Boundary {
                index,
                path,
                fallback_path: direct_or_hub,
                src: s,
                dst: d,
                bytes,
                seq: 0,
                engine_wait_ms,
                runtime_fallbacks: 0,
                last_failure: None,
            },
            fallbacks,
        ))
    }

    /// GET_TENSOR from the source, SET_TENSOR to the destination; each
    /// failure names its own stage.
    fn through_hub(&self, src: &mut Stage, dst: &mut Stage) -> Result<()> {
        let data = src
            .client
            .get_tensor(&self.src, 0, self.bytes)
            .map_err(|e| stage_error(src.index, &src.endpoint, e))?;
        if data.len() as u64 != self.bytes {
            return Err(stage_error(
                src.index,
                &src.endpoint,
                RpcError::malformed("boundary GET_TENSOR", "short hidden state"),
            ));
        }
        dst.client
            .set_tensor(&self.dst, 0, &data)
            .map_err(|e| stage_error(dst.index, &dst.endpoint, e))
    }

    /// Hook run right after the source stage's compute was sent.
    pub fn after_src_compute(&mut self, src: &mut Stage, dst: &mut Stage) -> Result<()> {
        match self.path {
            BoundaryPath::Hub => self.through_hub(src, dst),
            BoundaryPath::Engine(e) => {
                // Posted: the source server answers once its compute is
                // done and the write is posted; the answer is collected
                // after the step's logits, so the coordinator does not wait
                // here.
                self.seq = self.seq.wrapping_add(1);
                let write = EngineWrite {
                    outbound: e.outbound,
                    src: &self.src,
                    src_offset: 0,
                    size: self.bytes,
                    dst_offset: 0,
                    seq: self.seq,
                };
                src.client
                    .post_engine_write(&write)
                    .map_err(|err| stage_error(src.index, &src.endpoint, err))
            }
            BoundaryPath::Direct => {
                // The source server answers after its compute (its
                // connection is served in order) and after PEER_BARRIER on
                // the destination; 0 means a recoverable failure (peer
                // unreachable or refusing): this step goes through the hub.
                // The source server connects to the destination itself:
                // the address the servers use, not the coordinator's.
                let landed = src
                    .client
                    .copy_tensor_to(&self.src, &self.dst, self.bytes, &dst.peer_endpoint)
                    .map_err(|e| stage_error(src.index, &src.endpoint, e))?;
                if !landed {
                    self.runtime_fallbacks += 1;
                    self.through_hub(src, dst)?;
                }
                Ok(())
            }
        }
    }

    /// Hook run right before the destination stage's compute is sent.
    /// Hub and direct have already placed the data (the destination's
    /// connection is served in order, or the source waited for
    /// PEER_BARRIER); the engine path posts ENGINE_WAIT, so the
    /// destination's connection runs the following GRAPH_RECOMPUTE only
    /// once the write's immediates have arrived.
    pub fn before_dst_compute(&mut self, _src: &mut Stage, dst: &mut Stage) -> Result<()> {
        match self.path {
            BoundaryPath::Hub | BoundaryPath::Direct => Ok(()),
            BoundaryPath::Engine(e) => dst
                .client
                .post_engine_wait(e.lane, self.seq, self.bytes, self.engine_wait_ms)
                .map_err(|err| stage_error(dst.index, &dst.endpoint, err)),
        }
    }

    /// True when this boundary's step leaves an unread answer on each side:
    /// the ENGINE_WRITE on its source's connection, the ENGINE_WAIT on its
    /// destination's.
    pub fn posts_answers(&self) -> bool {
        matches!(self.path, BoundaryPath::Engine(_))
    }

    /// Gives up the engine path after a failed step: closes the lane and
    /// the outbound target (best effort: the servers also drop them with
    /// the session) and switches to [`Boundary::fallback_path`]. A write
    /// still in flight can only carry this step's source output, which the
    /// fallback re-sends unchanged, and the source server settles it before
    /// its next compute.
    pub fn give_up_engine(
        &mut self,
        src: &mut Stage,
        dst: &mut Stage,
        reason: String,
    ) -> Result<()> {
        if let BoundaryPath::Engine(e) = self.path {
            self.path = self.fallback_path;
            self.runtime_fallbacks += 1;
            self.last_failure = Some(reason);
            src.client
                .engine_close(CloseKind::Outbound, e.outbound.0)
                .map_err(|err| stage_error(src.index, &src.endpoint, err))?;
            dst.client
                .engine_close(CloseKind::Inbound, e.lane.0)
                .map_err(|err| stage_error(dst.index, &dst.endpoint, err))?;
        }
        Ok(())
    }
}
