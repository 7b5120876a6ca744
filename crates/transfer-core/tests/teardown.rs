//! Dropping an engine joins every thread it started (its own test binary,
//! so no other test's threads are counted).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn drop_joins_every_thread() {
    let before = threads();
    for _ in 0..5 {
        let fabric = transfer_core::testing::TestFabric::new(Default::default());
        let e = transfer_core::TransferEngine::builder()
            .group(fabric.domains(2))
            .group(fabric.domains(1))
            .build()
            .unwrap();
        assert_eq!(e.groups(), 2);
        assert!(
            threads() >= before + 3,
            "two workers and a callback thread expected"
        );
        drop(e);
    }
    assert_eq!(threads(), before, "threads left behind after drop");
}
