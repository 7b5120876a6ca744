//! Every attack class from anchors.md (and more) is refused: by the
//! validator directly, and by a live server, which closes only the
//! offending connection and keeps serving the others.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use transfer_rpc::RpcError;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::frame::encode_request;
use transfer_rpc::protocol::{Command, GraphPayload, RpcTensor};
use transfer_rpc::server::{BufferRegistry, ComputeBackend, Server, ServerConfig, ServerHandle};
use transfer_rpc::validate::{GraphLimits, ValidatedGraph, check_tensor, validate_graph};

/// Test double: counts graphs that passed validation (computes nothing).
struct Recording(AtomicUsize);
impl ComputeBackend for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn compute(&self, _g: &ValidatedGraph, _m: &BufferRegistry) -> transfer_rpc::Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct Fixture {
    reg: BufferRegistry,
    handle: u64,
    base: u64,
}

fn fixture() -> Fixture {
    let reg = BufferRegistry::new(1 << 20);
    let b = reg.alloc(1, 0, 4096).unwrap();
    let (handle, base) = (b.handle, b.base);
    Fixture { reg, handle, base }
}

impl Fixture {
    fn t(&self, id: u64, offset: u64, n: u32) -> RpcTensor {
        f32_tensor(id, self.handle, self.base, offset, n)
    }
    fn graph(
        &self,
        nodes: Vec<u64>,
        tensors: Vec<RpcTensor>,
    ) -> transfer_rpc::Result<ValidatedGraph> {
        validate_graph(
            GraphPayload {
                device: 0,
                nodes,
                tensors,
            },
            1,
            &self.reg,
            &GraphLimits::default(),
        )
    }
    fn refused(&self, nodes: Vec<u64>, tensors: Vec<RpcTensor>, what: &str) {
        match self.graph(nodes, tensors) {
            Err(RpcError::Refused { reason, .. }) => println!("refused ({what}): {reason}"),
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
    fn tensor_refused(&self, t: &RpcTensor, what: &str) {
        match check_tensor("test", t, &self.reg) {
            Err(RpcError::Refused { reason, .. }) => println!("refused ({what}): {reason}"),
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
}

// ---- tensor records -------------------------------------------------------

#[test]
fn tensor_outside_its_buffer() {
    let f = fixture();
    f.tensor_refused(&f.t(1, 4096, 1), "data at buffer end");
    f.tensor_refused(&f.t(1, 4092, 2), "data crossing buffer end");
    let mut below = f.t(1, 0, 1);
    below.data = f.base - 4;
    f.tensor_refused(&below, "data below buffer base");
    let mut wrap = f.t(1, 0, 1);
    wrap.data = u64::MAX - 2;
    f.tensor_refused(&wrap, "data + size wraps around");
    let mut huge = f.t(1, 0, 1);
    huge.ne = [u32::MAX, u32::MAX, u32::MAX, 3];
    f.tensor_refused(&huge, "element count overflow");
    let mut strides = f.t(1, 0, 16);
    strides.ne = [16, 1 << 20, 1, 1];
    strides.nb = [4, u32::MAX, 4, 4];
    f.tensor_refused(&strides, "strides reach past the buffer");
    assert!(check_tensor("ok", &f.t(1, 4092, 1), &f.reg).is_ok());
}

#[test]
fn buffer_zero_with_a_data_pointer() {
    let f = fixture();
    let mut t = f.t(1, 0, 4);
    t.buffer = 0;
    f.tensor_refused(&t, "buffer 0 with data");
}

#[test]
fn unknown_or_foreign_buffer_handle() {
    let f = fixture();
    let mut t = f.t(1, 0, 4);
    t.buffer = f.handle ^ 1;
    f.tensor_refused(&t, "unknown handle");
    assert!(f.reg.free(2, f.handle).is_err(), "free by another session");
}

#[test]
fn invalid_types() {
    let f = fixture();
    for ty in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, u32::MAX] {
        let mut t = f.t(1, 0, 4);
        t.ty = ty;
        f.tensor_refused(&t, &format!("type {ty}"));
    }
}

#[test]
fn ne0_not_a_multiple_of_the_block_size() {
    let f = fixture();
    let mut t = f.t(1, 0, 4);
    t.ty = 2; // Q4_0, blocks of 32
    t.ne = [31, 1, 1, 1];
    t.nb = [18, 18, 18, 18];
    f.tensor_refused(&t, "q4_0 ne[0]=31");
    t.ne = [32, 1, 1, 1];
    t.nb = [17, 18, 18, 18];
    f.tensor_refused(&t, "q4_0 nb[0] not the block size");
    t.nb = [18, 18, 18, 18];
    assert!(check_tensor("ok", &t, &f.reg).is_ok());
}

#[test]
fn malformed_record_fields() {
    let f = fixture();
    let mut t = f.t(1, 0, 4);
    t.flags = 1 << 8;
    f.tensor_refused(&t, "unknown flags");
    let mut t = f.t(1, 0, 4);
    t.name = [b'x'; 64];
    f.tensor_refused(&t, "name without NUL");
    let mut t = f.t(1, 0, 4);
    t.nb[0] = 2;
    f.tensor_refused(&t, "stride narrower than an element");
}

// ---- graphs ---------------------------------------------------------------

fn add(f: &Fixture, id: u64, a: u64, b: u64, offset: u64) -> RpcTensor {
    let mut t = f.t(id, offset, 4);
    t.op = 2;
    t.src[0] = a;
    t.src[1] = b;
    t
}

#[test]
fn valid_graph_passes() {
    let f = fixture();
    let g = f
        .graph(
            vec![3],
            vec![f.t(1, 0, 4), f.t(2, 16, 4), add(&f, 3, 1, 2, 32)],
        )
        .unwrap();
    assert_eq!(g.nodes, vec![2]);
}

#[test]
fn custom_op_function_pointers() {
    let f = fixture();
    for op in [92, 93, 94, 95] {
        let mut n = f.t(2, 16, 4);
        n.op = op;
        n.src[0] = 1;
        n.op_params[0] = 0x4141_4141; // would be a function pointer
        n.op_params[1] = 0x4141_4141;
        f.refused(vec![2], vec![f.t(1, 0, 4), n], &format!("custom op {op}"));
    }
}

#[test]
fn op_and_op_params_out_of_range() {
    let f = fixture();
    let mut n = f.t(2, 16, 4);
    n.src[0] = 1;
    n.op = 101;
    f.refused(vec![2], vec![f.t(1, 0, 4), n.clone()], "op = GGML_OP_COUNT");
    n.op = 91; // UNARY
    n.op_params[0] = 22;
    f.refused(
        vec![2],
        vec![f.t(1, 0, 4), n.clone()],
        "unary op out of range",
    );
    n.op = 100; // GLU
    n.op_params[0] = -1;
    f.refused(vec![2], vec![f.t(1, 0, 4), n], "glu op out of range");
}

#[test]
fn graph_structure_attacks() {
    let f = fixture();
    f.refused(
        vec![3],
        vec![f.t(1, 0, 4), add(&f, 3, 1, 9, 32)],
        "unresolvable src",
    );
    f.refused(vec![9], vec![f.t(1, 0, 4)], "unresolvable node");
    // A node listed twice runs twice (test-backend-ops' perf mode):
    // accepted; tests/graph_index_nodes.rs checks the index checks of
    // repeated index nodes.
    assert!(f.graph(vec![1, 1], vec![f.t(1, 0, 4)]).is_ok());
    f.refused(vec![1], vec![f.t(1, 0, 4), f.t(1, 16, 4)], "duplicate id");
    f.refused(vec![0], vec![f.t(0, 0, 4)], "id 0");
    f.refused(
        vec![3, 4],
        vec![f.t(1, 0, 4), add(&f, 3, 1, 4, 32), add(&f, 4, 3, 1, 48)],
        "cycle",
    );
    f.refused(
        vec![3],
        vec![f.t(1, 0, 4), add(&f, 3, 3, 1, 32)],
        "self loop",
    );
    // ggml_cast's CPY names the result itself as src[1] (its destination;
    // test-backend-ops' TOPK_QSA): that one self-edge is ggml's own and
    // accepted; the same CPY reading itself as src[0] is still a cycle.
    let mut cast = f.t(3, 32, 4);
    cast.op = 34;
    cast.src[0] = 1;
    cast.src[1] = 3;
    assert!(f.graph(vec![3], vec![f.t(1, 0, 4), cast.clone()]).is_ok());
    let mut self_read = cast;
    self_read.src[0] = 3;
    f.refused(vec![3], vec![f.t(1, 0, 4), self_read], "cpy reading itself");
    let mut add_self_b = add(&f, 3, 1, 3, 32);
    add_self_b.src[1] = 3;
    f.refused(
        vec![3],
        vec![f.t(1, 0, 4), add_self_b],
        "add with itself as src1",
    );
    let mut unary_without_src = f.t(2, 16, 4);
    unary_without_src.op = 91;
    f.refused(vec![2], vec![unary_without_src], "op without its sources");
    let mut add_one_src = add(&f, 3, 1, 0, 32);
    add_one_src.src[1] = 0;
    f.refused(
        vec![3],
        vec![f.t(1, 0, 4), add_one_src],
        "binary op with one source",
    );
    let mut nobuf = f.t(1, 0, 4);
    nobuf.buffer = 0;
    nobuf.data = 0;
    f.refused(vec![1], vec![nobuf], "graph tensor without a buffer");
    let g = GraphPayload {
        device: 1,
        nodes: vec![],
        tensors: vec![],
    };
    assert!(
        validate_graph(g, 1, &f.reg, &GraphLimits::default()).is_err(),
        "device out of range"
    );
    let limits = GraphLimits {
        max_nodes: 1,
        ..GraphLimits::default()
    };
    let g = GraphPayload {
        device: 0,
        nodes: vec![1, 2],
        tensors: vec![f.t(1, 0, 4), f.t(2, 16, 4)],
    };
    assert!(validate_graph(g, 1, &f.reg, &limits).is_err(), "node limit");
}

#[test]
fn view_outside_its_source() {
    let f = fixture();
    let src = f.t(1, 0, 4);
    let mut view = f.t(2, 8, 4); // 16 bytes from offset 8 of a 16-byte source
    view.op = 37;
    view.src[0] = 1;
    view.view_src = 1;
    view.view_offs = 8;
    f.refused(
        vec![2],
        vec![src.clone(), view.clone()],
        "view past its source",
    );
    let mut lying = f.t(2, 0, 2);
    lying.op = 37;
    lying.src[0] = 1;
    lying.view_src = 1;
    lying.view_offs = 8; // but data says offset 0
    f.refused(vec![2], vec![src.clone(), lying], "view data != src + offs");
    let mut ok = f.t(2, 8, 2);
    ok.op = 37;
    ok.src[0] = 1;
    ok.view_src = 1;
    ok.view_offs = 8;
    assert!(f.graph(vec![2], vec![src, ok]).is_ok());
}

/// GET_ROWS(a: 4 rows of 4 f32, b: 2 I32 indices) -> 2 rows.
fn get_rows_graph(f: &Fixture, idx: [i32; 2]) -> Vec<RpcTensor> {
    let mut a = f.t(1, 0, 4);
    a.ne = [4, 4, 1, 1];
    a.nb = [4, 16, 64, 64];
    let mut b = f.t(2, 128, 2);
    b.ty = 26; // I32
    let bytes: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    f.reg.write("test", f.handle, 128, &bytes).unwrap();
    let mut r = f.t(3, 256, 4);
    r.ne = [4, 2, 1, 1];
    r.nb = [4, 16, 32, 32];
    r.op = 40;
    r.src[0] = 1;
    r.src[1] = 2;
    vec![a, b, r]
}

#[test]
fn get_rows_index_out_of_bounds() {
    let f = fixture();
    assert!(f.graph(vec![3], get_rows_graph(&f, [0, 3])).is_ok());
    f.refused(vec![3], get_rows_graph(&f, [0, 4]), "GET_ROWS index = rows");
    f.refused(
        vec![3],
        get_rows_graph(&f, [-1, 0]),
        "GET_ROWS negative index",
    );
    f.refused(
        vec![3],
        get_rows_graph(&f, [i32::MAX, 0]),
        "GET_ROWS huge index",
    );
    let mut g = get_rows_graph(&f, [0, 1]);
    g[1].ty = 27; // I64 is not accepted by GET_ROWS
    g[1].nb = [8, 16, 16, 16];
    f.refused(vec![3], g, "GET_ROWS index type");
    let mut g = get_rows_graph(&f, [0, 1]);
    g[2].ne = [4, 8, 1, 1]; // result claims more rows than indices
    f.refused(vec![3], g, "GET_ROWS result shape");
}

/// SET_ROWS(dst: 4 rows of 4 f32, rows: 2 rows, idx: 2 I64).
fn set_rows_graph(f: &Fixture, idx: [i64; 2]) -> Vec<RpcTensor> {
    let mut dst = f.t(1, 0, 4);
    dst.ne = [4, 4, 1, 1];
    dst.nb = [4, 16, 64, 64];
    let mut rows = f.t(2, 64, 4);
    rows.ne = [4, 2, 1, 1];
    rows.nb = [4, 16, 32, 32];
    let mut c = f.t(3, 128, 2);
    c.ty = 27; // I64
    c.nb = [8, 16, 16, 16];
    let bytes: Vec<u8> = idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    f.reg.write("test", f.handle, 128, &bytes).unwrap();
    let mut r = dst.clone();
    r.id = 4;
    r.op = 42;
    r.src[0] = 2;
    r.src[1] = 3;
    r.src[2] = 1;
    r.view_src = 1;
    vec![dst, rows, c, r]
}

#[test]
fn set_rows_index_out_of_bounds() {
    let f = fixture();
    assert!(f.graph(vec![4], set_rows_graph(&f, [0, 3])).is_ok());
    f.refused(vec![4], set_rows_graph(&f, [4, 0]), "SET_ROWS index = rows");
    f.refused(
        vec![4],
        set_rows_graph(&f, [0, -7]),
        "SET_ROWS negative index",
    );
    f.refused(
        vec![4],
        set_rows_graph(&f, [i64::MAX, 0]),
        "SET_ROWS huge index",
    );
}

#[test]
fn computed_indices_are_deferred_to_the_backend() {
    let f = fixture();
    let mut g = get_rows_graph(&f, [9, 9]);
    // The index tensor is now produced by a node of the graph.
    g[1].op = 35; // CONT
    g[1].src[0] = 5;
    let mut src = f.t(5, 512, 2);
    src.ty = 26;
    g.push(src);
    let v = f.graph(vec![2, 3], g).unwrap();
    assert_eq!(v.deferred_index_checks, vec![2]);
}

#[test]
fn every_index_node_is_listed_for_a_run_time_check() {
    let f = fixture();
    // Indices in memory that no node writes: checked now (early refusal)
    // and listed for the backend's check before the first node runs.
    let v = f.graph(vec![3], get_rows_graph(&f, [0, 3])).unwrap();
    assert_eq!(v.upfront_index_checks, vec![2]);
    assert!(v.deferred_index_checks.is_empty());
    let v = f.graph(vec![4], set_rows_graph(&f, [0, 3])).unwrap();
    assert_eq!(v.upfront_index_checks, vec![3]);
    assert!(v.deferred_index_checks.is_empty());

    // A leaf index tensor whose bytes an earlier node writes (ADD into the
    // index bytes at 128): what validation reads now is not what GET_ROWS
    // will read, so the check is deferred to the point after that node.
    let mut g = get_rows_graph(&f, [0, 3]);
    g.push(add(&f, 5, 1, 1, 128));
    let v = f.graph(vec![5, 3], g).unwrap();
    assert!(v.upfront_index_checks.is_empty());
    assert_eq!(v.deferred_index_checks, vec![2]);
    // The same node listed after GET_ROWS cannot change what it reads.
    let mut g = get_rows_graph(&f, [0, 3]);
    g.push(add(&f, 5, 1, 1, 128));
    let v = f.graph(vec![3, 5], g).unwrap();
    assert_eq!(v.upfront_index_checks, vec![2]);
    // An earlier node writing elsewhere does not defer the check.
    let mut g = get_rows_graph(&f, [0, 3]);
    g.push(add(&f, 5, 1, 1, 1024));
    let v = f.graph(vec![5, 3], g).unwrap();
    assert_eq!(v.upfront_index_checks, vec![2]);
}

// ---- live server ----------------------------------------------------------

/// Builds the attack bytes from the attacker's own `(handle, base)`.
type Attack = Box<dyn Fn(u64, u64) -> Vec<u8>>;

fn raw(cmd: Command, payload: &[u8]) -> Vec<u8> {
    encode_request(cmd, payload)
}

fn set_tensor_payload(t: &RpcTensor, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut p = t.encode();
    p.push(0);
    p.extend_from_slice(&offset.to_le_bytes());
    p.extend_from_slice(data);
    p
}

fn start_recording() -> (ServerHandle, Arc<Recording>) {
    let backend = Arc::new(Recording(AtomicUsize::new(0)));
    let h = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 16 << 20,
            max_buffer_size: 16 << 20,
            limits: transfer_rpc::protocol::Limits {
                max_message_size: 1 << 20,
            },
            ..ServerConfig::default()
        },
        backend.clone(),
    )
    .unwrap()
    .spawn()
    .unwrap();
    (h, backend)
}

#[test]
fn live_server_refuses_each_attack_and_keeps_serving() {
    let (h, backend) = start_recording();
    // A bystander session with data that must survive every attack.
    let mut victim = connect(&h);
    let (vbuf, vbase) = alloc(&mut victim, 4096);
    let vt = f32_tensor(1, vbuf, vbase, 0, 4);
    victim
        .set_tensor(&vt, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();

    let attacks: Vec<(&str, Attack)> = vec![
        (
            "unknown command byte",
            Box::new(|_, _| vec![18, 0, 0, 0, 0, 0, 0, 0, 0]),
        ),
        (
            "command 0xFF",
            Box::new(|_, _| vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0]),
        ),
        (
            "second HELLO",
            Box::new(|_, _| raw(Command::Hello, &[0; 24])),
        ),
        (
            "message over the size limit",
            Box::new(|_, _| {
                let mut v = vec![6u8];
                v.extend_from_slice(&(2u64 << 20).to_le_bytes());
                v
            }),
        ),
        (
            "u64::MAX message size",
            Box::new(|_, _| {
                let mut v = vec![6u8];
                v.extend_from_slice(&u64::MAX.to_le_bytes());
                v
            }),
        ),
        (
            "fixed-size request with wrong size",
            Box::new(|_, _| raw(Command::GetAlignment, &[0; 5])),
        ),
        (
            "device out of range",
            Box::new(|_, _| raw(Command::GetAlignment, &7u32.to_le_bytes())),
        ),
        (
            "SET_TENSOR past the buffer end",
            Box::new(|b, base| {
                raw(
                    Command::SetTensor,
                    &set_tensor_payload(&f32_tensor(1, b, base, 4088, 4), 0, &[0; 16]),
                )
            }),
        ),
        (
            "SET_TENSOR offset overflow",
            Box::new(|b, base| {
                raw(
                    Command::SetTensor,
                    &set_tensor_payload(&f32_tensor(1, b, base, 0, 4), u64::MAX - 3, &[0; 8]),
                )
            }),
        ),
        (
            "SET_TENSOR buffer 0 with data",
            Box::new(|_, base| {
                raw(
                    Command::SetTensor,
                    &set_tensor_payload(&f32_tensor(1, 0, base, 0, 4), 0, &[0; 16]),
                )
            }),
        ),
        (
            "SET_TENSOR on a guessed handle",
            Box::new(|b, base| {
                raw(
                    Command::SetTensor,
                    &set_tensor_payload(&f32_tensor(1, b.wrapping_add(1), base, 0, 4), 0, &[0; 16]),
                )
            }),
        ),
        (
            "GET_TENSOR size overflow",
            Box::new(|b, base| {
                let mut p = f32_tensor(1, b, base, 0, 4).encode();
                p.extend_from_slice(&4u64.to_le_bytes());
                p.extend_from_slice(&u64::MAX.to_le_bytes());
                raw(Command::GetTensor, &p)
            }),
        ),
        (
            "MEMSET_TENSOR past the tensor",
            Box::new(|b, base| {
                let mut p = f32_tensor(1, b, base, 0, 4).encode();
                p.extend_from_slice(&0u64.to_le_bytes());
                p.extend_from_slice(&4096u64.to_le_bytes());
                p.push(1);
                raw(Command::MemsetTensor, &p)
            }),
        ),
        (
            "invalid type",
            Box::new(|b, base| {
                let mut t = f32_tensor(1, b, base, 0, 4);
                t.ty = 4;
                raw(Command::InitTensor, &t.encode())
            }),
        ),
        (
            "ne[0] not a block multiple",
            Box::new(|b, base| {
                let mut t = f32_tensor(1, b, base, 0, 4);
                t.ty = 8; // Q8_0
                t.ne = [33, 1, 1, 1];
                t.nb = [34, 34, 34, 34];
                raw(Command::InitTensor, &t.encode())
            }),
        ),
        (
            "custom op in a graph",
            Box::new(|b, base| {
                let a = f32_tensor(1, b, base, 0, 4);
                let mut n = f32_tensor(2, b, base, 16, 4);
                n.op = 95;
                n.src[0] = 1;
                n.op_params[0] = 0x4141_4141;
                raw(
                    Command::GraphCompute,
                    &GraphPayload {
                        device: 0,
                        nodes: vec![2],
                        tensors: vec![a, n],
                    }
                    .encode(),
                )
            }),
        ),
        (
            "graph with a cycle",
            Box::new(|b, base| {
                let mut x = f32_tensor(1, b, base, 0, 4);
                x.op = 35;
                x.src[0] = 2;
                let mut y = f32_tensor(2, b, base, 16, 4);
                y.op = 35;
                y.src[0] = 1;
                raw(
                    Command::GraphCompute,
                    &GraphPayload {
                        device: 0,
                        nodes: vec![1, 2],
                        tensors: vec![x, y],
                    }
                    .encode(),
                )
            }),
        ),
        (
            "graph count larger than payload",
            Box::new(|_, _| {
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&u32::MAX.to_le_bytes());
                raw(Command::GraphCompute, &p)
            }),
        ),
        (
            "GET_ROWS index out of bounds",
            Box::new(|b, base| {
                let mut a = f32_tensor(1, b, base, 0, 4);
                a.ne = [4, 4, 1, 1];
                a.nb = [4, 16, 64, 64];
                // index tensor reads the buffer's zeroed bytes ... then the attack
                // payload below sets them to 1000 first via a SET_TENSOR frame.
                let mut ix = f32_tensor(2, b, base, 128, 2);
                ix.ty = 26;
                let mut r = f32_tensor(3, b, base, 256, 4);
                r.ne = [4, 2, 1, 1];
                r.nb = [4, 16, 32, 32];
                r.op = 40;
                r.src[0] = 1;
                r.src[1] = 2;
                let mut out = raw(
                    Command::SetTensor,
                    &set_tensor_payload(&ix, 0, &[0xE8, 3, 0, 0, 0, 0, 0, 0]),
                );
                out.extend(raw(
                    Command::GraphCompute,
                    &GraphPayload {
                        device: 0,
                        nodes: vec![3],
                        tensors: vec![a, ix, r],
                    }
                    .encode(),
                ));
                out
            }),
        ),
        (
            "GRAPH_RECOMPUTE without a graph",
            Box::new(|_, _| raw(Command::GraphRecompute, &0u32.to_le_bytes())),
        ),
        (
            "FREE_BUFFER of another session's buffer",
            Box::new(|_, _| Vec::new()),
        ),
        (
            "truncated payload then EOF",
            Box::new(|_, _| {
                let mut v = vec![6u8];
                v.extend_from_slice(&400u64.to_le_bytes());
                v.extend_from_slice(&[0; 10]);
                v
            }),
        ),
    ];

