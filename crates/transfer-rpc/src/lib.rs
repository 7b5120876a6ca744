//! ggml-rpc (llama.cpp RPC, protocol 7.0.0) compatible protocol, server and
//! client, hardened, with direct server-to-server tensor copies over TCP.
//!
//! - [`protocol`]: pure codecs (framing, the 296-byte tensor record, every
//!   request and response, GRAPH_COMPUTE payloads, HELLO and the extension).
//! - [`validate`]: checks applied before anything reaches memory or compute.
//! - [`server`]: a threaded TCP server with a shared buffer registry.
//! - [`client`]: a client for every command, plus the stage-boundary copy
//!   that goes direct (COPY_TENSOR_TO) or through the client (hub).

pub mod client;
pub mod error;
pub mod hash;
pub mod io;
pub mod protocol;
pub mod server;
pub mod validate;

pub use error::{Result, RpcError};
