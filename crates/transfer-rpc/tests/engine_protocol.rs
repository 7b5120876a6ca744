//! ENGINE_* codecs: golden layouts, round trips, refused payloads and
//! response sizes (pure codecs; no engine needed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use transfer_rpc::protocol::engine::{
    BACKEND_LIBFABRIC, BACKEND_NONE, CloseKind, ENGINE_WRITE_SIZE, LaneId, MAX_ENGINE_BYTES,
    OutboundId, lane_imm,
};
use transfer_rpc::protocol::hello::{ExtInfo, FEATURE_ENGINE};
use transfer_rpc::protocol::response::{ResponseSize, expected_size, response_size};
use transfer_rpc::protocol::{Command, Limits, Request, Response, RpcTensor, split_request};

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn tensor() -> RpcTensor {
    RpcTensor {
        id: 5,
        buffer: 0x1111,
        ne: [8, 1, 1, 1],
        nb: [4, 32, 32, 32],
        data: 0x2222,
        ..RpcTensor::default()
    }
}

#[test]
fn command_bytes() {
    let want = [
        (Command::EngineInfo, 0xC3),
        (Command::EngineOpenInbound, 0xC4),
        (Command::EngineOpenOutbound, 0xC5),
        (Command::EngineWrite, 0xC6),
        (Command::EngineWait, 0xC7),
        (Command::EngineClose, 0xC8),
    ];
    for (c, b) in want {
        assert_eq!(c.byte(), b);
        assert_eq!(Command::from_byte(b).unwrap(), c);
        assert!(c.is_extension() && c.is_engine() && c.has_response());
    }
    assert!(!Command::CopyTensorTo.is_engine());
    assert!(!Command::MarkOpen.is_engine() && !Command::CopyTensorToMark.is_engine());
    assert!(Command::from_byte(0xCD).is_err());
}

#[test]
fn every_engine_request_layout() {
    let t = tensor();
    let cases: Vec<(Request<'_>, Vec<u8>)> = vec![
        (Request::EngineInfo, vec![]),
        (
            Request::EngineOpenInbound {
                buffer: 0x0102,
                offset: 3,
                size: 4,
                sender: b"addr",
            },
            cat(&[&le64(0x0102), &le64(3), &le64(4), &le32(4), b"addr"]),
        ),
        (
            Request::EngineOpenOutbound {
                destination: b"dst",
                descriptor: b"desc",
                lane: LaneId(9),
            },
            cat(&[&le32(3), b"dst", &le32(4), b"desc", &le32(9)]),
        ),
        (
            Request::EngineWrite {
                outbound: OutboundId(2),
                src: Box::new(t.clone()),
                src_offset: 6,
                size: 7,
                dst_offset: 8,
                seq: 0x0001_0002,
            },
            cat(&[
                &le32(2),
                &t.encode(),
                &le64(6),
                &le64(7),
                &le64(8),
                &le32(0x0001_0002),
            ]),
        ),
        (
            Request::EngineWait {
                lane: LaneId(3),
                seq: 4,
                timeout_ms: 5,
                size: 6,
            },
            cat(&[&le32(3), &le32(4), &le32(5), &le64(6)]),
        ),
        (
            Request::EngineClose {
                kind: CloseKind::Outbound,
                id: 77,
            },
            cat(&[&[1], &le32(77)]),
        ),
        (
            Request::EngineClose {
                kind: CloseKind::Inbound,
                id: 1,
            },
            cat(&[&[0], &le32(1)]),
        ),
    ];
    for (req, payload) in cases {
        let cmd = req.command();
        assert_eq!(req.encode_payload(), payload, "{}", cmd.name());
        assert_eq!(Request::decode(cmd, &payload).unwrap(), req);
        let frame = req.encode_frame();
        let (c, p, used) = split_request(&frame, &Limits::default()).unwrap().unwrap();
        assert_eq!((c, p, used), (cmd, &payload[..], frame.len()));
    }
    assert_eq!(ENGINE_WRITE_SIZE, 4 + 296 + 8 + 8 + 8 + 4);
}

