//! Without a driver or GPU every entry point answers with a typed error
//! (never a panic); with one, the same calls succeed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use transfer_cuda::{CudaContext, CudaError, driver, gdr};

#[test]
fn the_driver_loads_or_says_why_not() {
    match driver() {
        Ok(d) => println!("CUDA driver {} loaded from {}", d.version(), d.library()),
        Err(e) => {
            println!("no CUDA driver here: {e}");
            assert!(e.is_no_gpu(), "unexpected error kind: {e:?}");
            // The same error on every call (loaded once).
            assert_eq!(driver().unwrap_err(), e);
        }
    }
}

#[test]
fn contexts_fail_with_typed_errors() {
    match CudaContext::new(0) {
        Ok(ctx) => println!("device 0: {}", ctx.name().unwrap_or_default()),
        Err(e) => assert!(e.is_no_gpu(), "unexpected error kind: {e:?}"),
    }
    let err = CudaContext::new(u32::MAX).unwrap_err();
    assert!(
        matches!(err, CudaError::NoDevice { .. }) || err.is_no_gpu(),
        "{err:?}"
    );
}

#[test]
fn gdrcopy_is_optional() {
    match gdr::gdr() {
        Ok(_) => println!("GDRCopy available"),
        Err(e) => {
            println!("{e}");
            assert!(matches!(e, CudaError::GdrUnavailable { .. }), "{e:?}");
        }
    }
}
