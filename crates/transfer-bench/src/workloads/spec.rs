//! The shared parts of WORKLOADS.md: the RNG, the shuffle, the fill
//! pattern every engine writes and checks, and each workload's parameters
//! with the layouts derived from them (tensor list, MoE routing).

use serde::{Deserialize, Serialize};

/// splitmix64 (wrapping arithmetic), exactly as WORKLOADS.md writes it.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next output.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The first output of a fresh splitmix64 whose state is `x`.
pub fn mix(x: u64) -> u64 {
    SplitMix64::new(x).next_u64()
}

/// `[0..n)` shuffled by Fisher-Yates with splitmix64(seed).
pub fn shuffle(n: usize, seed: u64) -> Vec<u32> {
    let mut a: Vec<u32> = (0..n).map(|i| i as u32).collect();
    let mut rng = SplitMix64::new(seed);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        a.swap(i, j);
    }
    a
}

/// Byte `i` of the fill pattern of a unit whose hash is `h`: the
/// definition, which [`fill`] and [`first_mismatch`] compute by rows.
#[cfg(test)]
fn pattern_byte(h: u64, i: usize) -> u8 {
    if i < 8 {
        h.to_le_bytes()[i]
    } else {
        let i = i as u64;
        h.wrapping_add(i.wrapping_mul(131)).wrapping_add(i >> 12) as u8
    }
}

/// The hash of unit `tag` at iteration `it`.
pub fn unit_hash(tag: u64, it: u64) -> u64 {
    mix(tag ^ (it << 48))
}

/// Past its first 8 bytes a unit's pattern repeats every 256 bytes inside
/// each 4096-byte block (`i * 131 mod 256` has period 256, `i >> 12` is
/// constant in a block): row `block` holds those 256 bytes, so filling and
/// checking copy and compare one row per block instead of computing every
/// byte, as the Open MPI harness (`xtask/src/mpi/common.c`) does.
/// Computing every byte made fill and check 27 % of the moe ranks' CPU
/// (perf, shm, default sizes); untimed, but on 2 shared cores it ran while
/// other ranks were still timing.
fn block_row(h: u64, block: u64) -> [u8; 256] {
    let mut row = [0u8; 256];
    for (j, b) in row.iter_mut().enumerate() {
        *b = h
            .wrapping_add((j as u64).wrapping_mul(131))
            .wrapping_add(block) as u8;
    }
    row
}

/// Calls `f(offset in the slice, the pattern's bytes there)` over the
/// pattern of bytes `start..start + len` of the unit whose hash is `h`, in
/// pieces of at most 256 bytes (the first 8 bytes of the unit, then rows).
fn pattern_pieces(h: u64, start: usize, len: usize, mut f: impl FnMut(usize, &[u8]) -> bool) {
    let head = h.to_le_bytes();
    let mut k = 0;
    while k < len && start + k < 8 {
        let i = start + k;
        let n = (8 - i).min(len - k);
        if !f(k, &head[i..i + n]) {
            return;
        }
        k += n;
    }
    while k < len {
        let i = start + k;
        let row = block_row(h, (i >> 12) as u64);
        let block_end = ((i >> 12) + 1) << 12;
        let end = block_end.min(start + len);
        let mut at = i;
        while at < end {
            let off = at & 255;
            let n = (256 - off).min(end - at);
            if !f(at - start, &row[off..off + n]) {
                return;
            }
            at += n;
        }
        k = end - start;
    }
}

/// Writes bytes `start..start + out.len()` of the pattern of unit (`tag`, `it`) into `out`.
pub fn fill(out: &mut [u8], tag: u64, it: u64, start: usize) {
    let h = unit_hash(tag, it);
    pattern_pieces(h, start, out.len(), |k, want| {
        out[k..k + want.len()].copy_from_slice(want);
        true
    });
}

