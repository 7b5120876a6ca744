//! One stage on one server: its connection, its three remote buffers, its
//! weights (uploaded once), its KV cache (kept on the server) and its graph
//! (sent once with GRAPH_COMPUTE, then GRAPH_RECOMPUTE every step).

use std::collections::HashMap;

use super::model::LlamaModel;
use super::remote_alloc::{RemoteBuffer, alloc_remote};
use super::stage_graph::{InputBlock, StageGraph, StageShape, build_stage};
use crate::client::{Client, ClientConfig};
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;
use crate::validate::check_shape;

/// Weights go up in pieces of this size, so the coordinator never holds
/// more than one piece of a large tensor twice.
const UPLOAD_CHUNK: usize = 64 << 20;

/// One pipeline stage.
#[derive(Debug)]
pub struct Stage {
    /// Stage index (0 holds the first layers).
    pub index: usize,
    /// The server's endpoint (where the coordinator connects).
    pub endpoint: String,
    /// Where the other servers reach this one (the destination a direct
    /// copy names): `endpoint` unless the coordinator goes through a relay
    /// that the servers cannot use (the bench's delay proxy).
    pub peer_endpoint: String,
    /// The coordinator's connection to the server.
    pub client: Client,
    /// The serialised graph and its input/output tensors.
    pub graph: StageGraph,
    /// Weights, state and compute buffers.
    pub buffers: [RemoteBuffer; 3],
    /// Layers of this stage.
    pub shape: StageShape,
    block: InputBlock,
    block_with_hidden: InputBlock,
    computed: bool,
}

/// Wraps an error with the stage and server it happened on (once).
pub fn stage_error(stage: usize, server: &str, e: RpcError) -> RpcError {
    match e {
        RpcError::Stage { .. } => e,
        other => RpcError::Stage {
            stage,
            server: server.to_owned(),
            source: Box::new(other),
        },
    }
}

/// Bytes of a tensor record, checked like the server does.
pub fn tensor_bytes(call: &'static str, t: &RpcTensor) -> Result<u64> {
    check_shape(call, t).map(|(_, n)| n)
}