    for (name, make) in &attacks {
        let mut c = connect(&h);
        let (b, base) = alloc(&mut c, 4096);
        let bytes = if *name == "FREE_BUFFER of another session's buffer" {
            raw(Command::FreeBuffer, &vbuf.to_le_bytes())
        } else {
            make(b, base)
        };
        c.send_raw(&bytes).unwrap();
        if *name == "truncated payload then EOF" {
            drop(c);
        } else {
            assert!(is_closed(&mut c), "{name}: connection should be closed");
        }
        // The server is alive and the bystander is unaffected.
        assert_eq!(
            victim.get_tensor(&vt, 0, 16).unwrap(),
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
            "{name}"
        );
        println!("refused: {name}");
    }
    assert_eq!(
        backend.0.load(Ordering::SeqCst),
        0,
        "no attack reached compute"
    );
    assert!(h.shared().refused_connections() >= attacks.len() as u64 - 1);

    // Before HELLO: anything else closes the connection.
    let mut s = std::net::TcpStream::connect(h.addr()).unwrap();
    use std::io::{Read, Write};
    s.write_all(&raw(Command::DeviceCount, &[])).unwrap();
    let mut buf = [0u8; 8];
    assert!(
        s.read(&mut buf).map(|n| n == 0).unwrap_or(true),
        "command before HELLO"
    );
}

