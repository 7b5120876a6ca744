//! Peer death over tcp: bounded failure, fail-fast afterwards, and recovery
//! through `remove_peer` + a fresh `resolve_peer`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Buf, Seen, complete, open_with};
use transfer_core::{Domain, DomainEvent, NicAddress, OpToken, TransferError};
use transfer_efa::{LibfabricConfig, Provider};

fn cfg() -> LibfabricConfig {
    LibfabricConfig::loopback(Provider::Tcp).with_peer_timeout(Duration::from_millis(300))
}

/// The TCP port inside one of our tcp NIC addresses (sockaddr_in after the
/// header: b"LF", version, provider length + name, u32 format).
fn port_of(addr: &NicAddress) -> u16 {
    let b = &addr.0;
    let raw = &b[4 + usize::from(b[3]) + 4..];
    u16::from_be_bytes([raw[2], raw[3]])
}

fn assert_fails_fast(
    a: &mut transfer_efa::LibfabricDomain,
    src: &Buf,
    dst: &Buf,
    peer: transfer_core::PeerId,
) {
    a.submit_writes(OpToken(99), &[src.write_to(0, 64, peer, dst, 0, None)]);
    let mut events = Vec::new();
    a.poll(&mut events);
    assert!(
        matches!(
            &events[..],
            [DomainEvent::Completed {
                op: OpToken(99),
                result: Err(TransferError::PeerUnreachable { .. })
            }]
        ),
        "{events:?}"
    );
}

/// A peer that never makes progress: the write fails by timeout, the peer
/// is marked dead; once it is alive again a fresh resolve works.
#[test]
fn silent_peer_times_out_then_recovers() {
    let Some(mut d) = open_with(cfg(), 2) else {
        return;
    };
    let (a, b) = d.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let src = Buf::new(a, 1 << 16, |i| i as u8);
    let dst = Buf::new(b, 1 << 16, |_| 0);
    let peer = a.resolve_peer(&b.address()).unwrap();
    let mut seen = Seen::default();
    // Only `a` is polled: tcp;ofi_rxm needs the peer's progress to accept.
    a.submit_writes(OpToken(1), &[src.write_to(0, 4096, peer, &dst, 0, Some(1))]);
    let r = complete(&mut [&mut *a], &mut seen, OpToken(1));
    eprintln!("silent peer -> {r:?}");
    assert!(
        matches!(
            r,
            Err(TransferError::Timeout { .. } | TransferError::PeerUnreachable { .. })
        ),
        "{r:?}"
    );
    // The timed-out write is still posted in the provider: its source
    // memory must not be released under it.
    assert!(
        matches!(a.unregister(src.mr), Err(TransferError::RegionBusy { .. })),
        "a region with a write still posted was unregistered"
    );
    assert_fails_fast(a, &src, &dst, peer);
    // Cached dead entries stay dead until removed.
    assert_eq!(a.resolve_peer(&b.address()).unwrap(), peer);
    a.remove_peer(peer);
    let peer2 = a.resolve_peer(&b.address()).unwrap();
    assert_ne!(peer, peer2);
    a.submit_writes(OpToken(2), &[src.write_to(0, 4096, peer2, &dst, 0, None)]);
    complete(&mut [&mut *a, &mut *b], &mut seen, OpToken(2)).unwrap();
    assert_eq!(&dst.mem[..4096], &src.mem[..4096]);
}

/// A peer that closes and restarts on the same address and port.
#[test]
fn restarted_peer_at_same_address() {
    let Some(mut d) = open_with(cfg(), 2) else {
        return;
    };
    let mut b = d.pop().unwrap();
    let mut a = d.pop().unwrap();
    let src = Buf::new(&mut a, 1 << 16, |i| i as u8);
    let addr = b.address();
    let port = port_of(&addr);
    let dst = Buf::new(&mut b, 1 << 16, |_| 0);
    let peer = a.resolve_peer(&addr).unwrap();
    let mut seen = Seen::default();
    a.submit_writes(OpToken(1), &[src.write_to(0, 4096, peer, &dst, 0, None)]);
    complete(&mut [&mut a, &mut b], &mut seen, OpToken(1)).unwrap();
    drop(dst);
    drop(b);

    a.submit_writes(OpToken(2), &[src.write_to(0, 64, peer, &src, 0, None)]);
    let r = complete(&mut [&mut a], &mut seen, OpToken(2));
    eprintln!("dead peer -> {r:?}");
    assert!(r.is_err());
    common::until_dead(&mut a, src.write_to(0, 64, peer, &src, 0, None), &mut seen);

    // Restart on the same port.
    let Some(mut d2) = open_with(cfg().with_service(port.to_string()), 1) else {
        return;
    };
    let mut b2 = d2.pop().unwrap();
    assert_eq!(b2.address(), addr, "same address after restart");
    let dst2 = Buf::new(&mut b2, 1 << 16, |_| 0);
    a.remove_peer(peer);
    let peer2 = a.resolve_peer(&b2.address()).unwrap();
    a.submit_writes(
        OpToken(3),
        &[src.write_to(0, 4096, peer2, &dst2, 0, Some(7))],
    );
    complete(&mut [&mut a, &mut b2], &mut seen, OpToken(3)).unwrap();
    assert_eq!(&dst2.mem[..4096], &src.mem[..4096]);
}

