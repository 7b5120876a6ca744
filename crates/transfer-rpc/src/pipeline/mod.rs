//! The pipeline coordinator: a llama-architecture model layer-split
//! over RPC servers (being built).
