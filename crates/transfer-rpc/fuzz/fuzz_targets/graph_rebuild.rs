//! Random GRAPH_COMPUTE payloads through parsing, validation and the per-op
//! rules a compute backend applies, against a live buffer registry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer_rpc::protocol::GraphPayload;
use transfer_rpc::server::BufferRegistry;
use transfer_rpc::validate::op_shapes::check_graph_ops;
use transfer_rpc::validate::{GraphLimits, validate_graph};

fuzz_target!(|data: &[u8]| {
    let reg = BufferRegistry::new(1 << 20);
    let Some(buf) = reg.alloc(1, 0, 1 << 16) else {
        return;
    };
    let Ok(mut g) = GraphPayload::decode(data) else {
        return;
    };
    // Point the tensors at the live buffer so validation goes deep.
    for t in &mut g.tensors {
        if t.buffer & 1 == 1 {
            t.buffer = buf.handle;
            t.data = buf.base.wrapping_add(t.data % (1 << 16));
        }
    }
    if let Ok(v) = validate_graph(g, 1, &reg, &GraphLimits::default()) {
        let _ = check_graph_ops(&v);
    }
});
