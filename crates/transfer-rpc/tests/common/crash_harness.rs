//! What the validator crash tests share (run with `--features ggml`):
//! tensors laid out as ggml lays them out, one-node graphs, and the check
//! that a graph is refused while the server keeps computing.
#![allow(dead_code)]

use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::ServerHandle;
use transfer_rpc::validate::type_info;

use super::{alloc, connect, f32_bytes, floats, is_closed};

/// `GGML_TENSOR_FLAG_COMPUTE`.
pub const COMPUTE: i32 = 16;
/// Bytes of the buffer each refused graph gets.
pub const BUF: u64 = 1 << 16;
const F32: u32 = 0;
const OP_ADD: u32 = 2;

/// `(block size, bytes per block)` of `ty`.
pub fn layout(ty: u32) -> (u32, u32) {
    type_info(ty).map_or((1, 4), |i| (i.block_size as u32, i.type_size as u32))
}

/// Bytes of a packed tensor of `ty` with shape `ne`.
pub fn packed_size(ty: u32, ne: [u32; 4]) -> u64 {
    let (bs, ts) = layout(ty);
    u64::from(ne[0] / bs * ts) * u64::from(ne[1]) * u64::from(ne[2]) * u64::from(ne[3])
}

/// A tensor of `ty` with shape `ne` and strides `nb` at `offset` in the
/// buffer `(b, base)`.
pub fn tensor(
    id: u64,
    ty: u32,
    ne: [u32; 4],
    nb: [u32; 4],
    b: u64,
    base: u64,
    offset: u64,
) -> RpcTensor {
    RpcTensor {
        id,
        ty,
        buffer: b,
        ne,
        nb,
        data: base + offset,
        ..RpcTensor::default()
    }
}

/// A packed tensor (ggml_new_tensor strides).
pub fn packed(id: u64, ty: u32, ne: [u32; 4], b: u64, base: u64, offset: u64) -> RpcTensor {
    let (bs, ts) = layout(ty);
    let row = ne[0] / bs * ts;
    let nb = [ts, row, row * ne[1], row * ne[1] * ne[2]];
    tensor(id, ty, ne, nb, b, base, offset)
}

/// A packed tensor that ends where the buffer ends.
pub fn at_end(id: u64, ty: u32, ne: [u32; 4], b: u64, base: u64) -> RpcTensor {
    packed(id, ty, ne, b, base, BUF - packed_size(ty, ne))
}

/// `t` as a node of `op` over the source ids `srcs` (0: no source).
pub fn node(mut t: RpcTensor, op: u32, srcs: &[u64]) -> RpcTensor {
    t.op = op;
    for (slot, &s) in t.src.iter_mut().zip(srcs) {
        *slot = s;
    }
    t.flags = COMPUTE;
    t
}

pub fn set_f32(t: &mut RpcTensor, i: usize, v: f32) {
    t.op_params[i] = v.to_bits() as i32;
}

/// A graph of one node (the last tensor) over the other tensors.
pub fn one_node(tensors: Vec<RpcTensor>) -> GraphPayload {
    let id = tensors.last().map_or(0, |t| t.id);
    GraphPayload {
        device: 0,
        nodes: vec![id],
        tensors,
    }
}

pub fn wait_refused(h: &ServerHandle, n: u64) {
    for _ in 0..200 {
        if h.shared().refused_connections() >= n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!(
        "expected {n} refused connections, server counted {}",
        h.shared().refused_connections()
    );
}

/// A fresh session computes ADD([1, 2, 3, 4], [10, 20, 30, 40]).
pub fn server_still_computes(h: &ServerHandle) {
    let mut c = connect(h);
    let (b, base) = alloc(&mut c, 4096);
    let x = packed(1, F32, [4, 1, 1, 1], b, base, 0);
    let y = packed(2, F32, [4, 1, 1, 1], b, base, 64);
    c.set_tensor(&x, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    c.set_tensor(&y, 0, &f32_bytes(&[10.0, 20.0, 30.0, 40.0]))
        .unwrap();
    let r = node(packed(3, F32, [4, 1, 1, 1], b, base, 128), OP_ADD, &[1, 2]);
    c.graph_compute(&one_node(vec![x, y, r.clone()])).unwrap();
    assert_eq!(
        floats(&c.get_tensor(&r, 0, 16).unwrap()),
        vec![11.0, 22.0, 33.0, 44.0]
    );
}

/// Sends the graph `build` makes in a fresh buffer of `BUF` bytes: it
/// must be refused and the server must keep computing.
pub fn refused(h: &ServerHandle, what: &str, build: impl FnOnce(u64, u64) -> GraphPayload) {
    let before = h.shared().refused_connections();
    let mut c = connect(h);
    let (b, base) = alloc(&mut c, BUF);
    c.graph_compute(&build(b, base)).unwrap();
    assert!(is_closed(&mut c), "{what}: was not refused");
    wait_refused(h, before + 1);
    server_still_computes(h);
}

/// A session with a fresh buffer of `BUF` bytes.
pub fn session(h: &ServerHandle) -> (Client, u64, u64) {
    let mut c = connect(h);
    let (b, base) = alloc(&mut c, BUF);
    (c, b, base)
}

/// Computes `g` on `c`, which must stay connected.
pub fn computes(c: &mut Client, what: &str, g: &GraphPayload) {
    c.graph_compute(g).unwrap();
    assert!(!is_closed(c), "{what}: was refused");
}

pub fn read(c: &mut Client, t: &RpcTensor, n: u64) -> Vec<f32> {
    floats(&c.get_tensor(t, 0, 4 * n).unwrap())
}
