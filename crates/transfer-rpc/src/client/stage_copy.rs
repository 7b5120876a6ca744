//! The stage-boundary copy: direct (COPY_TENSOR_TO) when the source server
//! supports it and P2P is enabled, else through this process (hub).

use super::connection::Client;
use crate::error::{Result, RpcError};
use crate::protocol::RpcTensor;
use crate::validate::{check_shape, type_info};

/// Which path a copy took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// The source server wrote straight to the destination server.
    Direct,
    /// GET_TENSOR from the source, SET_TENSOR to the destination.
    Hub,
}

/// Copies all of `src_tensor` (on `src`) into `dst_tensor` (on `dst`).
///
/// Tries COPY_TENSOR_TO when `src`'s config allows P2P and both servers
/// serve the extension (known from connect time, so an upstream server is
/// never sent an extension command); any recoverable failure (answer 0)
/// falls back to the hub.
/// When this returns, the data is in place on the destination: the direct
/// path has passed PEER_BARRIER, and the hub path's SET_TENSOR precedes any
/// later command on `dst`'s connection.
pub fn copy_between(
    src: &mut Client,
    src_tensor: &RpcTensor,
    dst: &mut Client,
    dst_tensor: &RpcTensor,
) -> Result<CopyPath> {
    let (_, size) = check_shape("copy_between", src_tensor)?;
    if type_info(dst_tensor.ty).is_none() {
        return Err(RpcError::refused(
            "copy_between",
            "invalid destination type",
        ));
    }
    if src.config().p2p && src.supports_copy_to() && dst.supports_peer_barrier() {
        let endpoint = dst.endpoint().to_owned();
        if src.copy_tensor_to(src_tensor, dst_tensor, size, &endpoint)? {
            return Ok(CopyPath::Direct);
        }
    }
    let data = src.get_tensor(src_tensor, 0, size)?;
    dst.set_tensor(dst_tensor, 0, &data)?;
    Ok(CopyPath::Hub)
}
