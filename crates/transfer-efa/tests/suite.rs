//! The libfabric domain over real providers on loopback: tcp, shm, udp.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Buf, Seen, complete, drive, open, open_with};
use transfer_core::{Domain, NicAddress, OpToken, RecvToken, RemoteKey, TransferError};
use transfer_efa::{LibfabricConfig, Provider};

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// Byte-for-byte comparison that reports the first difference only.
fn same(got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "first difference at byte {i} of {}: got {} want {}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

fn write_with_and_without_imm(p: Provider) {
    let Some(mut d) = open(p.clone(), 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let src = Buf::new(a, 1 << 20, pattern);
    let dst = Buf::new(b, 1 << 20, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();

    a.submit_writes(
        OpToken(1),
        &[src.write_to(0, 300_000, peer, &dst, 1000, None)],
    );
    complete(&mut [a, b], &mut seen, OpToken(1)).unwrap();
    same(&dst.mem[1000..301_000], &src.mem[..300_000]);
    assert!(dst.mem[..1000].iter().all(|&x| x == 0));
    assert!(dst.mem[301_000..].iter().all(|&x| x == 0));
    assert!(seen.imms.is_empty());

    a.submit_writes(
        OpToken(2),
        &[src.write_to(5, 1 << 19, peer, &dst, 1 << 19, Some(0xdead_beef))],
    );
    complete(&mut [a, b], &mut seen, OpToken(2)).unwrap();
    drive(&mut [a, b], &mut seen, |s| !s.imms.is_empty());
    assert_eq!(seen.imms, vec![0xdead_beef]);
    same(&dst.mem[1 << 19..], &src.mem[5..(1 << 19) + 5]);
    assert!(!a.has_pending());
}

fn zero_byte_imm(p: Provider) {
    let Some(mut d) = open(p.clone(), 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let src = Buf::new(a, 4096, pattern);
    let dst = Buf::new(b, 4096, |_| 7);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();
    a.submit_writes(OpToken(9), &[src.write_to(0, 0, peer, &dst, 0, Some(42))]);
    complete(&mut [a, b], &mut seen, OpToken(9)).unwrap();
    drive(&mut [a, b], &mut seen, |s| !s.imms.is_empty());
    assert_eq!(seen.imms, vec![42]);
    assert!(dst.mem.iter().all(|&x| x == 7));
}

fn batches(p: Provider) {
    let Some(mut d) = open_with(LibfabricConfig::loopback(p).with_post_batch(8), 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    const N: usize = 200;
    const S: usize = 4096;
    let src = Buf::new(a, N * S, pattern);
    let dst = Buf::new(b, N * S, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();
    for round in 0..3u64 {
        let writes: Vec<_> = (0..N)
            .map(|i| {
                src.write_to(
                    i * S,
                    S,
                    peer,
                    &dst,
                    (N - 1 - i) * S,
                    (i % 4 == 0).then_some(i as u32),
                )
            })
            .collect();
        a.submit_writes(OpToken(100 + round), &writes);
    }
    for round in 0..3u64 {
        complete(&mut [a, b], &mut seen, OpToken(100 + round)).unwrap();
    }
    drive(&mut [a, b], &mut seen, |s| s.imms.len() == 3 * N / 4);
    assert_eq!(seen.completed.len(), 3, "exactly one Completed per submit");
    for i in 0..N {
        same(
            &dst.mem[(N - 1 - i) * S..(N - i) * S],
            &src.mem[i * S..(i + 1) * S],
        );
    }
    let mut imms = seen.imms.clone();
    imms.sort_unstable();
    let mut want: Vec<u32> = (0..3)
        .flat_map(|_| (0..N as u32).filter(|i| i % 4 == 0))
        .collect();
    want.sort_unstable();
    assert_eq!(imms, want);
}

fn send_recv(p: Provider) {
    let Some(mut d) = open(p.clone(), 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    const SLOT: usize = 8192;
    let mut pool = Buf::new(b, 8 * SLOT, |_| 0);
    for i in 0..8 {
        let buf = pool.mem[i * SLOT..].as_mut_ptr();
        b.post_recv(RecvToken(i as u64), pool.mr, buf, SLOT)
            .unwrap();
    }
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();
    let msgs: Vec<Vec<u8>> = (0..5)
        .map(|k| (0..100 + k * 1000).map(|i| (i + k) as u8).collect())
        .collect();
    for (k, m) in msgs.iter().enumerate() {
        a.submit_send(OpToken(k as u64), peer, m.clone());
    }
    for k in 0..5 {
        complete(&mut [a, b], &mut seen, OpToken(k)).unwrap();
    }
    drive(&mut [a, b], &mut seen, |s| s.received.len() == 5);
    let mut got: Vec<Vec<u8>> = seen
        .received
        .iter()
        .map(|&(t, len)| pool.mem[t as usize * SLOT..t as usize * SLOT + len].to_vec())
        .collect();
    got.sort_by_key(|m| m.len());
    assert_eq!(got, msgs);
    // A message larger than the send bounce slot still goes through.
    let big: Vec<u8> = (0..SLOT).map(pattern).collect();
    a.submit_send(OpToken(50), peer, big.clone());
    complete(&mut [a, b], &mut seen, OpToken(50)).unwrap();
    drive(&mut [a, b], &mut seen, |s| s.received.len() == 6);
    let (t, len) = seen.received[5];
    assert_eq!(
        &pool.mem[t as usize * SLOT..t as usize * SLOT + len],
        big.as_slice()
    );
    pool.mem.clear();
}

fn bad_remote_access(p: Provider) {
    // udp;ofi_rxd and shm never complete a refused write (measured, with
    // and without delivery-complete): only the peer timeout ends it, so
    // keep it short there. On shm the domain then replaces the wedged
    // transmit endpoint and goes on (issue 22; this test used to stop
    // there); udp stays wedged.
    let mut cfg = LibfabricConfig::loopback(p.clone());
    let wedges = matches!(p, Provider::Udp);
    if matches!(p, Provider::Udp | Provider::Shm) {
        cfg = cfg.with_peer_timeout(Duration::from_secs(2));
    }
    let Some(mut d) = open_with(cfg, 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let src = Buf::new(a, 1 << 16, pattern);
    let dst = Buf::new(b, 1 << 16, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();

    let mut wrong_key = src.write_to(0, 4096, peer, &dst, 0, Some(1));
    wrong_key.remote_key = RemoteKey(dst.remote.key.0 ^ 0x5a5a_0000);
    a.submit_writes(OpToken(1), &[wrong_key]);
    let r = complete(&mut [a, b], &mut seen, OpToken(1));
    eprintln!("{p}: wrong key -> {r:?}");
    let strict = a.reports_remote_errors();
    if strict {
        assert!(r.is_err(), "wrong key must fail");
    } else {
        eprintln!(
            "{p}: provider drops refused writes silently (no delivery-complete); checking the target is untouched"
        );
    }
    if wedges {
        // The refused write stays stuck in the provider: the peer is wedged
        // for good (later writes time out too), so stop after checking
        // that the refusal surfaced as an error and the target is untouched.
        assert!(dst.mem.iter().all(|&x| x == 0));
        return;
    }

    let mut out_of_range = src.write_to(0, 4096, peer, &dst, 0, None);
    out_of_range.remote_addr = dst.remote.base + (1 << 16) - 100;
    a.submit_writes(OpToken(2), &[out_of_range]);
    let r = complete(&mut [a, b], &mut seen, OpToken(2));
    eprintln!("{p}: out of range -> {r:?}");
    assert!(r.is_err() || !strict, "out-of-range write must fail");
    assert!(dst.mem.iter().all(|&x| x == 0));

    // The domains keep working afterwards.
    let peer = a.resolve_peer(&b.address()).unwrap();
    a.submit_writes(OpToken(3), &[src.write_to(0, 4096, peer, &dst, 0, None)]);
    let r = complete(&mut [a, b], &mut seen, OpToken(3));
    if let Err(TransferError::PeerUnreachable { .. }) = &r {
        // A provider that tore the connection down after the error: a fresh
        // resolve must recover.
        a.remove_peer(peer);
        let peer = a.resolve_peer(&b.address()).unwrap();
        a.submit_writes(OpToken(4), &[src.write_to(0, 4096, peer, &dst, 0, None)]);
        complete(&mut [a, b], &mut seen, OpToken(4)).unwrap();
    } else {
        r.unwrap();
    }
    same(&dst.mem[..4096], &src.mem[..4096]);
}

/// Issue 22: on libfabric 1.17 shm one refused write wedged the writer's
/// endpoint: no later write of it completed, to that peer or any other
/// (see `domain/connection.rs`). Now the domain replaces its transmit
/// endpoint, and both peers take writes again, with imm.
#[test]
fn shm_refused_write_leaves_every_peer_working() {
    let cfg =
        LibfabricConfig::loopback(Provider::Shm).with_peer_timeout(Duration::from_millis(500));
    let Some(mut d) = open_with(cfg, 3) else {
        return;
    };
    let (a, rest) = d.split_at_mut(1);
    let (b, c) = rest.split_at_mut(1);
    let (a, b, c) = (&mut a[0], &mut b[0], &mut c[0]);
    let src = Buf::new(a, 1 << 16, pattern);
    let to_b = Buf::new(b, 1 << 16, |_| 0);
    let to_c = Buf::new(c, 1 << 16, |_| 0);
    let pb = a.resolve_peer(&b.address()).unwrap();
    let pc = a.resolve_peer(&c.address()).unwrap();
    let mut seen = Seen::default();
    for (len, tok) in [(64, 1u64), (1 << 16, 10)] {
        // Small writes go by shm's SAR protocol, 64 KiB ones by CMA: both wedged.
        let mut wrong_key = src.write_to(0, len, pb, &to_b, 0, None);
        wrong_key.remote_key = RemoteKey(to_b.remote.key.0 ^ 0x5a5a_0000);
        a.submit_writes(OpToken(tok), &[wrong_key]);
        let r = complete(&mut [&mut *a, &mut *b, &mut *c], &mut seen, OpToken(tok));
        assert!(r.is_err(), "a wrong key succeeded");
        for (i, (peer, dst)) in [(pc, &to_c), (pb, &to_b)].into_iter().enumerate() {
            let op = OpToken(tok + 1 + i as u64);
            a.submit_writes(op, &[src.write_to(0, len, peer, dst, 0, Some(7))]);
            complete(&mut [&mut *a, &mut *b, &mut *c], &mut seen, op).unwrap();
            same(&dst.mem[..len], &src.mem[..len]);
        }
    }
    assert_eq!(seen.imms.iter().filter(|&&i| i == 7).count(), 4);
}

fn malformed_addresses(p: Provider) {
    let Some(mut d) = open(p, 1) else { return };
    let a = &mut d[0];
    let good = a.address().0;
    let mut cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0; 3],
        b"LF".to_vec(),
        vec![0xff; 64],
        vec![0; 4096],
    ];
    for cut in 0..good.len() {
        cases.push(good[..cut].to_vec());
    }
    let mut longer = good.clone();
    longer.extend_from_slice(&[1, 2, 3]);
    cases.push(longer);
    let mut other_prov = good.clone();
    other_prov[4] ^= 0x20;
    cases.push(other_prov);
    for c in cases {
        match a.resolve_peer(&NicAddress(c.clone())) {
            Err(TransferError::Malformed { .. }) => {}
            other => panic!("{c:?} -> {other:?}"),
        }
    }
    // Unknown peer ids fail as completions, not panics.
    let mut seen = Seen::default();
    a.submit_send(OpToken(77), transfer_core::PeerId(12345), vec![1, 2, 3]);
    let r = complete(&mut [a], &mut seen, OpToken(77));
    assert!(
        matches!(r, Err(TransferError::PeerUnreachable { .. })),
        "{r:?}"
    );
}

fn multi_domain(p: Provider) {
    let Some(mut d) = open(p, 3) else { return };
    let [a, b, c] = &mut d[..] else {
        unreachable!()
    };
    let src = Buf::new(a, 1 << 16, pattern);
    let db = Buf::new(b, 1 << 16, |_| 0);
    let dc = Buf::new(c, 1 << 16, |_| 0);
    let pb = a.resolve_peer(&b.address()).unwrap();
    let pc = a.resolve_peer(&c.address()).unwrap();
    assert_ne!(pb, pc);
    assert_eq!(
        a.resolve_peer(&b.address()).unwrap(),
        pb,
        "addresses are cached"
    );
    let mut seen = Seen::default();
    a.submit_writes(
        OpToken(5),
        &[
            src.write_to(0, 1 << 15, pb, &db, 0, Some(1)),
            src.write_to(1 << 15, 1 << 15, pc, &dc, 1 << 15, Some(2)),
        ],
    );
    complete(&mut [a, b, c], &mut seen, OpToken(5)).unwrap();
    drive(&mut [a, b, c], &mut seen, |s| s.imms.len() == 2);
    assert_eq!(&db.mem[..1 << 15], &src.mem[..1 << 15]);
    assert_eq!(&dc.mem[1 << 15..], &src.mem[1 << 15..]);
}

fn dead_peer(p: Provider) {
    let cfg = LibfabricConfig::loopback(p.clone()).with_peer_timeout(Duration::from_millis(300));
    let Some(mut d) = open_with(cfg, 2) else {
        return;
    };
    let b = d.pop().unwrap();
    let mut a = d.pop().unwrap();
    let src = Buf::new(&mut a, 1 << 16, pattern);
    let b_addr = b.address();
    // Learn the destination's region, then kill it.
    let mut b = b;
    let dst = Buf::new(&mut b, 1 << 16, |_| 0);
    let peer = a.resolve_peer(&b_addr).unwrap();
    let mut seen = Seen::default();
    a.submit_writes(OpToken(1), &[src.write_to(0, 4096, peer, &dst, 0, None)]);
    complete(&mut [&mut a, &mut b], &mut seen, OpToken(1)).unwrap();
    drop(b);

    a.submit_writes(OpToken(2), &[src.write_to(0, 4096, peer, &dst, 0, Some(3))]);
    let r = complete(&mut [&mut a], &mut seen, OpToken(2));
    eprintln!("{p}: write to dead peer -> {r:?}");
    // Some providers accept a write into a dead peer's memory (shm maps it)
    // and never hear back: that shows up as a timeout, never as a hang.
    if r.is_err() {
        common::until_dead(
            &mut a,
            src.write_to(0, 4096, peer, &dst, 0, None),
            &mut seen,
        );
    }
    a.remove_peer(peer);
    drop(dst);
}

macro_rules! suite {
    ($m:ident, $p:expr) => {
        mod $m {
            use super::*;
            #[test]
            fn write_with_and_without_imm() {
                super::write_with_and_without_imm($p)
            }
            #[test]
            fn zero_byte_imm() {
                super::zero_byte_imm($p)
            }
            #[test]
            fn batches() {
                super::batches($p)
            }
            #[test]
            fn send_recv() {
                super::send_recv($p)
            }
            #[test]
            fn bad_remote_access() {
                super::bad_remote_access($p)
            }
            #[test]
            fn malformed_addresses() {
                super::malformed_addresses($p)
            }
            #[test]
            fn multi_domain() {
                super::multi_domain($p)
            }
            #[test]
            fn dead_peer() {
                super::dead_peer($p)
            }
        }
    };
}

suite!(tcp, Provider::Tcp);
suite!(shm, Provider::Shm);
suite!(udp, Provider::Udp);
