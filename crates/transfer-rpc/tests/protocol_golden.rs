//! Golden byte vectors for every request and response layout, and round trips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use transfer_rpc::protocol::frame::encode_request;
use transfer_rpc::protocol::hello::{ExtInfo, HelloRequest, HelloResponse};
use transfer_rpc::protocol::{
    Command, GraphPayload, Limits, Request, Response, RpcTensor, split_request,
};

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn tensor(id: u64) -> RpcTensor {
    let mut t = RpcTensor {
        id,
        ty: 0,
        buffer: 0x1111,
        ne: [4, 1, 1, 1],
        nb: [4, 16, 16, 16],
        data: 0x2222,
        ..RpcTensor::default()
    };
    t.set_name("t");
    t
}

/// Full frame: cmd | size | payload.
fn frame(cmd: u8, payload: &[u8]) -> Vec<u8> {
    cat(&[&[cmd], &le64(payload.len() as u64), payload])
}

#[test]
fn every_request_layout() {
    let t = tensor(1);
    let u = tensor(2);
    let tb = t.encode();
    let ub = u.encode();
    assert_eq!(tb.len(), 296);
    let mut srcs: [RpcTensor; 10] = Default::default();
    srcs[0] = u.clone();
    let srcs_bytes: Vec<u8> = srcs.iter().flat_map(RpcTensor::encode).collect();
    let data = [9u8, 8, 7];
    let graph = GraphPayload {
        device: 0,
        nodes: vec![1],
        tensors: vec![t.clone()],
    };

    let cases: Vec<(Request<'_>, Vec<u8>)> = vec![
        (
            Request::AllocBuffer {
                device: 1,
                size: 0x0203,
            },
            frame(0, &cat(&[&le32(1), &le64(0x0203)])),
        ),
        (Request::GetAlignment { device: 2 }, frame(1, &le32(2))),
        (Request::GetMaxSize { device: 3 }, frame(2, &le32(3))),
        (
            Request::BufferGetBase { remote_ptr: 0xAB },
            frame(3, &le64(0xAB)),
        ),
        (
            Request::FreeBuffer { remote_ptr: 0xCD },
            frame(4, &le64(0xCD)),
        ),
        (
            Request::BufferClear {
                remote_ptr: 0xEF,
                value: 5,
            },
            frame(5, &cat(&[&le64(0xEF), &[5]])),
        ),
        (
            Request::SetTensor {
                tensor: Box::new(t.clone()),
                cache_flag: 1,
                offset: 16,
                data: &data,
            },
            frame(6, &cat(&[&tb, &[1], &le64(16), &data])),
        ),
        (
            Request::SetTensorHash {
                tensor: Box::new(t.clone()),
                offset: 4,
                hash: 0xFEED,
            },
            frame(7, &cat(&[&tb, &le64(4), &le64(0xFEED)])),
        ),
        (
            Request::GetTensor {
                tensor: Box::new(t.clone()),
                offset: 4,
                size: 8,
            },
            frame(8, &cat(&[&tb, &le64(4), &le64(8)])),
        ),
        (
            Request::CopyTensor {
                src: Box::new(t.clone()),
                dst: Box::new(u.clone()),
            },
            frame(9, &cat(&[&tb, &ub])),
        ),
        (
            Request::GraphCompute(Box::new(graph.clone())),
            frame(10, &cat(&[&le32(0), &le32(1), &le64(1), &le32(1), &tb])),
        ),
        (Request::GetDeviceMemory { device: 4 }, frame(11, &le32(4))),
        (
            Request::InitTensor {
                tensor: Box::new(t.clone()),
            },
            frame(12, &tb),
        ),
        (
            Request::GetAllocSize {
                device: 0,
                tensor: Box::new(t.clone()),
                srcs: Box::new(srcs.clone()),
            },
            frame(13, &cat(&[&le32(0), &tb, &srcs_bytes])),
        ),
        (
            Request::Hello(HelloRequest::default()),
            frame(14, &[0u8; 24]),
        ),
        (Request::DeviceCount, frame(15, &[])),
        (Request::GraphRecompute { device: 0 }, frame(16, &le32(0))),
        (
            Request::MemsetTensor {
                tensor: Box::new(t.clone()),
                offset: 1,
                size: 2,
                value: 3,
            },
            frame(17, &cat(&[&tb, &le64(1), &le64(2), &[3]])),
        ),
        (Request::ExtQuery, frame(0xC0, &[])),
        (
            Request::CopyTensorTo {
                src: Box::new(t.clone()),
                dst: Box::new(u.clone()),
                size: 16,
                mark: None,
                endpoint: "10.0.0.2:50052".into(),
            },
            frame(
                0xC1,
                &cat(&[&tb, &ub, &le64(16), &le32(14), b"10.0.0.2:50052"]),
            ),
        ),
        (Request::PeerBarrier, frame(0xC2, &[])),
        // The engine extension (more cases in tests/engine_protocol.rs).
        (Request::EngineInfo, frame(0xC3, &[])),
        (
            Request::EngineOpenInbound {
                buffer: 1,
                offset: 2,
                size: 3,
                sender: b"s",
            },
            frame(0xC4, &cat(&[&le64(1), &le64(2), &le64(3), &le32(1), b"s"])),
        ),
        (
            Request::EngineOpenOutbound {
                destination: b"d",
                descriptor: b"r",
                lane: transfer_rpc::protocol::LaneId(5),
            },
            frame(0xC5, &cat(&[&le32(1), b"d", &le32(1), b"r", &le32(5)])),
        ),
        (
            Request::EngineWrite {
                outbound: transfer_rpc::protocol::OutboundId(1),
                src: Box::new(t.clone()),
                src_offset: 0,
                size: 16,
                dst_offset: 4,
                seq: 9,
            },
            frame(
                0xC6,
                &cat(&[&le32(1), &tb, &le64(0), &le64(16), &le64(4), &le32(9)]),
            ),
        ),
        (
            Request::EngineWait {
                lane: transfer_rpc::protocol::LaneId(5),
                seq: 9,
                timeout_ms: 100,
                size: 16,
            },
            frame(0xC7, &cat(&[&le32(5), &le32(9), &le32(100), &le64(16)])),
        ),
        (
            Request::EngineClose {
                kind: transfer_rpc::protocol::CloseKind::Inbound,
                id: 5,
            },
            frame(0xC8, &cat(&[&[0], &le32(5)])),
        ),
        // The marks (server/marks.rs).
        (Request::MarkOpen, frame(0xC9, &[])),
        (
            Request::MarkWait {
                key: 7,
                seq: 3,
                timeout_ms: 100,
            },
            frame(0xCA, &cat(&[&le64(7), &le64(3), &le32(100)])),
        ),
        (
            Request::PeerMark { key: 7, seq: 3 },
            frame(0xCB, &cat(&[&le64(7), &le64(3)])),
        ),
        (
            Request::CopyTensorTo {
                src: Box::new(t.clone()),
                dst: Box::new(u.clone()),
                size: 16,
                mark: Some((7, 3)),
                endpoint: "10.0.0.2:50052".into(),
            },
            frame(
                0xCC,
                &cat(&[
                    &tb,
                    &ub,
                    &le64(16),
                    &le64(7),
                    &le64(3),
                    &le32(14),
                    b"10.0.0.2:50052",
                ]),
            ),
        ),
    ];
    assert_eq!(cases.len(), Command::ALL.len());
    let sizes = [
        (Command::GetAllocSize, 3260usize),
        (Command::SetTensorHash, 312),
        (Command::GetTensor, 312),
        (Command::CopyTensor, 592),
        (Command::MemsetTensor, 313),
    ];
    for (req, want) in &cases {
        let got = req.encode_frame();
        assert_eq!(&got, want, "{}", req.command().name());
        let (cmd, payload, used) = split_request(&got, &Limits::default()).unwrap().unwrap();
        assert_eq!(used, got.len());
        assert_eq!(cmd, req.command());
        assert_eq!(
            &Request::decode(cmd, payload).unwrap(),
            req,
            "{}",
            cmd.name()
        );
        if let Some((_, n)) = sizes.iter().find(|(c, _)| *c == cmd) {
            assert_eq!(payload.len(), *n, "{}", cmd.name());
        }
        // Fixed-size requests refuse one byte more or less.
        if !matches!(cmd, Command::SetTensor) && !payload.is_empty() {
            assert!(Request::decode(cmd, &payload[..payload.len() - 1]).is_err());
            let mut longer = payload.to_vec();
            longer.push(0);
            assert!(Request::decode(cmd, &longer).is_err(), "{}", cmd.name());
        }
    }
}

