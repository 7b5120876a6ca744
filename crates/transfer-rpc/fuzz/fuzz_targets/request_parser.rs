//! Frames of random bytes through the request parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer_rpc::protocol::{Limits, Request, split_request};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_message_size: 1 << 20,
    };
    let mut rest = data;
    while let Ok(Some((cmd, payload, used))) = split_request(rest, &limits) {
        if let Ok(req) = Request::decode(cmd, payload) {
            // Re-encoding a decoded request gives back the same frame.
            assert_eq!(req.encode_frame(), rest[..used].to_vec());
        }
        rest = &rest[used..];
    }
});
