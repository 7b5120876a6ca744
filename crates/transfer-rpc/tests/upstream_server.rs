//! Our client against ggml's own RPC server (protocol 7.0.0).
//!
//! Run with:
//! `GGML_RPC=ON GGML_RPC_RDMA=OFF CARGO_TARGET_DIR=/work/target-rpc-up \
//!  cargo test -p transfer-rpc --features upstream-rpc --test upstream_server`
#![cfg(feature = "upstream-rpc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn main_placeholder() {}
