//! ggml-rpc compatible server and client with direct server-to-server copies
//!
//! Work in progress.
