//! Validation of everything a client sends before it reaches memory or
//! compute. Every refusal is an [`RpcError::Refused`](crate::RpcError)
//! naming the check.

pub mod cpu_types;
pub mod graph;
pub mod op_shapes;
pub mod ops;
pub mod tensor;
pub mod types;

pub use graph::{
    GraphLimits, ValidatedGraph, check_index_bytes, check_index_node, index_slot, index_tensor,
    validate_graph,
};
pub use tensor::{BufferLookup, CheckedTensor, Region, check_shape, check_tensor, nbytes};
pub use types::{TypeInfo, type_info};
