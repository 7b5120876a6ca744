//! Handshake wire formats: round trips and hostile input.

use proptest::prelude::*;
use transfer_core::NicAddress;
use transfer_verbs::handshake::{
    Hello, VERSION, WireAddress, decode_address, decode_hello, encode_address, encode_hello,
};

fn addr() -> WireAddress {
    WireAddress {
        version: VERSION,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
        global: true,
        lid: 0,
        ud_qpn: 0x11,
        qkey: 0x1234_5678,
        mtu: 5,
        nonce: 0xdead_beef_cafe,
    }
}

fn hello() -> Hello {
    Hello {
        from: addr(),
        to_nonce: 42,
        bye: false,
        conn: 1 << 40,
        peer_conn: Some(7),
        confirmed: true,
        min_peer_conn: 3,
        qpns: [0x12, 0x13],
        psns: [0xabcdef, 0x12345],
    }
}

#[test]
fn address_round_trip() {
    let a = addr();
    assert_eq!(decode_address(&encode_address(&a).unwrap()).unwrap(), a);
}

#[test]
fn hello_round_trip() {
    let h = hello();
    let b = encode_hello(&h).unwrap();
    assert!(b.len() < 256);
    assert_eq!(decode_hello(&b).unwrap(), h);
}

#[test]
fn other_versions_and_garbage_are_refused() {
    let mut a = addr();
    a.version = VERSION + 1;
    assert!(decode_address(&encode_address(&a).unwrap()).is_err());
    assert!(decode_address(&NicAddress(vec![0xab; 3])).is_err());
    assert!(decode_address(&NicAddress(vec![])).is_err());
    let mut b = encode_address(&addr()).unwrap();
    b.0.push(0);
    assert!(decode_address(&b).is_err(), "trailing bytes");
    let mut z = addr();
    z.ud_qpn = 0;
    assert!(decode_address(&encode_address(&z).unwrap()).is_err());
    assert!(decode_hello(b"XXXX").is_err());
    let mut h = hello();
    h.qpns[1] = 0x0100_0000;
    assert!(decode_hello(&encode_hello(&h).unwrap()).is_err());
}

proptest! {
    #[test]
    fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_address(&NicAddress(bytes.clone()));
        let _ = decode_hello(&bytes);
        let mut m = b"TVH1".to_vec();
        m.extend_from_slice(&bytes);
        let _ = decode_hello(&m);
    }

    #[test]
    fn truncations_and_flips_never_panic(cut in 0usize..200, flip in 0usize..200, x in any::<u8>()) {
        let mut b = encode_hello(&hello()).unwrap();
        if !b.is_empty() { let i = flip % b.len(); b[i] ^= x; }
        b.truncate(cut.min(b.len()));
        let _ = decode_hello(&b);
    }
}