/// The first byte of `got` (bytes `start..` of unit (`tag`, `it`)) that
/// differs from the pattern, as (index in the unit, expected, found).
pub fn first_mismatch(got: &[u8], tag: u64, it: u64, start: usize) -> Option<(usize, u8, u8)> {
    let h = unit_hash(tag, it);
    let mut found = None;
    pattern_pieces(h, start, got.len(), |k, want| {
        let piece = &got[k..k + want.len()];
        if piece == want {
            return true;
        }
        found = piece
            .iter()
            .zip(want)
            .position(|(g, w)| g != w)
            .map(|j| (start + k + j, want[j], piece[j]));
        false
    });
    found
}

/// Parameters of kv (disaggregated prefill -> decode).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct KvParams {
    /// Layers L.
    pub layers: u64,
    /// Pages per layer P.
    pub pages_per_layer: u64,
    /// Bytes per page B.
    pub page_bytes: u64,
    /// Concurrent requests R.
    pub requests: u64,
    /// Busy-wait per layer C, microseconds.
    pub compute_us: u64,
    /// Seed.
    pub seed: u64,
}

impl KvParams {
    /// Pages in the decode pool: 2 * R * L * P.
    pub fn pool_pages(&self) -> u64 {
        2 * self.requests * self.layers * self.pages_per_layer
    }

    /// Bytes of one request's source buffer: L * P * B.
    pub fn request_bytes(&self) -> u64 {
        self.layers * self.pages_per_layer * self.page_bytes
    }

    /// Bytes moved per iteration: R * L * P * B.
    pub fn total_bytes(&self) -> u64 {
        self.requests * self.request_bytes()
    }

    /// Checks the sizes (they come over the side channel): every product
    /// the workload forms fits, the pool's page indices fit a u32, and the
    /// tag's fields do not overlap.
    pub fn check(&self) -> Result<(), String> {
        let bytes = self
            .requests
            .checked_mul(self.layers)
            .and_then(|x| x.checked_mul(self.pages_per_layer))
            .and_then(|x| x.checked_mul(2))
            .and_then(|x| x.checked_mul(self.page_bytes));
        if self.layers == 0
            || self.pages_per_layer == 0
            || self.page_bytes == 0
            || self.requests == 0
            || self.layers >= 1 << 20
            || self.pages_per_layer >= 1 << 20
            || self.requests >= 1 << 16
            || self.compute_us > 10_000_000
            || bytes.is_none_or(|b| b > 1 << 40)
            || self.pool_pages() > u64::from(u32::MAX)
        {
            return Err(format!("kv: sizes out of range: {self:?}"));
        }
        Ok(())
    }

    /// Tag of page (r, l, p).
    pub fn tag(r: u64, l: u64, p: u64) -> u64 {
        (r << 40) | (l << 20) | p
    }
}

/// Parameters of weights (RL weight update).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct WeightsParams {
    /// Trainer ranks M.
    pub trainers: u64,
    /// Inference ranks N.
    pub inference: u64,
    /// Bytes of the parameter set S (a multiple of 4 KiB).
    pub total_bytes: u64,
    /// Seed.
    pub seed: u64,
}

/// One tensor of the weights workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tensor {
    /// Offset in every rank's buffer.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

impl WeightsParams {
    /// The tensor list: sizes 2^(12 + next() % 13), the last truncated so
    /// that they sum to S; laid out contiguously. Tag of tensor i = i,
    /// owner = i % M.
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut rng = SplitMix64::new(self.seed);
        let mut out = Vec::new();
        let mut sum = 0u64;
        while sum < self.total_bytes {
            let size = 1u64 << (12 + rng.next_u64() % 13);
            let len = size.min(self.total_bytes - sum);
            out.push(Tensor { offset: sum, len });
            sum += len;
        }
        out
    }
}

/// Parameters of moe (dispatch + combine).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct MoeParams {
    /// Ranks E.
    pub ranks: u64,
    /// Tokens per rank T.
    pub tokens: u64,
    /// Hidden size H (dispatch row: H bytes fp8; combine row: 2H bytes bf16).
    pub hidden: u64,
    /// Experts X.
    pub experts: u64,
    /// Experts per token K.
    pub topk: u64,
    /// Seed.
    pub seed: u64,
}

