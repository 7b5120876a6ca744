//! Validation of everything a client sends before it reaches memory or
//! compute. Every refusal is an [`RpcError::Refused`](crate::RpcError)
//! naming the check.

pub mod cpu_types;
pub mod graph;
pub mod op_shapes;
pub mod op_shapes_ext;
mod op_shapes_misc;
mod op_shapes_more;
mod op_shapes_train;
mod op_shapes_vision;
pub mod ops;
pub mod tensor;
pub mod types;

pub use graph::{
    GraphLimits, ValidatedGraph, check_index_bytes, check_index_node, index_slot, index_tensor,
    validate_graph,
};
pub use tensor::{BufferLookup, CheckedTensor, Region, check_shape, check_tensor, nbytes};
pub use types::{TypeInfo, type_info};
