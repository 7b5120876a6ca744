//! 64-bit FNV-1a, the hash ggml-rpc uses for SET_TENSOR_HASH.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `data`.
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// 64-bit FNV-1a over data that arrives in pieces.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a64 {
    /// The hash of nothing yet.
    pub fn new() -> Self {
        Fnv1a64(FNV_OFFSET)
    }

    /// Hash of `data` in one piece.
    pub fn of(data: &[u8]) -> u64 {
        fnv1a64(data)
    }

    /// Adds a piece.
    pub fn update(&mut self, data: &[u8]) {
        self.0 = data
            .iter()
            .fold(self.0, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        let mut h = Fnv1a64::new();
        h.update(b"foo");
        h.update(b"bar");
        assert_eq!(h.finish(), 0x8594_4171_f739_67e8);
    }
}
