//! What each mode measures.

/// Run size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Mode {
    /// Smoke run: a few points per sweep (~20 s here).
    Quick,
    /// CI check: one or two small points per sweep, a few MiB moved, so
    /// that it stays short even under software emulation (the soft-RoCE
    /// VM of `cargo xtask test`).
    Smoke,
    /// The README run: every sweep, under two minutes on a 2-core machine.
    Default,
    /// Every point the issue lists (64 KiB x 10 000 pages needs 640 MiB regions).
    Full,
}

/// The points of every sweep.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Mode name.
    pub mode: Mode,
    /// Single-write sizes.
    pub bw_sizes: Vec<u64>,
    /// Bytes moved per bandwidth point.
    pub bw_bytes: u64,
    /// Writes in flight in bandwidth loops (engine and raw alike).
    pub window: usize,
    /// Latency sizes.
    pub lat_sizes: Vec<u64>,
    /// Iterations per latency point.
    pub lat_iters: usize,
    /// Small immediate writes per rate point.
    pub imm_count: usize,
    /// `(page size, pages)` of paged writes.
    pub paged: Vec<(u64, u64)>,
    /// Per-peer slice sizes of scatter.
    pub scatter_sizes: Vec<u64>,
    /// Barrier rounds.
    pub barrier_iters: usize,
    /// Ping-pong rounds (immediates and messages).
    pub pingpong_iters: usize,
    /// Message sizes of the send/recv round trip.
    pub msg_sizes: Vec<u64>,
    /// Idle-cost observation window.
    pub idle_secs: f64,
    /// Region size on every engine.
    pub region_len: u64,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

impl Plan {
    /// The plan of `mode`.
    pub fn new(mode: Mode) -> Self {
        let pages_all = |pages: &[u64]| -> Vec<(u64, u64)> {
            [KIB, 4 * KIB, 16 * KIB, 64 * KIB]
                .iter()
                .flat_map(|&p| pages.iter().map(move |&n| (p, n)))
                .collect()
        };
        match mode {
            Mode::Quick => Self {
                mode,
                bw_sizes: vec![4 * KIB, 64 * KIB, MIB, 4 * MIB, 16 * MIB],
                bw_bytes: 64 * MIB,
                window: 16,
                lat_sizes: vec![8, 64 * KIB],
                lat_iters: 200,
                imm_count: 5_000,
                paged: vec![(KIB, 100), (64 * KIB, 100), (4 * KIB, 10_000)],
                scatter_sizes: vec![64 * KIB, MIB],
                barrier_iters: 200,
                pingpong_iters: 1_000,
                msg_sizes: vec![64],
                idle_secs: 2.0,
                region_len: 64 * MIB,
            },
            Mode::Smoke => Self {
                mode,
                bw_sizes: vec![64 * KIB, MIB],
                bw_bytes: 2 * MIB,
                window: 16,
                lat_sizes: vec![8],
                lat_iters: 20,
                imm_count: 100,
                paged: vec![(4 * KIB, 64)],
                scatter_sizes: vec![64 * KIB],
                barrier_iters: 10,
                pingpong_iters: 20,
                msg_sizes: vec![64],
                idle_secs: 1.0,
                region_len: 2 * MIB,
            },
            Mode::Default => Self {
                mode,
                bw_sizes: (0..9).map(|i| KIB << (2 * i)).collect(),
                bw_bytes: 256 * MIB,
                window: 16,
                lat_sizes: vec![8, 4 * KIB, 64 * KIB, MIB],
                lat_iters: 500,
                imm_count: 20_000,
                paged: pages_all(&[100, 10_000])
                    .into_iter()
                    .filter(|(p, n)| p * n <= 128 * MIB)
                    .collect(),
                scatter_sizes: vec![64 * KIB, MIB, 4 * MIB],
                barrier_iters: 500,
                pingpong_iters: 5_000,
                msg_sizes: vec![64, 4 * KIB],
                idle_secs: 5.0,
                region_len: 128 * MIB,
            },
            Mode::Full => Self {
                mode,
                bw_sizes: (0..9).map(|i| KIB << (2 * i)).collect(),
                bw_bytes: 1024 * MIB,
                window: 16,
                lat_sizes: vec![8, 4 * KIB, 64 * KIB, MIB, 4 * MIB],
                lat_iters: 2_000,
                imm_count: 100_000,
                paged: pages_all(&[100, 10_000]),
                scatter_sizes: vec![64 * KIB, MIB, 4 * MIB, 16 * MIB],
                barrier_iters: 2_000,
                pingpong_iters: 20_000,
                msg_sizes: vec![64, 4 * KIB, 64 * KIB],
                idle_secs: 5.0,
                region_len: 640 * MIB,
            },
        }
    }

    /// Writes per bandwidth point of `size` bytes.
    pub fn bw_count(&self, size: u64) -> usize {
        usize::try_from((self.bw_bytes / size.max(1)).clamp(8, 20_000)).unwrap_or(8)
    }
}

/// `1 KiB`, `64 MiB`, `8 B`.
pub fn human_size(n: u64) -> String {
    if n >= MIB && n % MIB == 0 {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n % KIB == 0 {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} B")
    }
}

/// `--mode` and its shorthands, shared by the commands that take them.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ModeArgs {
    /// smoke, quick, default or full.
    #[arg(long, value_enum, default_value_t = Mode::Default)]
    mode: Mode,
    /// Shorthand for --mode quick.
    #[arg(long)]
    quick: bool,
    /// Shorthand for --mode full.
    #[arg(long)]
    full: bool,
}

impl ModeArgs {
    /// The mode asked for (a shorthand wins over `--mode`).
    pub fn mode(&self) -> Mode {
        if self.quick {
            Mode::Quick
        } else if self.full {
            Mode::Full
        } else {
            self.mode
        }
    }
}