#[test]
fn valid_graphs_reach_the_backend_and_recompute_rechecks() {
    let (h, backend) = start_recording();
    let mut c = connect(&h);
    let (b, base) = alloc(&mut c, 4096);
    let a = f32_tensor(1, b, base, 0, 4);
    let x = f32_tensor(2, b, base, 16, 4);
    let mut s = f32_tensor(3, b, base, 32, 4);
    s.op = 2;
    s.src = [1, 2, 0, 0, 0, 0, 0, 0, 0, 0];
    c.graph_compute(&GraphPayload {
        device: 0,
        nodes: vec![3],
        tensors: vec![a, x, s],
    })
    .unwrap();
    c.graph_recompute(0).unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
    assert_eq!(backend.0.load(Ordering::SeqCst), 2);
    // After the buffer is freed, GRAPH_RECOMPUTE must not touch it.
    c.free_buffer(b).unwrap();
    c.graph_recompute(0).unwrap();
    assert!(is_closed(&mut c));
    assert_eq!(backend.0.load(Ordering::SeqCst), 2);
    let mut other: Client = connect(&h);
    assert_eq!(other.device_count().unwrap(), 1);
}

// ---- per-op rules a real compute backend applies --------------------------

#[test]
fn op_shape_rules_for_compute_backends() {
    use transfer_rpc::validate::op_shapes::{check_graph_ops, is_contiguous};
    let f = fixture();
    let mut a = f.t(1, 0, 4);
    a.ne = [4, 3, 1, 1];
    a.nb = [4, 16, 48, 48];
    let mut x = f.t(2, 64, 4);
    x.ne = [4, 2, 1, 1];
    x.nb = [4, 16, 32, 32];
    let mut mm = f.t(3, 128, 3);
    mm.ne = [3, 2, 1, 1];
    mm.nb = [4, 12, 24, 24];
    mm.op = 29;
    mm.src[0] = 1;
    mm.src[1] = 2;
    assert!(is_contiguous(&mm));
    let ok = f
        .graph(vec![3], vec![a.clone(), x.clone(), mm.clone()])
        .unwrap();
    check_graph_ops(&ok).unwrap();
    let mut wrong = mm.clone();
    wrong.ne = [3, 1, 1, 1]; // result smaller than the product: kernel would overflow it
    let g = f.graph(vec![3], vec![a.clone(), x.clone(), wrong]).unwrap();
    assert!(check_graph_ops(&g).is_err());
    let mut k_mismatch = x.clone();
    k_mismatch.ne = [2, 4, 1, 1];
    k_mismatch.nb = [4, 8, 32, 32];
    let g = f
        .graph(vec![3], vec![a.clone(), k_mismatch, mm.clone()])
        .unwrap();
    assert!(check_graph_ops(&g).is_err(), "inner dimensions differ");
    let mut sum = f.t(4, 256, 1);
    sum.op = 16; // CUMSUM: not on the allowlist
    sum.src[0] = 1;
    let g = f.graph(vec![4], vec![a.clone(), sum]).unwrap();
    assert!(check_graph_ops(&g).is_err());
    let mut rope = f.t(5, 512, 4);
    rope.ne = [4, 3, 1, 1];
    rope.nb = [4, 16, 48, 48];
    rope.op = 48;
    rope.src[0] = 1;
    rope.src[1] = 6;
    rope.op_params[1] = 8; // n_dims > ne[0]
    let mut pos = f.t(6, 1024, 1);
    pos.ty = 26;
    let g = f.graph(vec![5], vec![a, pos, rope]).unwrap();
    assert!(
        check_graph_ops(&g).is_err(),
        "rope n_dims larger than the row"
    );
}
