//! Error completions and errno values map to typed errors; opening without
//! a device is a clear error, never a panic.

use transfer_core::TransferError;
use transfer_verbs::error::{
    ConnFate, errno_error, post_is_backpressure, status, wc_error, wc_fate, wc_status_name,
};
use transfer_verbs::{VerbsConfig, VerbsDomain};

#[test]
fn completion_statuses() {
    assert!(matches!(
        wc_error("write", status::REM_ACCESS_ERR, 0),
        TransferError::RemoteAccess { call: "write", .. }
    ));
    assert!(matches!(
        wc_error("send", status::REM_INV_REQ_ERR, 0),
        TransferError::RemoteAccess { .. }
    ));
    assert!(matches!(
        wc_error("write", status::RETRY_EXC_ERR, 0),
        TransferError::PeerUnreachable { .. }
    ));
    assert!(matches!(
        wc_error("write", status::RNR_RETRY_EXC_ERR, 0),
        TransferError::PeerUnreachable { .. }
    ));
    assert!(matches!(
        wc_error("write", status::WR_FLUSH_ERR, 0),
        TransferError::PeerUnreachable { .. }
    ));
    match wc_error("write", status::LOC_PROT_ERR, 0x33) {
        TransferError::Backend { code, message, .. } => {
            assert_eq!(code, status::LOC_PROT_ERR);
            assert!(message.contains("local protection error") && message.contains("0x33"));
        }
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(wc_status_name(12), "transport retry counter exceeded");
    assert_eq!(wc_status_name(999), "unknown");
}

#[test]
fn which_errors_kill_a_peer() {
    assert_eq!(wc_fate(status::RETRY_EXC_ERR), ConnFate::Dead);
    assert_eq!(wc_fate(status::RNR_RETRY_EXC_ERR), ConnFate::Dead);
    assert_eq!(wc_fate(status::REM_ACCESS_ERR), ConnFate::Reconnect);
    assert_eq!(wc_fate(status::REM_INV_REQ_ERR), ConnFate::Reconnect);
    assert_eq!(wc_fate(status::WR_FLUSH_ERR), ConnFate::Reconnect);
}

#[test]
fn errno_and_backpressure() {
    match errno_error("ibv_post_send", libc::EINVAL) {
        TransferError::Backend { call, code, .. } => {
            assert_eq!((call, code), ("ibv_post_send", libc::EINVAL))
        }
        e => panic!("unexpected {e:?}"),
    }
    assert!(post_is_backpressure(libc::ENOMEM));
    assert!(post_is_backpressure(-libc::ENOMEM));
    assert!(!post_is_backpressure(libc::EINVAL));
}

#[test]
fn opening_without_a_device_is_a_clear_error() {
    let devices = transfer_verbs::devices();
    match VerbsDomain::open(VerbsConfig::default().device("no-such-device0")) {
        Ok(_) => panic!("opened a device that does not exist"),
        Err(e) => {
            let s = e.to_string();
            eprintln!("{s}");
            match devices {
                Err(_) => assert!(
                    matches!(e, TransferError::LibraryMissing { install_hint, .. } if install_hint.contains("libibverbs1"))
                ),
                Ok(d) if d.is_empty() => assert!(s.contains("no RDMA device")),
                Ok(_) => assert!(s.contains("not found")),
            }
        }
    }
}

#[test]
fn a_missing_library_names_the_install_command() {
    // Only checks the error's wording (the library is process-global).
    let e = TransferError::LibraryMissing {
        library: transfer_verbs::sys::LIBRARY,
        reason: "x".into(),
        install_hint: transfer_verbs::sys::INSTALL_HINT,
    };
    assert!(
        e.to_string()
            .contains("apt-get install libibverbs1 ibverbs-providers")
    );
}
