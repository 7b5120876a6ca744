//! Property tests: random bytes never panic the parsers or the validator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use proptest::prelude::*;
use transfer_rpc::protocol::{Command, GraphPayload, Limits, Request, RpcTensor, split_request};
use transfer_rpc::server::BufferRegistry;
use transfer_rpc::validate::{GraphLimits, check_shape, validate_graph};

fn arb_tensor() -> impl Strategy<Value = RpcTensor> {
    (
        any::<u64>(),
        0u32..50,
        prop::array::uniform4(0u32..70),
        prop::array::uniform4(0u32..300),
        0u32..110,
        prop::array::uniform4(0u64..6),
        any::<i32>(),
    )
        .prop_map(|(id, ty, ne, nb, op, src, p0)| {
            let mut t = RpcTensor {
                id: id % 6,
                ty,
                ne,
                nb,
                op,
                ..RpcTensor::default()
            };
            t.src[..4].copy_from_slice(&src);
            t.op_params[0] = p0;
            t
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_frames_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let limits = Limits { max_message_size: 1 << 20 };
        if let Ok(Some((cmd, payload, used))) = split_request(&bytes, &limits) {
            if let Ok(req) = Request::decode(cmd, payload) {
                prop_assert_eq!(req.encode_frame(), bytes[..used].to_vec());
            }
        }
    }

    #[test]
    fn random_payloads_never_panic(cmd in 0u8..=255, bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(c) = Command::from_byte(cmd) {
            if let Ok(req) = Request::decode(c, &bytes) {
                prop_assert_eq!(req.encode_payload(), bytes.clone());
            }
        }
        let _ = GraphPayload::decode(&bytes);
    }

    #[test]
    fn tensor_round_trip(t in arb_tensor(), name in "[a-z]{0,70}") {
        let mut t = t;
        t.set_name(&name);
        let b = t.encode();
        prop_assert_eq!(b.len(), 296);
        prop_assert_eq!(RpcTensor::decode(&b).unwrap(), t.clone());
        let _ = check_shape("prop", &t);
    }

    #[test]
    fn random_graphs_never_panic(tensors in prop::collection::vec(arb_tensor(), 0..8),
                                 nodes in prop::collection::vec(0u64..6, 0..6)) {
        let reg = BufferRegistry::new(1 << 16);
        let buf = reg.alloc(1, 0, 4096).unwrap();
        let tensors = tensors.into_iter().map(|mut t| {
            t.buffer = buf.handle;
            t.data = buf.base;
            t
        }).collect();
        let g = GraphPayload { device: 0, nodes, tensors };
        let bytes = g.encode();
        let parsed = GraphPayload::decode(&bytes).unwrap();
        prop_assert_eq!(&parsed, &g);
        let _ = validate_graph(parsed, 1, &reg, &GraphLimits::default());
    }
}
