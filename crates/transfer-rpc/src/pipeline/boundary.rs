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
//! for b in boundaries: b.finish_step(stage b, stage b+1)
//! ```
//!
//! - `Hub`: `after_src_compute` reads the output of stage s (GET_TENSOR,
//!   which waits for its compute) and writes it into stage s+1
//!   (SET_TENSOR).
//! - `Direct`: `after_src_compute` sends COPY_TENSOR_TO to stage s's server,
//!   which answers once the data has landed on s+1 (PEER_BARRIER), so the
//!   coordinator waits for it.
//! - An `Engine` path (server-to-server write-with-immediate, being built in
//!   `engine_link`) slots in as a third [`BoundaryPath`] variant: it posts
//!   the write on the source in `after_src_compute` and a wait on the
//!   destination in `before_dst_compute`, both without a response, so the
//!   coordinator never waits between stages; [`Boundary::finish_step`]
//!   collects their answers once the step's logits are read.
//!   [`Boundary::negotiate`] is where it is chosen; until then
//!   `--arm engine` falls back to direct, then hub, each fallback recorded
//!   with its reason.

use std::fmt;

use super::stage::{Stage, stage_error, tensor_bytes};
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;

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
}

impl BoundaryPath {
    /// The arm this path implements.
    pub fn arm(self) -> Arm {
        match self {
            BoundaryPath::Hub => Arm::Hub,
            BoundaryPath::Direct => Arm::Direct,
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
    /// Steps on which a direct copy was refused by the servers (answer 0)
    /// and the data went through the hub instead.
    pub runtime_fallbacks: u64,
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

/// Why the engine path is not used between two stages. The probe is real
/// (EXT_QUERY at connect time says whether a server serves ENGINE_*); the
/// path itself is integrated by the engine work (`engine_link` and
/// `client::open_engine_boundary`): it adds a `BoundaryPath::Engine` variant
/// chosen here when both servers offer it, posts ENGINE_WRITE in
/// [`Boundary::after_src_compute`], ENGINE_WAIT in
/// [`Boundary::before_dst_compute`] and collects both answers in
/// [`Boundary::finish_step`].
fn engine_unavailable(src: &Stage, dst: &Stage) -> Option<String> {
    for s in [src, dst] {
        if !s.client.supports_engine() {
            return Some(format!("{} does not serve ENGINE_*", s.endpoint));
        }
    }
    Some("both servers serve ENGINE_*, but this coordinator has no engine path yet".into())
}

impl Boundary {
    /// Chooses the path for the boundary between `src` and `dst` for the
    /// requested arm, falling back engine → direct → hub; every fallback is
    /// returned.
    pub fn negotiate(
        requested: Arm,
        src: &Stage,
        dst: &Stage,
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
        let mut want = requested;
        if want == Arm::Engine {
            if let Some(reason) = engine_unavailable(src, dst) {
                fallbacks.push(Fallback {
                    boundary: index,
                    from: Arm::Engine,
                    to: Arm::Direct,
                    reason,
                });
                want = Arm::Direct;
            }
        }
        let path = match want {
            Arm::Hub => BoundaryPath::Hub,
            Arm::Direct | Arm::Engine => match direct_unavailable(src, dst) {
                None => BoundaryPath::Direct,
                Some(reason) => {
                    fallbacks.push(Fallback {
                        boundary: index,
                        from: Arm::Direct,
                        to: Arm::Hub,
                        reason,
                    });
                    BoundaryPath::Hub
                }
            },
        };
        Ok((
            Boundary {
                index,
                path,
                src: s,
                dst: d,
                bytes,
                runtime_fallbacks: 0,
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
            BoundaryPath::Direct => {
                // The source server answers after its compute (its
                // connection is served in order) and after PEER_BARRIER on
                // the destination; 0 means a recoverable failure (peer
                // unreachable or refusing): this step goes through the hub.
                let endpoint = dst.client.endpoint().to_owned();
                let landed = src
                    .client
                    .copy_tensor_to(&self.src, &self.dst, self.bytes, &endpoint)
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
    /// PEER_BARRIER); an engine path posts its wait here.
    pub fn before_dst_compute(&mut self, _src: &mut Stage, _dst: &mut Stage) -> Result<()> {
        match self.path {
            BoundaryPath::Hub | BoundaryPath::Direct => Ok(()),
        }
    }

    /// Hook run once per step after the last stage's output was read: a
    /// path that posted commands without waiting collects their answers
    /// here. Hub and direct waited already.
    pub fn finish_step(&mut self, _src: &mut Stage, _dst: &mut Stage) -> Result<()> {
        match self.path {
            BoundaryPath::Hub | BoundaryPath::Direct => Ok(()),
        }
    }
}