#[test]
fn refused_engine_payloads() {
    let base = cat(&[&le64(1), &le64(0), &le64(64)]);
    let inbound_bad = [
        base.clone(),                     // no length
        cat(&[&base, &le32(0)]),          // empty address
        cat(&[&base, &le32(5), b"abc"]),  // truncated
        cat(&[&base, &le32(3), b"abcd"]), // trailing byte
        cat(&[
            &base,
            &le32(MAX_ENGINE_BYTES as u32 + 1),
            &vec![0; MAX_ENGINE_BYTES + 1],
        ]),
        cat(&[&base, &le32(u32::MAX), b"x"]),
        vec![1, 2, 3],
    ];
    for p in inbound_bad {
        assert!(
            Request::decode(Command::EngineOpenInbound, &p).is_err(),
            "{p:?}"
        );
    }
    let at_limit = cat(&[
        &base,
        &le32(MAX_ENGINE_BYTES as u32),
        &vec![7; MAX_ENGINE_BYTES],
    ]);
    assert!(Request::decode(Command::EngineOpenInbound, &at_limit).is_ok());
    let outbound_bad = [
        cat(&[&le32(1), b"a", &le32(1), b"b"]),     // no lane
        cat(&[&le32(1), b"a", &le32(0), &le32(3)]), // empty descriptor
        cat(&[&le32(1), b"a", &le32(1), b"b", &le32(3), &[0]]), // trailing
        cat(&[&le32(9), b"a"]),
    ];
    for p in outbound_bad {
        assert!(
            Request::decode(Command::EngineOpenOutbound, &p).is_err(),
            "{p:?}"
        );
    }
    assert!(Request::decode(Command::EngineInfo, &[0]).is_err());
    assert!(Request::decode(Command::EngineWrite, &vec![0; ENGINE_WRITE_SIZE - 1]).is_err());
    assert!(Request::decode(Command::EngineWrite, &vec![0; ENGINE_WRITE_SIZE + 1]).is_err());
    assert!(Request::decode(Command::EngineWait, &[0; 12]).is_err());
    assert!(Request::decode(Command::EngineWait, &[0; 21]).is_err());
    assert!(Request::decode(Command::EngineClose, &[2, 0, 0, 0, 0]).is_err());
    assert!(Request::decode(Command::EngineClose, &[0, 0, 0, 0]).is_err());
}

#[test]
fn engine_responses() {
    let cases = [
        (
            Command::EngineInfo,
            Response::EngineInfo {
                backend: BACKEND_LIBFABRIC,
                address: b"xyz".to_vec(),
            },
            cat(&[&[1], b"xyz"]),
        ),
        (
            Command::EngineInfo,
            Response::EngineInfo {
                backend: BACKEND_NONE,
                address: vec![],
            },
            vec![0],
        ),
        (
            Command::EngineOpenInbound,
            Response::EngineInbound {
                ok: 1,
                lane: LaneId(4),
                descriptor: b"d".to_vec(),
            },
            cat(&[&[1], &le32(4), b"d"]),
        ),
        (
            Command::EngineOpenInbound,
            Response::EngineInbound {
                ok: 0,
                lane: LaneId(0),
                descriptor: vec![],
            },
            vec![0; 5],
        ),
        (
            Command::EngineOpenOutbound,
            Response::EngineOutbound {
                ok: 1,
                id: OutboundId(3),
            },
            cat(&[&[1], &le32(3)]),
        ),
        (Command::EngineWrite, Response::Status(1), vec![1]),
        (Command::EngineWait, Response::Status(0), vec![0]),
        (Command::EngineClose, Response::Status(1), vec![1]),
    ];
    for (cmd, resp, bytes) in cases {
        assert_eq!(resp.encode_payload(), bytes, "{}", cmd.name());
        assert_eq!(Response::decode(cmd, &bytes, 0).unwrap(), resp);
        assert!(response_size(cmd, 0).unwrap().allows(bytes.len()));
    }
    // Refused: an address without a backend, a descriptor with ok = 0,
    // oversized variable parts, wrong fixed sizes.
    assert!(Response::decode(Command::EngineInfo, &[0, 1], 0).is_err());
    assert!(Response::decode(Command::EngineInfo, &[], 0).is_err());
    assert!(Response::decode(Command::EngineOpenInbound, &[0, 0, 0, 0, 0, 9], 0).is_err());
    assert!(Response::decode(Command::EngineOpenInbound, &[1, 0, 0], 0).is_err());
    let big = cat(&[&[1], &le32(1), &vec![0; MAX_ENGINE_BYTES + 1]]);
    assert!(Response::decode(Command::EngineOpenInbound, &big, 0).is_err());
    assert!(
        !response_size(Command::EngineOpenInbound, 0)
            .unwrap()
            .allows(big.len())
    );
    assert!(Response::decode(Command::EngineOpenOutbound, &[1, 0, 0, 0], 0).is_err());
    assert!(Response::decode(Command::EngineWrite, &[1, 1], 0).is_err());
    assert_eq!(
        response_size(Command::EngineInfo, 0),
        Some(ResponseSize::Between(1, 1 + MAX_ENGINE_BYTES))
    );
    assert_eq!(
        response_size(Command::EngineWait, 0),
        Some(ResponseSize::Exact(1))
    );
    assert_eq!(expected_size(Command::EngineOpenOutbound, 0), Some(5));
}