#[test]
fn every_response_layout() {
    let cases: Vec<(Command, Response, Vec<u8>)> = vec![
        (
            Command::AllocBuffer,
            Response::AllocBuffer {
                remote_ptr: 0x10,
                remote_size: 0x20,
            },
            cat(&[&le64(0x10), &le64(0x20)]),
        ),
        (Command::GetAlignment, Response::U64(32), le64(32)),
        (Command::GetMaxSize, Response::U64(1 << 40), le64(1 << 40)),
        (Command::BufferGetBase, Response::U64(0x1000), le64(0x1000)),
        (Command::GetAllocSize, Response::U64(96), le64(96)),
        (Command::SetTensorHash, Response::Status(1), vec![1]),
        (Command::CopyTensor, Response::Status(0), vec![0]),
        (Command::CopyTensorTo, Response::Status(1), vec![1]),
        (Command::PeerBarrier, Response::Status(1), vec![1]),
        (Command::MarkOpen, Response::U64(7), le64(7)),
        (Command::MarkWait, Response::Status(1), vec![1]),
        (Command::PeerMark, Response::Status(0), vec![0]),
        (Command::CopyTensorToMark, Response::Status(1), vec![1]),
        (
            Command::GetDeviceMemory,
            Response::DeviceMemory { free: 1, total: 2 },
            cat(&[&le64(1), &le64(2)]),
        ),
        (Command::DeviceCount, Response::DeviceCount(3), le32(3)),
        (
            Command::Hello,
            Response::Hello(HelloResponse::ours()),
            cat(&[&[7, 0, 0, 0], &[0u8; 24]]),
        ),
        (
            Command::ExtQuery,
            Response::Ext(ExtInfo::ours()),
            cat(&[b"TRPC", &[1, 0, 0, 0], &le64(11)]),
        ),
        (
            Command::GetTensor,
            Response::Data(vec![1, 2, 3]),
            vec![1, 2, 3],
        ),
    ];
    for (cmd, resp, want) in cases {
        assert_eq!(resp.encode_payload(), want, "{}", cmd.name());
        let framed = transfer_rpc::protocol::encode_response(&want);
        assert_eq!(&framed[..8], &le64(want.len() as u64)[..]);
        assert_eq!(Response::decode(cmd, &want, want.len()).unwrap(), resp);
        let mut longer = want.clone();
        longer.push(0);
        assert!(
            Response::decode(cmd, &longer, want.len()).is_err(),
            "{}",
            cmd.name()
        );
    }
    for cmd in [
        Command::FreeBuffer,
        Command::BufferClear,
        Command::SetTensor,
        Command::GraphCompute,
        Command::InitTensor,
        Command::GraphRecompute,
        Command::MemsetTensor,
    ] {
        assert!(!cmd.has_response());
        assert!(Response::decode(cmd, &[], 0).is_err());
    }
}

