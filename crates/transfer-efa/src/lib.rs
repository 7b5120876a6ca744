//! libfabric backend (AWS EFA, tcp, shm, udp, verbs providers) for transfer-core
//!
//! Work in progress.
