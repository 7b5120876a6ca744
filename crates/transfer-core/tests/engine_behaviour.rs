//! Engine behaviour beyond the conformance suite (filled below).
