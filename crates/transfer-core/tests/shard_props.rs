//! Property tests of the sharding arithmetic: every byte written exactly
//! once, every shard on the NIC whose keys it carries, for any length,
//! page list and NIC count.

use proptest::prelude::*;
use transfer_core::shard::{
    ShardPolicy, expected_imms, shard_single_write, single_write_shard_count, split_pages,
    split_write, write_pieces,
};
use transfer_core::{GroupAddress, NicAddress, Ordering, WriteShape};

fn policy() -> impl Strategy<Value = ShardPolicy> {
    (0u32..24, 0u32..16).prop_map(|(m, g)| ShardPolicy {
        min_shard_bytes: 1u64 << m,
        granule: 1u64 << g,
    })
}

fn group(nics: usize, ordering: Ordering, shard_policy: ShardPolicy) -> GroupAddress {
    GroupAddress {
        nics: (0..nics).map(|i| NicAddress(vec![i as u8])).collect(),
        ordering,
        shard_policy,
        max_write_size: 0,
    }
}

proptest! {
    #[test]
    fn single_write_covers_every_byte_once(len in 0u64..(1 << 34), nics in 1usize..9, start in 0usize..64, policy in policy()) {
        let shards = shard_single_write(len, nics, start, policy);
        prop_assert_eq!(shards.len(), single_write_shard_count(len, nics, policy));
        prop_assert!(!shards.is_empty() && shards.len() <= nics);
        let mut next = 0u64;
        let mut used = std::collections::HashSet::new();
        for (i, s) in shards.iter().enumerate() {
            prop_assert_eq!(s.offset, next, "shards must tile the write in order");
            prop_assert!(s.len > 0 || len == 0);
            prop_assert!(s.nic < nics);
            prop_assert_eq!(s.nic, (start + i) % nics, "shard i runs on NIC start+i");
            prop_assert!(used.insert(s.nic), "two shards on one NIC");
            if i + 1 < shards.len() {
                prop_assert_eq!(s.offset % policy.granule, 0);
            }
            next += s.len;
        }
        prop_assert_eq!(next, len, "every byte written exactly once");
    }

    #[test]
    fn small_writes_are_not_split(len in 0u64..(1 << 20), nics in 1usize..9, policy in policy()) {
        let n = single_write_shard_count(len, nics, policy);
        if len < 2 * policy.min_shard_bytes {
            prop_assert_eq!(n, 1);
        }
    }

    #[test]
    fn pages_divided_evenly(pages in 0usize..20_000, nics in 1usize..9, start in 0usize..64) {
        let blocks = split_pages(pages, nics, start);
        prop_assert_eq!(blocks.len(), pages.min(nics));
        let mut next = 0;
        let (mut lo, mut hi) = (usize::MAX, 0);
        for (i, b) in blocks.iter().enumerate() {
            prop_assert_eq!(b.first, next);
            prop_assert!(b.count > 0);
            prop_assert_eq!(b.nic, (start + i) % nics);
            lo = lo.min(b.count);
            hi = hi.max(b.count);
            next += b.count;
        }
        prop_assert_eq!(next, pages);
        if !blocks.is_empty() {
            prop_assert!(hi - lo <= 1, "blocks differ by more than one page");
        }
    }

    #[test]
    fn receiver_count_matches_sender_split(len in 0u64..(1 << 30), sender in 1usize..9, receiver in 1usize..9, pages in 1usize..5000, policy in policy()) {
        let n = sender.min(receiver);
        let g = group(sender, Ordering::InOrder, policy);
        prop_assert_eq!(expected_imms(&g, receiver, WriteShape::Single { len }), shard_single_write(len, n, 3, policy).len() as u64);
        prop_assert_eq!(expected_imms(&g, receiver, WriteShape::Paged { pages }), split_pages(pages, n, 5).len() as u64);
        let u = group(sender, Ordering::Unordered, policy);
        prop_assert_eq!(expected_imms(&u, receiver, WriteShape::Paged { pages }), pages as u64);
        prop_assert_eq!(expected_imms(&u, receiver, WriteShape::Barrier), 1);
    }
}

proptest! {
    #[test]
    fn split_write_covers_every_byte_once_within_the_limit(len in 0u64..(1 << 40), max in 0u64..(1 << 24)) {
        let mut next = 0u64;
        let mut count = 0u64;
        for (off, plen) in split_write(len, max) {
            prop_assert_eq!(off, next);
            prop_assert!(max == 0 || plen <= max);
            prop_assert!(plen > 0 || len == 0);
            next += plen;
            count += 1;
            if count > 1 << 20 { break; }
        }
        if count <= 1 << 20 {
            prop_assert_eq!(next, len);
            prop_assert_eq!(count, write_pieces(len, max));
        }
    }

    /// The receiver's count equals the immediates the sender posts once
    /// shards and pages are split by the sender's max_write_size: the last
    /// piece of each shard / page block in order, every piece unordered.
    #[test]
    fn receiver_count_matches_split_by_max_write(len in 0u64..(1 << 24), sender in 1usize..5, receiver in 1usize..5, pages in 1usize..64, page_len in 0u64..(1 << 16), max in 1u64..(1 << 16), policy in policy()) {
        let n = sender.min(receiver);
        let mut g = group(sender, Ordering::Unordered, policy);
        g.max_write_size = max;
        let shards = shard_single_write(len, n, 1, policy);
        let pieces: u64 = shards.iter().map(|s| split_write(s.len, max).count() as u64).sum();
        prop_assert_eq!(expected_imms(&g, receiver, WriteShape::Single { len }), pieces);
        prop_assert_eq!(
            expected_imms(&g, receiver, WriteShape::PagedSized { pages, page_len }),
            pages as u64 * split_write(page_len, max).count() as u64
        );
        g.ordering = Ordering::InOrder;
        prop_assert_eq!(expected_imms(&g, receiver, WriteShape::Single { len }), shards.len() as u64);
        prop_assert_eq!(
            expected_imms(&g, receiver, WriteShape::PagedSized { pages, page_len }),
            split_pages(pages, n, 2).len() as u64
        );
    }
}

#[test]
fn remainder_lands_on_the_last_shard() {
    let p = ShardPolicy {
        min_shard_bytes: 4096,
        granule: 4096,
    };
    let s = shard_single_write(3 * 4096 * 10 + 1, 3, 2, p);
    assert_eq!(s.len(), 3);
    assert_eq!(s.iter().map(|x| x.len).sum::<u64>(), 3 * 4096 * 10 + 1);
    assert_eq!(s.iter().map(|x| x.nic).collect::<Vec<_>>(), vec![2, 0, 1]);
}