impl Stage {
    /// Connects to `endpoint`, allocates the stage's buffers, uploads its
    /// weights and clears its KV cache. `peer_endpoint` is where the other
    /// servers reach this one.
    pub fn setup(
        index: usize,
        endpoint: &str,
        peer_endpoint: &str,
        config: ClientConfig,
        model: &mut LlamaModel,
        shape: StageShape,
    ) -> Result<Stage> {
        let wrap = |e| stage_error(index, endpoint, e);
        let mut client = Client::connect(endpoint, config).map_err(wrap)?;
        let alignment = client.get_alignment(0).map_err(wrap)?;
        let max_size = client.get_max_size(0).map_err(wrap)?;
        let types: HashMap<String, u32> = model
            .file
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.ty))
            .collect();
        let built =
            build_stage(&model.hparams, &shape, &types, &model.output_name).map_err(wrap)?;
        let sizes = built.sizes(alignment).map_err(wrap)?;
        let mut buffers = [RemoteBuffer {
            handle: 0,
            base: 0,
            size: 0,
        }; 3];
        for (b, size) in buffers.iter_mut().zip(sizes.0) {
            *b = alloc_remote(&mut client, size, max_size).map_err(wrap)?;
        }
        let graph = built.serialize(alignment, &buffers).map_err(wrap)?;
        drop(built);
        let block = graph.input_block(false).map_err(wrap)?;
        let block_with_hidden = graph.input_block(true).map_err(wrap)?;
        let mut stage = Stage {
            index,
            endpoint: endpoint.to_owned(),
            peer_endpoint: peer_endpoint.to_owned(),
            client,
            graph,
            buffers,
            shape,
            block,
            block_with_hidden,
            computed: false,
        };
        stage.upload_weights(model).map_err(wrap)?;
        // KV cells are only read where the mask allows, but zeroed state
        // keeps a bad mask from reading garbage.
        stage
            .client
            .buffer_clear(stage.buffers[1].handle, 0)
            .map_err(wrap)?;
        // Uploads and the clear have no response. The hidden state may
        // later arrive over another connection (a direct copy from the
        // previous stage's server), which is not ordered with this one: a
        // clear still queued here would wipe it (seen as wrong tokens in
        // about half of the direct runs). An answered command proves every
        // earlier one on this connection has been executed.
        stage.client.get_alignment(0).map_err(wrap)?;
        Ok(stage)
    }

    fn upload_weights(&mut self, model: &mut LlamaModel) -> Result<()> {
        let weights = self.graph.weights.clone();
        for (name, t) in &weights {
            let info = model.tensor(name)?.clone();
            let want = tensor_bytes("weight upload", t)?;
            if info.nbytes != want {
                return Err(RpcError::refused(
                    "weight upload",
                    format!(
                        "{name}: {} bytes in the file, {want} in the graph",
                        info.nbytes
                    ),
                ));
            }
            let data = model.file.read_tensor(&info)?;
            let mut offset = 0u64;
            for piece in data.chunks(UPLOAD_CHUNK) {
                self.client.set_tensor(t, offset, piece)?;
                offset += piece.len() as u64;
            }
        }
        Ok(())
    }

    fn wrap(&self, e: RpcError) -> RpcError {
        stage_error(self.index, &self.endpoint, e)
    }

    /// Writes all of tensor `t` (its size checked against `data`).
    pub fn write(&mut self, call: &'static str, t: &RpcTensor, data: &[u8]) -> Result<()> {
        let want = tensor_bytes(call, t).map_err(|e| self.wrap(e))?;
        if data.len() as u64 != want {
            return Err(self.wrap(RpcError::refused(
                call,
                format!("{} bytes for a {want}-byte tensor", data.len()),
            )));
        }
        self.client.set_tensor(t, 0, data).map_err(|e| self.wrap(e))
    }

    /// Writes the step inputs with one SET_TENSOR: positions, KV cells and
    /// the mask, preceded on stage 0 by the hidden state in (the
    /// embeddings). Each part's size is checked against its tensor.
    pub fn set_step_inputs(
        &mut self,
        hidden: Option<&[u8]>,
        pos: &[u8],
        kv_idx: &[u8],
        mask: &[u8],
    ) -> Result<()> {
        let block = if hidden.is_some() {
            &self.block_with_hidden
        } else {
            &self.block
        };
        let mut bytes = vec![0u8; block.len as usize];
        let g = &self.graph;
        let parts = [
            (&g.hidden_in, hidden),
            (&g.pos, Some(pos)),
            (&g.kv_idx, Some(kv_idx)),
            (&g.mask, Some(mask)),
        ];
        for (t, data) in parts {
            let Some(data) = data else { continue };
            let n = tensor_bytes("step inputs", t).map_err(|e| self.wrap(e))?;
            let at = (t.data - block.start) as usize;
            let dst = bytes.get_mut(at..at + n as usize);
            match dst {
                Some(d) if data.len() as u64 == n => d.copy_from_slice(data),
                _ => {
                    return Err(self.wrap(RpcError::refused(
                        "step inputs",
                        format!("{} bytes for the {n}-byte {}", data.len(), t.name_str()),
                    )));
                }
            }
        }
        let t = block.tensor.clone();
        self.client
            .set_tensor(&t, 0, &bytes)
            .map_err(|e| self.wrap(e))
    }

    /// Runs the graph: GRAPH_COMPUTE the first time, GRAPH_RECOMPUTE after.
    /// Neither has a response; the next answered command on this connection
    /// returns after the compute.
    pub fn compute(&mut self) -> Result<()> {
        let r = if self.computed {
            self.client.graph_recompute(0)
        } else {
            let g = self.graph.payload.clone();
            self.client.graph_compute(&g)
        };
        r.map_err(|e| self.wrap(e))?;
        self.computed = true;
        Ok(())
    }

    /// Reads the stage output (hidden state or logits).
    pub fn read_output(&mut self) -> Result<Vec<u8>> {
        let out = self.graph.output.clone();
        let n = tensor_bytes("read output", &out).map_err(|e| self.wrap(e))?;
        let data = self
            .client
            .get_tensor(&out, 0, n)
            .map_err(|e| self.wrap(e))?;
        if data.len() as u64 != n {
            return Err(self.wrap(RpcError::malformed(
                "read output",
                format!("{} bytes for a {n}-byte tensor", data.len()),
            )));
        }
        Ok(data)
    }
}
