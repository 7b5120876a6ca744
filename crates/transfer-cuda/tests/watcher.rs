//! The watcher on plain host memory: CPU threads stand in for GPU kernels.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use transfer_core::IdlePolicy;
use transfer_cuda::{PlainHostMemory, SlotAddr, WatchControl, WatchEvent, Watcher, WatcherConfig};

const GUARD: Duration = Duration::from_secs(60);

fn config(slots_per_page: usize, idle: IdlePolicy) -> WatcherConfig {
    WatcherConfig {
        idle,
        slots_per_page,
        thread_name: "test-watcher".into(),
    }
}

fn bump(slot: &SlotAddr) {
    // SAFETY: the slot belongs to a live watcher's allocator.
    unsafe { (*slot.host).fetch_add(1, Ordering::Release) };
}

/// Writer threads bump their slots concurrently while the watcher runs;
/// every slot's events must chain (old == previous new), start at 0 and end
/// at the number of bumps, and each callback stops itself at that value.
fn concurrent_writers(threads: usize, slots_per_thread: usize, bumps: u64, idle: IdlePolicy) {
    let w = Watcher::new(PlainHostMemory, config(16, idle)).unwrap();
    let log: Arc<Mutex<HashMap<u32, Vec<WatchEvent>>>> = Arc::default();
    let (done_tx, done_rx) = mpsc::channel();
    let mut slots = Vec::new();
    for _ in 0..threads * slots_per_thread {
        let log = log.clone();
        let done = done_tx.clone();
        let slot = w
            .watch(move |ev| {
                log.lock().unwrap().entry(ev.slot.0).or_default().push(ev);
                if ev.new == bumps {
                    done.send(ev.slot).unwrap();
                    WatchControl::Stop
                } else {
                    WatchControl::Keep
                }
            })
            .unwrap();
        slots.push(slot);
    }
    assert!(w.pages() >= (threads * slots_per_thread).div_ceil(16));
    let start = Arc::new(Barrier::new(threads));
    let writers: Vec<_> = slots
        .chunks(slots_per_thread)
        .map(|mine| {
            let mine = mine.to_vec();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for i in 0..bumps {
                    for s in &mine {
                        bump(s);
                    }
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for t in writers {
        t.join().unwrap();
    }
    for _ in 0..slots.len() {
        done_rx
            .recv_timeout(GUARD)
            .expect("every slot reaches its final value");
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), slots.len());
    for s in &slots {
        let evs = &log[&s.id.0];
        assert_eq!(evs[0].old, 0, "{}: first event starts at 0", s.id);
        for pair in evs.windows(2) {
            assert_eq!(pair[1].old, pair[0].new, "{}: events chain", s.id);
            assert!(pair[1].new > pair[0].new, "{}: counters only grow", s.id);
        }
        assert_eq!(evs.last().unwrap().new, bumps);
    }
    let stats = w.stats();
    assert!(stats.events >= slots.len() as u64);
    // Stopped slots are freed by the thread right after their callback.
    let deadline = std::time::Instant::now() + GUARD;
    while w.watched() != 0 {
        assert!(std::time::Instant::now() < deadline, "stopped slots freed");
        std::thread::yield_now();
    }
}

#[test]
fn every_change_is_reported_under_concurrent_writers_busy_poll() {
    concurrent_writers(4, 8, 2_000, IdlePolicy::busy_poll());
}

#[test]
fn every_change_is_reported_under_concurrent_writers_spin_then_park() {
    // Tiny spin and park times: the thread parks between bursts, so the
    // parked path is exercised too.
    let idle = IdlePolicy {
        spin: Duration::from_micros(5),
        min_park: Duration::from_micros(5),
        max_park: Duration::from_micros(200),
        ..IdlePolicy::default()
    };
    concurrent_writers(3, 5, 3_000, idle);
}

#[test]
fn a_bump_before_the_thread_sees_the_watch_is_still_reported() {
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let slot = w
        .watch(move |ev| {
            tx.send(ev).unwrap();
            WatchControl::Stop
        })
        .unwrap();
    bump(&slot);
    let ev = rx.recv_timeout(GUARD).unwrap();
    assert_eq!((ev.slot, ev.old), (slot.id, 0));
    assert!(ev.new >= 1);
}

#[test]
fn stopped_slots_are_reused_by_later_watches() {
    let w = Watcher::new(PlainHostMemory, config(4, IdlePolicy::default())).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let a = w
        .watch(move |ev| {
            tx2.send(ev).unwrap();
            WatchControl::Stop
        })
        .unwrap();
    bump(&a);
    rx.recv_timeout(GUARD).unwrap();
    let deadline = std::time::Instant::now() + GUARD;
    while w.watched() != 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    let b = w
        .watch(move |ev| {
            tx.send(ev).unwrap();
            WatchControl::Keep
        })
        .unwrap();
    assert_eq!(b.id, a.id, "the freed slot is handed out again");
    assert_eq!(w.load(b.id).unwrap(), 0, "and zeroed");
    bump(&b);
    bump(&b);
    let mut last = 0;
    while last < 2 {
        let ev = rx.recv_timeout(GUARD).unwrap();
        assert_eq!(ev.old, last);
        last = ev.new;
    }
}

#[test]
fn unwatch_stops_events_and_frees_the_slot() {
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    let slot = w
        .watch(move |ev| {
            s2.store(ev.new, Ordering::Release);
            WatchControl::Keep
        })
        .unwrap();
    bump(&slot);
    let deadline = std::time::Instant::now() + GUARD;
    while seen.load(Ordering::Acquire) != 1 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    w.unwatch(slot.id);
    while w.watched() != 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    // The slot is free now; a later write is nobody's event.
    let other = w.watch(|_| WatchControl::Keep).unwrap();
    assert_eq!(other.id, slot.id);
}

#[test]
fn a_panicking_callback_stops_only_its_slot() {
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    let bad = w
        .watch(|_| -> WatchControl { panic!("callback failure (expected by the test)") })
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let good = w
        .watch(move |ev| {
            tx.send(ev.new).unwrap();
            WatchControl::Keep
        })
        .unwrap();
    bump(&bad);
    bump(&good);
    assert_eq!(rx.recv_timeout(GUARD).unwrap(), 1);
    let deadline = std::time::Instant::now() + GUARD;
    while w.stats().panicked != 1 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
    bump(&good);
    assert_eq!(rx.recv_timeout(GUARD).unwrap(), 2, "the thread survived");
}

#[test]
fn drop_joins_the_thread_and_releases_callbacks() {
    let token = Arc::new(());
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    for _ in 0..100 {
        let t = token.clone();
        w.watch(move |_| {
            let _keep = &t;
            WatchControl::Keep
        })
        .unwrap();
    }
    assert_eq!(w.watched(), 100);
    drop(w);
    // The thread has been joined: every callback (and its capture) is gone.
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn an_idle_watcher_parks_instead_of_spinning() {
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    // Nothing watched: the thread parks without a timeout.
    std::thread::sleep(Duration::from_millis(50));
    let before = w.stats();
    std::thread::sleep(Duration::from_millis(100));
    let after = w.stats();
    assert!(
        after.scans - before.scans < 10,
        "no slot: at most a few spurious wake-ups, got {} scans",
        after.scans - before.scans
    );
    // Watched but quiet: spin briefly, then park with timeouts up to 1 ms.
    let _slot = w.watch(|_| WatchControl::Keep).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let quiet = w.stats();
    assert!(
        quiet.parks > after.parks,
        "parks while watched slots are quiet"
    );
}

#[test]
fn watch_from_many_threads_at_once() {
    let w = Arc::new(Watcher::new(PlainHostMemory, config(8, IdlePolicy::default())).unwrap());
    let total = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let w = w.clone();
            let total = total.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for _ in 0..50 {
                    let t = total.clone();
                    mine.push(
                        w.watch(move |_| {
                            t.fetch_add(1, Ordering::AcqRel);
                            // Keep: no slot is freed, so no id may repeat.
                            WatchControl::Keep
                        })
                        .unwrap(),
                    );
                }
                for s in &mine {
                    bump(s);
                }
                mine
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for h in handles {
        for s in h.join().unwrap() {
            assert!(ids.insert(s.id), "no slot handed out twice");
        }
    }
    let deadline = std::time::Instant::now() + GUARD;
    while total.load(Ordering::Acquire) != 400 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::yield_now();
    }
}

#[test]
fn unwatching_an_unwatched_slot_does_nothing() {
    let w = Watcher::new(PlainHostMemory, WatcherConfig::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let slot = w
        .watch(move |ev| {
            tx.send(ev.new).unwrap();
            WatchControl::Keep
        })
        .unwrap();
    w.unwatch(transfer_cuda::SlotId(slot.id.0 + 1000));
    bump(&slot);
    assert_eq!(rx.recv_timeout(GUARD).unwrap(), 1);
    assert_eq!(w.watched(), 1);
    // Unwatch then immediately watch again: the new watch (queued after
    // the unwatch) is not affected by it, whether or not it reuses the slot.
    w.unwatch(slot.id);
    let (tx2, rx2) = mpsc::channel();
    let again = w
        .watch(move |ev| {
            tx2.send(ev.new).unwrap();
            WatchControl::Keep
        })
        .unwrap();
    bump(&again);
    assert_eq!(rx2.recv_timeout(GUARD).unwrap(), 1);
}