#[test]
fn engine_feature_bit_and_immediates() {
    let with = ExtInfo::decode(&ExtInfo::ours_with_engine(true).encode()).unwrap();
    let without = ExtInfo::decode(&ExtInfo::ours_with_engine(false).encode()).unwrap();
    assert!(with.has(FEATURE_ENGINE) && !without.has(FEATURE_ENGINE));
    assert_eq!(without, ExtInfo::ours());
    assert_eq!(lane_imm(LaneId(0x12), 0x0003_4567), 0x0012_4567);
}

fn arb_engine_request() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 1..64)
        )
            .prop_map(|(b, o, s, a)| {
                Request::EngineOpenInbound {
                    buffer: b,
                    offset: o,
                    size: s,
                    sender: &a,
                }
                .encode_frame()
            }),
        (
            prop::collection::vec(any::<u8>(), 1..64),
            prop::collection::vec(any::<u8>(), 1..64),
            any::<u32>()
        )
            .prop_map(|(d, r, l)| {
                Request::EngineOpenOutbound {
                    destination: &d,
                    descriptor: &r,
                    lane: LaneId(l),
                }
                .encode_frame()
            }),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(l, s, t, z)| {
            Request::EngineWait {
                lane: LaneId(l),
                seq: s,
                timeout_ms: t,
                size: z,
            }
            .encode_frame()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_frames_round_trip_and_mutations_never_panic(
        frame in arb_engine_request(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let limits = Limits::default();
        let (cmd, payload, used) = split_request(&frame, &limits).unwrap().unwrap();
        prop_assert_eq!(used, frame.len());
        let req = Request::decode(cmd, payload).unwrap();
        prop_assert_eq!(req.encode_frame(), frame.clone());
        // Any one-byte change decodes to something that re-encodes the same
        // bytes, or is refused; never a panic.
        let mut bad = frame.clone();
        let i = at.index(bad.len());
        bad[i] = byte;
        if let Ok(Some((c, p, n))) = split_request(&bad, &limits) {
            if let Ok(r) = Request::decode(c, p) {
                prop_assert_eq!(r.encode_frame(), bad[..n].to_vec());
            }
        }
    }

    #[test]
    fn random_engine_responses_never_panic(
        cmd in 0xC3u8..=0xC8,
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let c = Command::from_byte(cmd).unwrap();
        if let Ok(r) = Response::decode(c, &bytes, 0) {
            prop_assert_eq!(r.encode_payload(), bytes);
        }
    }
}
