//! Slot allocator on plain host memory: growth by pages, free and reuse,
//! no two live slots overlapping, zeroed reuse.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use transfer_cuda::{PlainHostMemory, SlotAllocator, SlotId};

#[test]
fn grows_one_page_at_a_time_without_limit() {
    let mut a = SlotAllocator::with_page_slots(PlainHostMemory, 4);
    assert_eq!(a.pages(), 0);
    let mut ids = Vec::new();
    for i in 0..10_000u32 {
        let s = a.alloc().unwrap();
        assert_eq!(s.id, SlotId(i), "fresh ids are handed out in order");
        ids.push(s);
    }
    assert_eq!(a.pages(), 2500);
    assert_eq!(a.capacity(), 10_000);
    assert_eq!(a.in_use(), 10_000);
}

#[test]
fn default_page_is_512_slots_far_beyond_fabric_libs_limit() {
    let mut a = SlotAllocator::new(PlainHostMemory);
    for _ in 0..2049 {
        a.alloc().unwrap();
    }
    assert_eq!(a.slots_per_page(), 512);
    assert_eq!(a.pages(), 5);
}

#[test]
fn freed_slots_are_reused_lowest_first_and_zeroed() {
    let mut a = SlotAllocator::with_page_slots(PlainHostMemory, 8);
    let slots: Vec<_> = (0..8).map(|_| a.alloc().unwrap()).collect();
    for s in &slots {
        // SAFETY: the slot lives in the allocator's page.
        unsafe { (*s.host).store(42 + u64::from(s.id.0), Ordering::Release) };
    }
    a.free(SlotId(5)).unwrap();
    a.free(SlotId(2)).unwrap();
    assert_eq!(a.in_use(), 6);
    let r = a.alloc().unwrap();
    assert_eq!(r.id, SlotId(2));
    assert_eq!(r.host, slots[2].host, "same memory as before");
    assert_eq!(a.load(r.id).unwrap(), 0, "zeroed on reuse");
    assert_eq!(a.alloc().unwrap().id, SlotId(5));
    assert_eq!(a.pages(), 1, "reuse before growth");
    assert_eq!(a.alloc().unwrap().id, SlotId(8));
    assert_eq!(a.pages(), 2);
    assert_eq!(
        a.load(SlotId(7)).unwrap(),
        49,
        "untouched slots keep their values"
    );
}

#[test]
fn double_free_and_unknown_ids_are_errors() {
    let mut a = SlotAllocator::with_page_slots(PlainHostMemory, 2);
    let s = a.alloc().unwrap();
    a.free(s.id).unwrap();
    assert!(a.free(s.id).is_err());
    assert!(
        a.free(SlotId(1)).is_err(),
        "allocated page, never handed out"
    );
    assert!(a.free(SlotId(99)).is_err());
    assert!(a.addr(SlotId(99)).is_err());
    assert!(a.load(SlotId(99)).is_err());
}

#[test]
fn addresses_are_8_aligned_and_device_mirrors_host_on_plain_memory() {
    let mut a = SlotAllocator::with_page_slots(PlainHostMemory, 3);
    for _ in 0..20 {
        let s = a.alloc().unwrap();
        assert_eq!(s.host as usize % 8, 0);
        assert_eq!(s.device, s.host as u64);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc,
    Free(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![3 => Just(Op::Alloc), 2 => (0usize..64).prop_map(Op::Free)],
        1..300,
    )
}

proptest! {
    #[test]
    fn live_slots_never_overlap_and_reuse_is_lowest_first(per_page in 1usize..17, ops in ops()) {
        let mut a = SlotAllocator::with_page_slots(PlainHostMemory, per_page);
        let mut live: BTreeMap<u32, usize> = BTreeMap::new();
        let mut freed: BTreeSet<u32> = BTreeSet::new();
        for op in ops {
            match op {
                Op::Alloc => {
                    let s = a.alloc().unwrap();
                    let expect = freed.iter().next().copied().unwrap_or(live.len() as u32 + freed.len() as u32);
                    prop_assert_eq!(s.id.0, expect);
                    freed.remove(&s.id.0);
                    let host = s.host as usize;
                    for &other in live.values() {
                        prop_assert!(host + 8 <= other || other + 8 <= host, "overlap");
                    }
                    prop_assert_eq!(a.load(s.id).unwrap(), 0);
                    // SAFETY: live slot.
                    unsafe { (*s.host).store(u64::from(s.id.0) + 1, Ordering::Release) };
                    live.insert(s.id.0, host);
                }
                Op::Free(k) => {
                    if let Some(&id) = live.keys().nth(k % live.len().max(1)) {
                        a.free(SlotId(id)).unwrap();
                        live.remove(&id);
                        freed.insert(id);
                    }
                }
            }
            prop_assert_eq!(a.in_use(), live.len());
            prop_assert_eq!(a.capacity() % per_page, 0);
            prop_assert!(a.capacity() >= live.len() + freed.len());
        }
        for &id in live.keys() {
            prop_assert_eq!(a.load(SlotId(id)).unwrap(), u64::from(id) + 1, "values survive growth");
        }
    }
}