#[test]
fn copy_tensor_to_endpoint_checks() {
    let t = tensor(1).encode();
    let base = cat(&[&t, &t, &le64(4)]);
    // empty, too long, length disagreeing with bytes, not UTF-8
    for bad in [
        cat(&[&base, &le32(0)]),
        cat(&[&base, &le32(256), &[b'a'; 256]]),
        cat(&[&base, &le32(5), b"abc"]),
        cat(&[&base, &le32(2), &[0xFF, 0xFE]]),
    ] {
        assert!(Request::decode(Command::CopyTensorTo, &bad).is_err());
    }
    let f = encode_request(Command::CopyTensorTo, &cat(&[&base, &le32(3), b"a:1"]));
    assert!(split_request(&f, &Limits::default()).unwrap().is_some());
}

#[test]
fn expected_response_sizes_match_encodings() {
    use transfer_rpc::protocol::response::expected_size;
    assert_eq!(expected_size(Command::Hello, 0), Some(28));
    assert_eq!(expected_size(Command::ExtQuery, 0), Some(16));
    assert_eq!(expected_size(Command::GetTensor, 77), Some(77));
    assert_eq!(expected_size(Command::SetTensor, 0), None);
    for c in Command::ALL {
        assert_eq!(
            expected_size(c, 0).is_some(),
            c.has_response(),
            "{}",
            c.name()
        );
    }
}
