//! Our client against ggml's own RPC server (protocol 7.0.0, same vendored
//! llama.cpp as the `ggml` feature), and hub copies between it and ours.
//!
//! Run with (a separate target dir, because GGML_* only reach cmake in a
//! fresh build):
//! `GGML_RPC=ON GGML_RPC_RDMA=OFF CARGO_TARGET_DIR=/work/target-rpc-up \
//!  cargo test -p transfer-rpc --features upstream-rpc --test upstream_server`
#![cfg(feature = "upstream-rpc")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use transfer_rpc::client::{Client, ClientConfig, CopyPath, copy_between};
use transfer_rpc::protocol::{Command, GraphPayload, RpcTensor};
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig};
use transfer_rpc::validate::GraphLimits;

fn add_graph(b: u64, base: u64) -> (GraphPayload, RpcTensor, RpcTensor, RpcTensor) {
    let x = f32_tensor(1, b, base, 0, 8);
    let y = f32_tensor(2, b, base, 64, 8);
    let mut s = f32_tensor(3, b, base, 128, 8);
    s.op = 2;
    s.src[0] = 1;
    s.src[1] = 2;
    s.flags = 16;
    (
        GraphPayload {
            device: 0,
            nodes: vec![3],
            tensors: vec![x.clone(), y.clone(), s.clone()],
        },
        x,
        y,
        s,
    )
}

#[test]
fn our_client_against_ggml_rpc_server() {
    let ep = start_upstream(1);
    let mut up = Client::connect(
        &ep,
        ClientConfig {
            stats: true,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    assert_eq!(up.server_version().major, 7);
    assert!(up.probe_extensions().is_none(), "upstream has no extension");
    assert!(up.device_count().unwrap() >= 1);
    assert!(up.get_alignment(0).unwrap() >= 16);
    assert!(up.get_max_size(0).unwrap() > 0);
    let (_, total) = up.get_device_memory(0).unwrap();
    assert!(total > 0);

    let (b, base) = up.alloc_buffer(0, 1 << 16).unwrap().unwrap();
    let base = {
        let got = up.buffer_get_base(b).unwrap();
        assert_ne!(got, 0);
        let _ = base;
        got
    };
    let t = f32_tensor(1, b, base, 0, 8);
    let vals: Vec<f32> = (0..8).map(|i| i as f32 - 2.5).collect();
    up.set_tensor(&t, 0, &f32_bytes(&vals)).unwrap();
    assert_eq!(up.get_tensor(&t, 0, 32).unwrap(), f32_bytes(&vals));
    assert_eq!(up.get_tensor(&t, 8, 8).unwrap(), f32_bytes(&vals[2..4]));
    let t2 = f32_tensor(2, b, base, 4096, 8);
    assert!(up.copy_tensor(&t, &t2).unwrap());
    assert_eq!(up.get_tensor(&t2, 0, 32).unwrap(), f32_bytes(&vals));
    up.memset_tensor(&t2, 4, 8, 0x7F).unwrap();
    assert_eq!(&up.get_tensor(&t2, 0, 16).unwrap()[4..12], &[0x7F; 8]);
    up.init_tensor(&t).unwrap();
    let srcs: [RpcTensor; 10] = Default::default();
    let mut alloc_t = f32_tensor(9, 0, 0, 0, 8);
    alloc_t.data = 0;
    assert_eq!(up.get_alloc_size(0, &alloc_t, &srcs).unwrap(), 32);
    assert!(
        !up.set_tensor_hash(&t, 0, 0x1234).unwrap(),
        "no cache on upstream"
    );

    // GRAPH_COMPUTE as we encode it, run by upstream's server.
    let (g, x, y, s) = add_graph(b, base);
    let xv: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let yv: Vec<f32> = (0..8).map(|i| 0.5 * i as f32).collect();
    up.set_tensor(&x, 0, &f32_bytes(&xv)).unwrap();
    up.set_tensor(&y, 0, &f32_bytes(&yv)).unwrap();
    up.graph_compute(&g).unwrap();
    let upstream_sum = up.get_tensor(&s, 0, 32).unwrap();
    let want: Vec<f32> = xv.iter().zip(&yv).map(|(a, b)| a + b).collect();
    assert_eq!(upstream_sum, f32_bytes(&want));
    up.graph_recompute(0).unwrap();
    assert_eq!(up.get_tensor(&s, 0, 32).unwrap(), f32_bytes(&want));

    // The same graph on our server with the ggml backend: identical bytes.
    let ours = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 16 << 20,
            max_buffer_size: 16 << 20,
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap();
    let mut oc = connect(&ours);
    let (ob, obase) = alloc(&mut oc, 1 << 16);
    let (og, ox, oy, os) = add_graph(ob, obase);
    oc.set_tensor(&ox, 0, &f32_bytes(&xv)).unwrap();
    oc.set_tensor(&oy, 0, &f32_bytes(&yv)).unwrap();
    oc.graph_compute(&og).unwrap();
    assert_eq!(oc.get_tensor(&os, 0, 32).unwrap(), upstream_sum);

    // Stage copies between ours and upstream go through the hub, both ways.
    assert!(oc.probe_extensions().is_some());
    assert_eq!(
        copy_between(&mut oc, &os, &mut up, &t).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(up.get_tensor(&t, 0, 32).unwrap(), upstream_sum);
    assert_eq!(
        copy_between(&mut up, &t2, &mut oc, &ox).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(
        oc.get_tensor(&ox, 0, 32).unwrap(),
        up.get_tensor(&t2, 0, 32).unwrap()
    );

    up.free_buffer(b).unwrap();
    let st = up.take_stats().unwrap();
    assert_eq!(
        st.get(Command::Hello).count,
        2,
        "probe connection + reconnect"
    );
    assert_eq!(st.get(Command::CopyTensorTo).count, 0);
    println!("{st}");
}
