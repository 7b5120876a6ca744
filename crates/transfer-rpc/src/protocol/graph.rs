//! GRAPH_COMPUTE payload:
//! `device u32 | n_nodes u32 | node ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors]`.

use super::tensor::{RPC_TENSOR_SIZE, RpcTensor};
use super::wire::{Reader, WireWrite};
use crate::error::{Result, RpcError};

/// A parsed (not yet validated) GRAPH_COMPUTE payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GraphPayload {
    /// Device index.
    pub device: u32,
    /// Node ids in execution order.
    pub nodes: Vec<u64>,
    /// De-duplicated closure of the nodes (sources and view sources included).
    pub tensors: Vec<RpcTensor>,
}

const CALL: &str = "GRAPH_COMPUTE payload";

impl GraphPayload {
    /// Parses a payload. Both counts are checked against the payload length
    /// before anything is allocated, and the payload must end exactly after
    /// the last tensor.
    pub fn decode(payload: &[u8]) -> Result<GraphPayload> {
        let mut r = Reader::new(payload, CALL);
        let device = r.u32()?;
        let n_nodes = r.u32()? as usize;
        let node_bytes = n_nodes
            .checked_mul(8)
            .filter(|&b| b <= r.remaining())
            .ok_or_else(|| {
                RpcError::malformed(
                    CALL,
                    format!(
                        "n_nodes {n_nodes} needs more than the {} bytes left",
                        r.remaining()
                    ),
                )
            })?;
        let node_raw = r.bytes(node_bytes)?;
        let n_tensors = r.u32()? as usize;
        let tensor_bytes = n_tensors.checked_mul(RPC_TENSOR_SIZE);
        if tensor_bytes != Some(r.remaining()) {
            return Err(RpcError::malformed(
                CALL,
                format!(
                    "n_tensors {n_tensors} does not match the {} bytes left",
                    r.remaining()
                ),
            ));
        }
        let nodes = node_raw
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect();
        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            tensors.push(RpcTensor::read(&mut r)?);
        }
        r.finish()?;
        Ok(GraphPayload {
            device,
            nodes,
            tensors,
        })
    }

    /// Encodes the payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(12 + self.nodes.len() * 8 + self.tensors.len() * RPC_TENSOR_SIZE);
        out.put_u32(self.device);
        out.put_u32(self.nodes.len() as u32);
        for &n in &self.nodes {
            out.put_u64(n);
        }
        out.put_u32(self.tensors.len() as u32);
        for t in &self.tensors {
            t.encode_into(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_and_round_trip() {
        let t = RpcTensor {
            id: 5,
            ..RpcTensor::default()
        };
        let g = GraphPayload {
            device: 2,
            nodes: vec![5],
            tensors: vec![t.clone()],
        };
        let b = g.encode();
        assert_eq!(b.len(), 4 + 4 + 8 + 4 + 296);
        assert_eq!(&b[..4], &[2, 0, 0, 0]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[8..16], &5u64.to_le_bytes());
        assert_eq!(&b[16..20], &[1, 0, 0, 0]);
        assert_eq!(&b[20..], &t.encode()[..]);
        assert_eq!(GraphPayload::decode(&b).ok(), Some(g));
    }

    #[test]
    fn counts_checked_before_allocation() {
        // n_nodes = u32::MAX with no bytes behind it.
        let mut b = vec![0, 0, 0, 0];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(GraphPayload::decode(&b).is_err());
        // n_tensors larger than what follows.
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(GraphPayload::decode(&b).is_err());
        // trailing garbage.
        let mut b = GraphPayload::default().encode();
        b.push(1);
        assert!(GraphPayload::decode(&b).is_err());
    }
}
