//! ggml-rpc (llama.cpp RPC, protocol 7.0.0) compatible protocol, server and
//! client, hardened, with direct server-to-server tensor copies over TCP.
//!
//! - [`protocol`]: pure codecs (framing, the 296-byte tensor record, every
//!   request and response, GRAPH_COMPUTE payloads, HELLO and the extension).
//! - [`validate`]: checks applied before anything reaches memory or compute.
//! - [`server`]: a threaded TCP server with a shared buffer registry.
//! - [`client`]: a client for every command, plus the stage-boundary copy
//!   that goes direct (COPY_TENSOR_TO) or through the client (hub).
//!
//! # Compatibility and the extension
//! The server answers HELLO with upstream's 7.0.0 and all-zero `conn_caps`,
//! so upstream 7.0 clients accept it. The extension lives at command bytes
//! 0xC0 (EXT_QUERY), 0xC1 (COPY_TENSOR_TO) and 0xC2 (PEER_BARRIER), outside
//! upstream's range; only this crate's client sends them. It asks EXT_QUERY
//! once, right after HELLO on its main connection: an upstream server closes
//! the connection (unknown command), and the client reconnects before any
//! state exists and never sends an extension command there again. A direct
//! copy is attempted only when both servers answered EXT_QUERY.
//!
//! With an engine (feature `engine`, `transfer-rpc-server --engine tcp`),
//! 0xC3..=0xC8 (ENGINE_*) let a source server write a stage boundary
//! straight into the destination's buffer with a write-with-immediate and
//! answer at once; the destination waits for the immediate (see
//! [`protocol::engine`] and `engine_link`).
//!
//! # Features
//! - default: graph compute is refused ([`server::RefusingBackend`]); no
//!   native code is built.
//! - `ggml`: `server::GgmlCpuBackend` runs graphs on ggml's CPU backend
//!   (vendored llama.cpp; needs cmake and libclang; ~8 min of build on 2
//!   busy cores).
//! - `engine`: the server owns a TransferEngine (libfabric backend, loaded
//!   at run time) and serves ENGINE_* (`engine_link`).
//! - `upstream-rpc`: tests against ggml's own RPC server; build with
//!   `GGML_RPC=ON GGML_RPC_RDMA=OFF` in a separate target dir.

pub mod client;
#[cfg(feature = "engine")]
pub mod engine_link;
pub mod error;
pub mod fuzz;
pub mod hash;
pub mod io;
#[cfg(feature = "ggml")]
pub mod pipeline;
pub mod protocol;
pub mod server;
#[cfg(feature = "upstream-rpc")]
pub mod upstream;
pub mod validate;

pub use error::{Result, RpcError};
