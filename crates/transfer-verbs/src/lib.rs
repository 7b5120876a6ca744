//! ibverbs backend (ConnectX, RoCE) for transfer-core
//!
//! Not implemented yet: this crate is an empty placeholder; its issue is open.
//! Nothing here pretends to work.
