//! Property tests: hostlist expansion and the wire decoders never panic on
//! any input, and what is encoded decodes back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use transfer_launch::hostlist::{self, MAX_HOSTS};
use transfer_launch::wire::{self, Hello, Limits, Reply};

fn small_limits() -> Limits {
    Limits {
        max_world: 64,
        max_blob: 256,
        max_total: 4096,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn hostlist_never_panics(s in "[a-z0-9\\[\\],\\- ]{0,40}") {
        if let Ok(hosts) = hostlist::expand(&s) {
            prop_assert!(hosts.len() <= MAX_HOSTS);
            prop_assert!(hosts.iter().all(|h| !h.is_empty() && !h.contains(',')));
        }
    }

    #[test]
    fn hostlist_never_panics_on_any_text(s in any::<String>()) {
        let _ = hostlist::expand(&s);
    }

    #[test]
    fn ranges_expand_like_slurm(
        prefix in "[a-z]{1,6}",
        ranges in prop::collection::vec((0u64..500, 0u64..20, 1usize..4), 1..5),
        plain in prop::collection::vec("[a-z][a-z0-9]{0,5}", 0..3),
    ) {
        let mut want = Vec::new();
        let mut parts = Vec::new();
        for (lo, span, width) in &ranges {
            let hi = lo + span;
            let w = *width;
            parts.push(format!("{lo:0w$}-{hi}"));
            for v in *lo..=hi {
                want.push(format!("{prefix}{v:0w$}"));
            }
        }
        let mut list = format!("{prefix}[{}]", parts.join(","));
        for p in &plain {
            list += &format!(",{p}");
            want.push(p.clone());
        }
        prop_assert_eq!(hostlist::expand(&list).unwrap(), want);
    }

    #[test]
    fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let l = small_limits();
        let _ = wire::decode_hello(&bytes, &l);
        let _ = wire::decode_reply(&bytes, &l);
        let _ = wire::decode_challenge(&bytes);
        let _ = wire::decode_reply(&bytes, &Limits { max_world: usize::MAX, max_blob: usize::MAX, max_total: usize::MAX });
    }

    #[test]
    fn decoders_never_panic_behind_a_valid_header(
        kind in 0u8..5,
        tail in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut b = wire::MAGIC.to_vec();
        b.push(wire::VERSION);
        b.push(kind);
        b.extend_from_slice(&tail);
        let l = small_limits();
        let _ = wire::decode_hello(&b, &l);
        let _ = wire::decode_reply(&b, &l);
    }

    #[test]
    fn mutated_frames_never_panic(
        token in "[ -~]{0,40}",
        world in 1u32..64,
        blob in prop::collection::vec(any::<u8>(), 0..256),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let l = small_limits();
        let h = Hello { token, world_size: world, rank: world - 1, blob, nonce: [3; 32], mac: vec![4; 32] };
        let mut b = wire::encode_hello(&h, &l).unwrap();
        prop_assert_eq!(&wire::decode_hello(&b, &l).unwrap(), &h);
        for (at, x) in flips {
            let i = at % b.len();
            b[i] ^= x;
        }
        let _ = wire::decode_hello(&b, &l);
        let _ = wire::decode_reply(&b, &l);
    }

    #[test]
    fn replies_round_trip(blobs in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..32)) {
        let l = small_limits();
        let r = Reply::Accepted(blobs, vec![7; 32]);
        let b = wire::encode_reply(&r, &l).unwrap();
        prop_assert!(b.len() <= l.max_reply());
        prop_assert_eq!(wire::decode_reply(&b, &l).unwrap(), r);
    }

    #[test]
    fn frame_lengths_are_bounded(len in any::<u32>(), max in 0usize..1_000_000) {
        match wire::frame_len(len.to_be_bytes(), max) {
            Ok(n) => prop_assert!(n <= max),
            Err(_) => prop_assert!(len as usize > max),
        }
    }
}
