//! The ggml-rpc wire protocol (7.0.0) and this crate's extension, as pure
//! codecs: no I/O, every size checked before allocation.

pub mod command;
pub mod engine;
pub mod frame;
pub mod graph;
pub mod hello;
pub mod request;
pub mod response;
pub mod tensor;
pub mod wire;

pub use command::Command;
pub use engine::{CloseKind, LaneId, OutboundId, lane_imm};
pub use frame::{Limits, encode_request, encode_response, split_request};
pub use graph::GraphPayload;
pub use hello::{ExtInfo, HelloRequest, HelloResponse};
pub use request::Request;
pub use response::Response;
pub use tensor::{RPC_TENSOR_SIZE, RpcTensor};
