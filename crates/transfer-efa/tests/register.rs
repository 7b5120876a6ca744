//! Registration rules: device memory needs FI_HMEM, and a provider without
//! CUDA support refuses it with an error, never a crash.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use transfer_core::{Domain, MemoryLocation, MemorySpan, TransferError};
use transfer_efa::{LibfabricConfig, Provider};

fn span(buf: &mut [u8], location: MemoryLocation) -> MemorySpan {
    MemorySpan {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
        location,
        dmabuf_fd: None,
    }
}

#[test]
fn device_memory_rules() {
    let Some(mut d) = common::open(Provider::Tcp, 1) else {
        return;
    };
    let mut buf = vec![0u8; 4096];
    let r = d[0].register(span(&mut buf, MemoryLocation::Cuda { device: 0 }));
    assert!(
        matches!(r, Err(TransferError::InvalidArgument { .. })),
        "{r:?}"
    );
    let r = d[0].register(MemorySpan {
        ptr: std::ptr::null_mut(),
        len: 0,
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    });
    assert!(r.is_err());
    let ok = d[0].register(span(&mut buf, MemoryLocation::Host)).unwrap();
    d[0].unregister(ok.mr).unwrap();
    assert!(d[0].unregister(ok.mr).is_err(), "double unregister");

    // With FI_HMEM asked for: either no provider offers it here, or the
    // registration of (fake) CUDA memory fails cleanly on a build without
    // CUDA support, or it works on a real one.
    match common::try_open_with(LibfabricConfig::loopback(Provider::Tcp).with_hmem(true), 1) {
        Err(e) => eprintln!("tcp with FI_HMEM does not open here: {e}"),
        Ok(mut h) => {
            let r = h[0].register(span(&mut buf, MemoryLocation::Cuda { device: 0 }));
            eprintln!("tcp with FI_HMEM, fake CUDA registration -> {r:?}");
        }
    }
}
