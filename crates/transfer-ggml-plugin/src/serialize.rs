//! Host tensors and graphs into the ggml-rpc wire records, numbers by name.

use std::collections::HashSet;

use transfer_rpc::protocol::{GraphPayload, RpcTensor};

use crate::abi::{GgmlTensor, GraphT};
use crate::backend::buffer_remote;
use crate::conn::Conn;
use crate::error::{PluginError, Result};
use crate::host::Host;
use crate::names;

fn fits_u32(call: &'static str, what: &str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| PluginError::Unsupported {
        call,
        reason: format!("{what} {v} does not fit the wire's 32 bits"),
    })
}

/// The wire record of `t`. Its buffer and data are sent only when the
/// buffer is one of ours on `conn` (or on any server when `conn` is None),
/// as upstream does; otherwise both are 0.
///
/// # Safety
/// `t` must be a live host tensor.
pub unsafe fn tensor(host: &Host, t: *const GgmlTensor, conn: Option<&Conn>) -> Result<RpcTensor> {
    const CALL: &str = "serialize tensor";
    if t.is_null() {
        return Ok(RpcTensor {
            ne: [0; 4],
            ..RpcTensor::default()
        });
    }
    // SAFETY: the caller's contract.
    let r = unsafe { &*t };
    let mut out = RpcTensor {
        id: t as u64,
        ty: host.wire_type(r.ty)?,
        ..RpcTensor::default()
    };
    // SAFETY: a live tensor's buffer is NULL or a live host buffer.
    if let Some((c, remote)) = unsafe { buffer_remote(r.buffer) } {
        if conn.is_none_or(|want| std::ptr::eq(want, c)) {
            out.buffer = remote;
            out.data = r.data as u64;
        }
    }
    for i in 0..4 {
        out.ne[i] = fits_u32(CALL, "ne", r.ne[i] as u64)?;
        out.nb[i] = fits_u32(CALL, "nb", r.nb[i] as u64)?;
    }
    out.op = host.wire_op(r.op)?;
    out.op_params = r.op_params;
    if out.op == names::wire_op("UNARY").unwrap_or(u32::MAX) {
        out.op_params[0] = host.wire_unary(r.op_params[0])?;
    } else if out.op == names::wire_op("GLU").unwrap_or(u32::MAX) {
        out.op_params[0] = host.wire_glu(r.op_params[0])?;
    }
    out.flags = r.flags;
    for (o, s) in out.src.iter_mut().zip(r.src.iter()) {
        *o = *s as u64;
    }
    out.view_src = r.view_src as u64;
    out.view_offs = r.view_offs as u64;
    // The name up to its NUL, at most 63 bytes (the wire's field is 64).
    let bytes: Vec<u8> = r
        .name
        .iter()
        .take(63)
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    out.name[..bytes.len()].copy_from_slice(&bytes);
    // use_count stays 0: the host's counts live in the opaque ggml_cgraph;
    // 0 only turns fusion off on the server (results unchanged).
    Ok(out)
}

/// The GRAPH_COMPUTE payload of a host graph for `device` on `conn`: the
/// nodes, then the de-duplicated closure over sources and view sources,
/// each tensor after its sources (upstream's order).
///
/// # Safety
/// `g` must be a live host graph.
pub unsafe fn graph(host: &Host, g: GraphT, device: u32, conn: &Conn) -> Result<GraphPayload> {
    // SAFETY: the caller's contract.
    let nodes = unsafe { host.graph_nodes(g) };
    let mut seen: HashSet<*mut GgmlTensor> = HashSet::new();
    let mut tensors = Vec::new();
    // Iterative post-order walk (deep graphs must not overflow the stack).
    let mut stack: Vec<(*mut GgmlTensor, bool)> = Vec::new();
    for &n in &nodes {
        stack.push((n, false));
        while let Some((t, expanded)) = stack.pop() {
            if t.is_null() {
                continue;
            }
            if expanded {
                // SAFETY: t is reachable from a live graph node.
                tensors.push(unsafe { tensor(host, t, Some(conn)) }?);
                continue;
            }
            if !seen.insert(t) {
                continue;
            }
            stack.push((t, true));
            // SAFETY: as above.
            let r = unsafe { &*t };
            // Pushed in reverse so sources come out in order, view source last.
            stack.push((r.view_src, false));
            for &s in r.src.iter().rev() {
                stack.push((s, false));
            }
        }
    }
    Ok(GraphPayload {
        device,
        nodes: nodes.iter().map(|&n| n as u64).collect(),
        tensors,
    })
}
