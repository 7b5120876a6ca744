//! A dropped shm domain leaves no shared-memory files behind (each used
//! to leave a 16 MiB region in /dev/shm, and a later process that got the
//! same pid failed to open its endpoint with EBUSY).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use transfer_efa::Provider;

fn ours() -> Vec<String> {
    let prefix = format!("trx{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn dropped_shm_domains_remove_their_files() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        println!("skipped: no /dev/shm");
        return;
    }
    let Some(domains) = common::open(Provider::Shm, 2) else {
        return;
    };
    let live = ours();
    assert!(!live.is_empty(), "the shm endpoints have files while open");
    drop(domains);
    assert_eq!(ours(), Vec::<String>::new(), "files left in /dev/shm");
}