/// Where the tokens of every rank go, known to every rank in advance.
#[derive(Debug, Clone)]
pub struct Routing {
    /// `dests[r][t]`: (destination rank, weight) in rank order.
    pub dests: Vec<Vec<Vec<(usize, f32)>>>,
    /// `slot[r][t][j]`: slot of token t of r at its j-th destination.
    pub slot: Vec<Vec<Vec<u64>>>,
    /// `count[s][d]`: rows source s sends destination d.
    pub count: Vec<Vec<u64>>,
    /// `tokens[s][d]`: the tokens of s that go to d, in token order (slot k = index).
    pub tokens: Vec<Vec<Vec<u64>>>,
}

impl MoeParams {
    /// Checks what the routing divides by.
    pub fn check(&self) -> Result<(), String> {
        if self.ranks == 0 || self.experts % self.ranks != 0 {
            return Err(format!(
                "moe: experts ({}) must be a non-zero multiple of ranks ({})",
                self.experts, self.ranks
            ));
        }
        if self.ranks > 1024
            || self.tokens > 1 << 20
            || self.hidden == 0
            || self.hidden > 1 << 20
            || self.experts > 1 << 20
            || self.tokens * self.hidden > 1 << 34
        {
            return Err(format!("moe: sizes out of range: {self:?}"));
        }
        if self.topk == 0 || self.topk > self.experts {
            return Err(format!(
                "moe: topk {} must be in 1..={}",
                self.topk, self.experts
            ));
        }
        Ok(())
    }

    /// The routing of every (rank, token) as WORKLOADS.md defines it.
    pub fn routing(&self) -> Routing {
        let (e, t_n) = (self.ranks as usize, self.tokens as usize);
        let per_rank = (self.experts / self.ranks).max(1);
        let mut dests = vec![vec![Vec::new(); t_n]; e];
        let mut slot = vec![vec![Vec::new(); t_n]; e];
        let mut count = vec![vec![0u64; e]; e];
        let mut tokens = vec![vec![Vec::new(); e]; e];
        for r in 0..e {
            for t in 0..t_n {
                let mut rng = SplitMix64::new(self.seed ^ ((r as u64) << 32) ^ t as u64);
                let mut chosen: Vec<u64> = Vec::with_capacity(self.topk as usize);
                while (chosen.len() as u64) < self.topk {
                    let x = rng.next_u64() % self.experts;
                    if !chosen.contains(&x) {
                        chosen.push(x);
                    }
                }
                let mut per = vec![0u64; e];
                for x in &chosen {
                    per[(x / per_rank) as usize] += 1;
                }
                for (d, &n) in per.iter().enumerate() {
                    if n > 0 {
                        dests[r][t].push((d, n as f32 / self.topk as f32));
                        slot[r][t].push(count[r][d]);
                        count[r][d] += 1;
                        tokens[r][d].push(t as u64);
                    }
                }
            }
        }
        Routing {
            dests,
            slot,
            count,
            tokens,
        }
    }

    /// Tag of dispatch row (r, t).
    pub fn dispatch_tag(r: u64, t: u64) -> u64 {
        (r << 32) | t
    }