/// A silent peer (it never polls, so it never completes anything) must not
/// hold back writes to a live one: the live peer's writes complete while the
/// silent peer's are still pending (they can only end by the timeout).
#[test]
fn silent_peer_does_not_block_others() {
    let config =
        LibfabricConfig::loopback(Provider::Tcp).with_peer_timeout(Duration::from_secs(30));
    let Some(mut d) = open_with(config, 3) else {
        return;
    };
    let (a, rest) = d.split_at_mut(1);
    let (silent, live) = rest.split_at_mut(1);
    let (a, silent, live) = (&mut a[0], &mut silent[0], &mut live[0]);
    let src = Buf::new(a, 1 << 20, |i| i as u8);
    let dst_silent = Buf::new(silent, 1 << 20, |_| 0);
    let dst_live = Buf::new(live, 1 << 20, |_| 0);
    let p_silent = a.resolve_peer(&silent.address()).unwrap();
    let p_live = a.resolve_peer(&live.address()).unwrap();
    let mut seen = Seen::default();
    // Many writes to the silent peer first, then one to the live peer.
    for i in 0..64u64 {
        a.submit_writes(
            OpToken(100 + i),
            &[src.write_to(0, 16384, p_silent, &dst_silent, 0, None)],
        );
    }
    // One call of many writes: all but the first wait in the queue.
    let writes: Vec<_> = (0..64)
        .map(|i| src.write_to(i * 4096, 4096, p_live, &dst_live, i * 4096, Some(5)))
        .collect();
    a.submit_writes(OpToken(1), &writes);
    complete(&mut [&mut *a, &mut *live], &mut seen, OpToken(1)).unwrap();
    assert_eq!(&dst_live.mem[..4096], &src.mem[..4096]);
    assert!(
        !seen
            .completed
            .iter()
            .any(|(op, r)| op.0 >= 100 && r.is_err()),
        "the live peer's write waited for the silent peer's timeout: {:?}",
        seen.completed
    );
}

/// Issue 12: a peer that stopped answering must hold only itself, even
/// when far more work is queued for it than the provider's send queue and
/// a poll pass's post budget hold: the live peer's write, submitted after
/// thousands to the silent one, completes long before the silent peer's
/// timeout.
#[test]
fn stuck_peer_with_a_full_send_queue_holds_only_itself() {
    let config =
        LibfabricConfig::loopback(Provider::Tcp).with_peer_timeout(Duration::from_secs(40));
    let Some(mut d) = open_with(config, 3) else {
        return;
    };
    let (a, rest) = d.split_at_mut(1);
    let (silent, live) = rest.split_at_mut(1);
    let (a, silent, live) = (&mut a[0], &mut silent[0], &mut live[0]);
    let n = (4 * a.tx_queue_size()).max(4096) as u64;
    eprintln!(
        "tx queue {}, {n} writes to the silent peer",
        a.tx_queue_size()
    );
    let src = Buf::new(a, 1 << 20, |i| i as u8);
    let dst_silent = Buf::new(silent, 1 << 20, |_| 0);
    let dst_live = Buf::new(live, 1 << 20, |_| 0);
    let p_silent = a.resolve_peer(&silent.address()).unwrap();
    let p_live = a.resolve_peer(&live.address()).unwrap();
    let mut seen = Seen::default();
    for i in 0..n {
        a.submit_writes(
            OpToken(100 + i),
            &[src.write_to(0, 64 << 10, p_silent, &dst_silent, 0, None)],
        );
        // Progress as a worker would between submits.
        let mut events = Vec::new();
        a.poll(&mut events);
        seen.completed
            .extend(events.into_iter().filter_map(|e| match e {
                transfer_core::DomainEvent::Completed { op, result } => Some((op, result)),
                _ => None,
            }));
    }
    let start = std::time::Instant::now();
    // One call of many writes: all but the first wait in the queue.
    let writes: Vec<_> = (0..64)
        .map(|i| src.write_to(i * 4096, 4096, p_live, &dst_live, i * 4096, Some(5)))
        .collect();
    a.submit_writes(OpToken(1), &writes);
    complete(&mut [&mut *a, &mut *live], &mut seen, OpToken(1)).unwrap();
    eprintln!(
        "live write completed after {:?}; {} silent writes completed, {} calls in flight",
        start.elapsed(),
        seen.completed.iter().filter(|(op, _)| op.0 >= 100).count(),
        a.ops_in_flight()
    );
    assert_eq!(&dst_live.mem[..64 * 4096], &src.mem[..64 * 4096]);
    assert!(
        !seen
            .completed
            .iter()
            .any(|(op, r)| op.0 >= 100 && r.is_err()),
        "the live peer's write waited for the silent peer's timeout"
    );
}
