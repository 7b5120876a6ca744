//! Work-request building without a device: splitting, immediates,
//! signalling and the doorbell chains, for arbitrary page lists.

use proptest::prelude::*;
use transfer_core::OpToken;
use transfer_verbs::rdma_op::{SendChain, Work, WorkKind, WriteSpec, expand_writes, must_signal};
use transfer_verbs::sys;

fn page_list(pages: &[(u64, u64, u64)], imm: Option<u32>) -> Vec<WriteSpec> {
    pages
        .iter()
        .map(|&(src, dst, len)| WriteSpec {
            local: 0x10_0000 + src,
            len,
            lkey: 7,
            remote_addr: 0x7000_0000 + dst,
            rkey: 9,
            imm,
        })
        .collect()
}

/// Replays the domain's posting loop over `works` and returns (chains, signalled flags).
fn post_all(
    works: &[Work],
    chain_len: usize,
    interval: usize,
    sq_depth: usize,
) -> Vec<Vec<(bool, Work)>> {
    let mut chain = SendChain::new(chain_len);
    let mut out = Vec::new();
    let mut run = 0;
    let mut sq_used = 0;
    let mut i = 0;
    while i < works.len() {
        chain.clear();
        let n = chain_len.min(works.len() - i).min(sq_depth - sq_used);
        let mut posted = Vec::new();
        for (k, w) in works[i..i + n].iter().enumerate() {
            let sig = must_signal(w.last, run, interval, sq_used + k + 1, sq_depth);
            assert!(chain.push(w, (i + k) as u64, sig));
            run = if sig { 0 } else { run + 1 };
            posted.push((sig, *w));
        }
        // Check the linked list.
        let wrs = chain.wrs();
        for (k, wr) in wrs.iter().enumerate() {
            if k + 1 < wrs.len() {
                assert!(std::ptr::eq(wr.next, &wrs[k + 1]));
            } else {
                assert!(wr.next.is_null());
            }
            let w = posted[k].1;
            assert_eq!(wr.num_sge, i32::from(w.len > 0));
            // SAFETY: sg_list points into the chain's own SGE array.
            let sge = unsafe { *wr.sg_list };
            assert_eq!((sge.addr, sge.length, sge.lkey), (w.local, w.len, w.lkey));
            assert_eq!(wr.send_flags & sys::IBV_SEND_SIGNALED != 0, posted[k].0);
            match w.kind {
                WorkKind::Write {
                    remote_addr,
                    rkey,
                    imm,
                } => {
                    assert_eq!(wr.rdma_remote_addr(), remote_addr);
                    assert_eq!(wr.rdma_rkey(), rkey);
                    match imm {
                        Some(v) => {
                            assert_eq!(wr.opcode, sys::IBV_WR_RDMA_WRITE_WITH_IMM);
                            assert_eq!(u32::from_be(wr.imm_data), v);
                        }
                        None => assert_eq!(wr.opcode, sys::IBV_WR_RDMA_WRITE),
                    }
                }
                WorkKind::Send { .. } => assert_eq!(wr.opcode, sys::IBV_WR_SEND),
            }
        }
        // Completions of the signalled WRs free the queue.
        sq_used += n;
        if posted.iter().any(|p| p.0) {
            sq_used = posted.iter().rev().take_while(|p| !p.0).count();
        }
        out.push(posted);
        i += n;
    }
    out
}

#[test]
fn a_big_write_is_split_and_the_imm_rides_on_the_last_piece() {
    let mut w = Vec::new();
    expand_writes(
        OpToken(1),
        &page_list(&[(0, 0, 10_000)], Some(5)),
        4096,
        &mut w,
    )
    .unwrap();
    assert_eq!(w.len(), 3);
    assert_eq!(
        w.iter().map(|w| w.len).collect::<Vec<_>>(),
        vec![4096, 4096, 1808]
    );
    assert_eq!(
        w.iter().map(|w| w.local).collect::<Vec<_>>(),
        vec![0x10_0000, 0x10_1000, 0x10_2000]
    );
    let imms: Vec<_> = w
        .iter()
        .map(|w| match w.kind {
            WorkKind::Write { imm, .. } => imm,
            WorkKind::Send { .. } => None,
        })
        .collect();
    assert_eq!(imms, vec![None, None, Some(5)]);
    assert_eq!(
        w.iter().map(|w| w.last).collect::<Vec<_>>(),
        vec![false, false, true]
    );
}

#[test]
fn zero_length_write_posts_no_sge() {
    let mut w = Vec::new();
    expand_writes(
        OpToken(1),
        &page_list(&[(0, 0, 0)], Some(77)),
        1 << 31,
        &mut w,
    )
    .unwrap();
    assert_eq!(w.len(), 1);
    let chains = post_all(&w, 4, 16, 64);
    assert_eq!(chains.len(), 1);
    assert!(chains[0][0].0, "the only WR is signalled");
}

#[test]
fn four_wrs_per_doorbell_and_selective_signalling() {
    let pages: Vec<_> = (0..37u64).map(|i| (i * 8192, i * 4096 * 3, 4000)).collect();
    let mut w = Vec::new();
    expand_writes(OpToken(3), &page_list(&pages, None), 1 << 31, &mut w).unwrap();
    let chains = post_all(&w, 4, 16, 256);
    assert_eq!(chains.len(), 10);
    assert!(chains.iter().all(|c| c.len() <= 4));
    let signalled: Vec<usize> = chains
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, p)| p.0)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(signalled, vec![15, 31, 36]);
}

#[test]
fn the_wr_that_fills_the_send_queue_is_signalled() {
    assert!(must_signal(false, 0, 100, 8, 8));
    assert!(!must_signal(false, 0, 100, 7, 8));
    assert!(must_signal(true, 0, 100, 1, 8));
    assert!(must_signal(false, 15, 16, 1, 256));
}

proptest! {
    #[test]
    fn any_page_list_is_covered_exactly_once(
        pages in proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20, 0u64..20_000), 1..60),
        max_msg in 1u32..9000,
        chain_len in 1usize..6,
        interval in 1usize..20,
        sq_depth in 1usize..40,
        imm in proptest::option::of(any::<u32>()),
    ) {
        let specs = page_list(&pages, imm);
        let mut w = Vec::new();
        expand_writes(OpToken(9), &specs, max_msg, &mut w).unwrap();
        // Pieces cover each write exactly, in order, within max_msg.
        let mut k = 0;
        for s in &specs {
            let mut off = 0u64;
            loop {
                let p = w[k];
                prop_assert_eq!(p.local, s.local + off);
                prop_assert!(p.len <= max_msg);
                match p.kind {
                    WorkKind::Write { remote_addr, imm: pi, .. } => {
                        prop_assert_eq!(remote_addr, s.remote_addr + off);
                        off += u64::from(p.len);
                        if off == s.len { prop_assert_eq!(pi, s.imm); } else { prop_assert_eq!(pi, None); }
                    }
                    WorkKind::Send { .. } => prop_assert!(false),
                }
                k += 1;
                if off == s.len { break; }
            }
        }
        prop_assert_eq!(k, w.len());
        prop_assert_eq!(w.iter().filter(|x| x.last).count(), 1);
        prop_assert!(w.last().unwrap().last);
        let chains = post_all(&w, chain_len, interval, sq_depth);
        let flat: Vec<_> = chains.iter().flatten().collect();
        prop_assert_eq!(flat.len(), w.len());
        prop_assert!(flat.last().unwrap().0, "the last WR is signalled");
        let mut run = 0;
        for p in &flat {
            if p.0 { run = 0 } else { run += 1 }
            prop_assert!(run < interval.max(1));
        }
    }
}