    /// Tag of the combine row d sends back for (r, t).
    pub fn combine_tag(d: u64, r: u64, t: u64) -> u64 {
        (1 << 63) | (d << 40) | (r << 32) | t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference() {
        // The reference outputs of splitmix64 seeded with 0 (Vigna's C code).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn agrees_with_the_open_mpi_programs_selftest() {
        // What `transfer-mpi-workloads selftest` (xtask/src/mpi/selftest.c)
        // prints: the C and Rust sides must move the same bytes to the same
        // places, or their rows would not compare.
        assert_eq!(shuffle(8, 1), vec![4, 3, 2, 7, 5, 6, 0, 1]);
        let mut unit = [0u8; 16];
        fill(&mut unit, 1, 0, 0);
        assert_eq!(
            unit,
            [
                0xc1, 0x5c, 0x02, 0x89, 0xec, 0x2d, 0x0a, 0x91, 0xd9, 0x5c, 0xdf, 0x62, 0xe5, 0x68,
                0xeb, 0x6e
            ]
        );
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut a = shuffle(1000, 7);
        assert_ne!(a, (0..1000).collect::<Vec<u32>>());
        a.sort_unstable();
        assert_eq!(a, (0..1000).collect::<Vec<u32>>());
        assert_eq!(shuffle(1000, 7), shuffle(1000, 7));
    }

    #[test]
    fn rows_give_the_same_bytes_as_the_formula() {
        let h = unit_hash(7, 9);
        for (start, len) in [
            (0, 10_000),
            (3, 5),
            (8, 4088),
            (4090, 20),
            (12_345, 9_000),
            (0, 1),
        ] {
            let mut out = vec![0u8; len];
            fill(&mut out, 7, 9, start);
            for (k, &b) in out.iter().enumerate() {
                assert_eq!(b, pattern_byte(h, start + k), "start {start} byte {k}");
            }
            assert_eq!(first_mismatch(&out, 7, 9, start), None);
        }
    }

    #[test]
    fn pattern_checks_every_byte_and_the_iteration() {
        let mut unit = vec![0u8; 10_000];
        fill(&mut unit, 42, 3, 0);
        assert_eq!(first_mismatch(&unit, 42, 3, 0), None);
        assert_eq!(&unit[..8], &unit_hash(42, 3).to_le_bytes());
        // A chunk checked on its own uses the unit's byte indices.
        assert_eq!(first_mismatch(&unit[5000..], 42, 3, 5000), None);
        assert!(first_mismatch(&unit, 42, 4, 0).is_some(), "stale iteration");
        assert!(first_mismatch(&unit, 43, 3, 0).is_some(), "misplaced unit");
        unit[9999] ^= 1;
        assert_eq!(
            first_mismatch(&unit, 42, 3, 0).map(|m| m.0),
            Some(9999),
            "the last byte is checked"
        );
    }

    #[test]
    fn tensors_sum_to_s_with_mixed_sizes() {
        let p = WeightsParams {
            trainers: 2,
            inference: 4,
            total_bytes: 32 << 20,
            seed: 1,
        };
        let t = p.tensors();
        assert_eq!(t.iter().map(|t| t.len).sum::<u64>(), 32 << 20);
        assert!(t.windows(2).all(|w| w[0].offset + w[0].len == w[1].offset));
        assert!(t.iter().all(|t| t.len >= 4096 && t.len <= 16 << 20));
        assert!(
            t.iter()
                .any(|t| t.len != t.len.next_power_of_two() || t.len < 1 << 20)
        );
    }

    #[test]
    fn routing_slots_are_dense_and_weights_sum_to_one() {
        let p = MoeParams {
            ranks: 4,
            tokens: 32,
            hidden: 64,
            experts: 256,
            topk: 8,
            seed: 1,
        };
        p.check().unwrap();
        let r = p.routing();
        for s in 0..4 {
            for t in 0..32 {
                let w: f32 = r.dests[s][t].iter().map(|d| d.1).sum();
                assert!((w - 1.0).abs() < 1e-6);
                for (j, &(d, _)) in r.dests[s][t].iter().enumerate() {
                    let k = r.slot[s][t][j] as usize;
                    assert_eq!(r.tokens[s][d][k], t as u64);
                }
            }
            for d in 0..4 {
                assert_eq!(r.count[s][d] as usize, r.tokens[s][d].len());
            }
        }
        assert!(MoeParams { experts: 255, ..p }.check().is_err());
        assert!(
            MoeParams {
                tokens: u64::MAX,
                ..p
            }
            .check()
            .is_err()
        );
        assert!(
            MoeParams {
                hidden: u64::MAX,
                ..p
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn kv_sizes_from_the_side_channel_are_checked() {
        let p = KvParams {
            layers: 32,
            pages_per_layer: 64,
            page_bytes: 16384,
            requests: 4,
            compute_us: 500,
            seed: 1,
        };
        assert_eq!(p.check(), Ok(()));
        assert!(
            KvParams {
                page_bytes: u64::MAX,
                ..p
            }
            .check()
            .is_err()
        );
        assert!(KvParams { requests: 0, ..p }.check().is_err());
        assert!(
            KvParams {
                layers: 1 << 20,
                ..p
            }
            .check()
            .is_err()
        );
    }
}
