//! G independent pipeline groups at once over the same P servers, each with
//! its own connections and thread. Group g places stage i on server
//! `(i + g) mod P` (a ring), so no two groups (for G ≤ P) start on the same
//! server and every server holds a different stage of each group.
//!
//! Connections per server: G from the coordinator, plus (direct arm) up to
//! G peer connections from the previous stage's server (one per source
//! session). Well under the
//! default `max_connections` (64) for the group counts benchmarked; a
//! server at its limit leaves new connections in the accept queue, where a
//! direct copy's handshake times out (`peer_connect_timeout`) and that
//! step goes through the hub (counted as a run-time fallback).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use super::boundary::{Arm, Fallback};
use super::decode::{DecodeOutput, Pipeline, PipelineConfig};
use super::model::LlamaModel;
use crate::client::ClientConfig;
use crate::error::{Result, RpcError};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The GGUF.
    pub model: PathBuf,
    /// The P servers.
    pub endpoints: Vec<String>,
    /// Where the servers reach each other, one per server like `endpoints`
    /// (see [`PipelineConfig::peer_endpoints`]); `None`: `endpoints`.
    pub peer_endpoints: Option<Vec<String>>,
    /// Tensor-split ratios (one per server).
    pub ratios: Vec<f64>,
    /// Requested boundary path.
    pub arm: Arm,
    /// Streams per group.
    pub streams: u32,
    /// Prompts, one per stream (lengths may differ).
    pub prompts: Vec<Vec<i32>>,
    /// Tokens to generate per stream.
    pub tokens: u32,
    /// Number of groups.
    pub groups: usize,
    /// Client settings.
    pub client: ClientConfig,
    /// Keep the logits of every step.
    pub keep_logits: bool,
    /// Engine arm: a destination's wait for a write's immediates.
    pub engine_wait_ms: u32,
}

/// One group's run.
#[derive(Debug, Clone)]
pub struct GroupRun {
    /// Group index.
    pub group: usize,
    /// Server of each stage.
    pub endpoints: Vec<String>,
    /// Path each boundary used.
    pub arms: Vec<Arm>,
    /// Fallbacks chosen when negotiating.
    pub fallbacks: Vec<Fallback>,
    /// Tokens, logits, timings and counters.
    pub output: DecodeOutput,
}

/// All groups' runs.
#[derive(Debug, Clone)]
pub struct GroupsResult {
    /// One per group, in group order.
    pub groups: Vec<GroupRun>,
    /// Wall time from the common start of decoding to the last group's
    /// end, seconds (setup and weight upload excluded).
    pub wall_secs: f64,
}

/// The servers of group `g`: stage i on `endpoints[(i + g) % P]`.
pub fn ring_endpoints(endpoints: &[String], g: usize) -> Vec<String> {
    let p = endpoints.len();
    (0..p).map(|i| endpoints[(i + g) % p].clone()).collect()
}

fn setup(spec: &RunSpec, g: usize, endpoints: Vec<String>) -> Result<Pipeline> {
    let mut model = LlamaModel::open(&spec.model)?;
    // Every stream steps through the positions of the longest prompt.
    let len = spec.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let len = u32::try_from(len).map_err(|_| RpcError::refused("groups", "prompt too long"))?;
    let config = PipelineConfig {
        endpoints,
        // Rotated like the endpoints, so each stays with its server.
        peer_endpoints: spec.peer_endpoints.as_ref().map(|p| ring_endpoints(p, g)),
        ratios: spec.ratios.clone(),
        arm: spec.arm,
        streams: spec.streams,
        ctx: len.saturating_add(spec.tokens),
        client: spec.client.clone(),
        engine_wait_ms: spec.engine_wait_ms,
    };
    Pipeline::new(&mut model, &config)
}

/// Runs every group on its own thread. All groups finish their setup
/// first; decoding then starts at once for all of them.
pub fn run_groups(spec: &RunSpec) -> Result<GroupsResult> {
    if spec.groups == 0 || spec.endpoints.is_empty() {
        return Err(RpcError::refused(
            "groups",
            "need at least one group and one server",
        ));
    }
    if let Some(p) = &spec.peer_endpoints
        && p.len() != spec.endpoints.len()
    {
        return Err(RpcError::refused(
            "groups",
            format!(
                "{} servers but {} peer endpoints",
                spec.endpoints.len(),
                p.len()
            ),
        ));
    }
    std::thread::scope(|scope| {
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<()>)>();
        let mut go = Vec::new();
        let mut handles = Vec::new();
        for g in 0..spec.groups {
            let endpoints = ring_endpoints(&spec.endpoints, g);
            let (go_tx, go_rx) = mpsc::channel::<bool>();
            go.push(go_tx);
            let ready = ready_tx.clone();
            handles.push(scope.spawn(move || -> Result<Option<GroupRun>> {
                let mut pipeline = match setup(spec, g, endpoints.clone()) {
                    Ok(p) => {
                        let _ = ready.send((g, Ok(())));
                        p
                    }
                    Err(e) => {
                        let _ = ready.send((g, Err(e)));
                        return Ok(None);
                    }
                };
                if !go_rx.recv().unwrap_or(false) {
                    return Ok(None);
                }
                let output = pipeline.greedy(&spec.prompts, spec.tokens, spec.keep_logits)?;
                Ok(Some(GroupRun {
                    group: g,
                    endpoints,
                    arms: pipeline.arms_used(),
                    fallbacks: pipeline.fallbacks.clone(),
                    output,
                }))
            }));
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..spec.groups {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    // The error names the stage and server that failed.
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err
                        .get_or_insert(RpcError::refused("group setup", "a group thread ended"));
                }
            }
        }
        let start = Instant::now();
        for tx in &go {
            let _ = tx.send(first_err.is_none());
        }
        let mut runs = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(Some(r))) => runs.push(r),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(RpcError::refused("groups", "a group thread panicked"));
                }
            }
        }
        let wall_secs = start.elapsed().as_secs_f64();
        if let Some(e) = first_err {
            return Err(e);
        }
        runs.sort_by_key(|r| r.group);
        Ok(GroupsResult {
            groups: runs,
            wall_secs,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_rotates_first_server() {
        let eps: Vec<String> = ["a", "b", "c"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(ring_endpoints(&eps, 0), ["a", "b", "c"]);
        assert_eq!(ring_endpoints(&eps, 1), ["b", "c", "a"]);
        assert_eq!(ring_endpoints(&eps, 2), ["c", "a", "b"]);
        assert_eq!(ring_endpoints(&eps, 3), ["a", "b", "c"]);
    }

    #[test]
    fn peer_endpoints_must_name_every_server() {
        let eps: Vec<String> = ["a:1", "b:1"].iter().map(|s| (*s).to_owned()).collect();
        let spec = RunSpec {
            model: PathBuf::from("/nonexistent.gguf"),
            endpoints: eps.clone(),
            peer_endpoints: Some(vec!["x:1".to_owned()]),
            ratios: vec![1.0; 2],
            arm: Arm::Direct,
            streams: 1,
            prompts: vec![vec![1]],
            tokens: 1,
            groups: 1,
            client: ClientConfig::default(),
            keep_logits: false,
            engine_wait_ms: 1,
        };
        // Refused before any connection or file is opened.
        let err = run_groups(&spec).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            err.as_ref()
                .is_err_and(|e| e.contains("2 servers but 1 peer endpoints")),
            "{err:?}"
        );
    }
}
