//! Options of `cargo xtask bench rpc`.

/// One of the three ways a stage boundary travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arm {
    /// Through the coordinator (GET_TENSOR then SET_TENSOR).
    Hub,
    /// Server to server, COPY_TENSOR_TO over TCP.
    Direct,
    /// Server to server, write-with-immediate over the TransferEngine.
    Engine,
}

impl Arm {
    /// The name the coordinator's `--arm` takes and its JSON reports.
    pub fn name(self) -> &'static str {
        match self {
            Arm::Hub => "hub",
            Arm::Direct => "direct",
            Arm::Engine => "engine",
        }
    }

    fn parse(s: &str) -> Result<Arm, String> {
        match s {
            "hub" => Ok(Arm::Hub),
            "direct" => Ok(Arm::Direct),
            "engine" => Ok(Arm::Engine),
            other => Err(format!(
                "bench rpc: unknown arm `{other}` (hub, direct, engine)"
            )),
        }
    }
}

/// How `--delay` is put on the coordinator's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayMode {
    /// netem where this kernel has it, else the proxy.
    Auto,
    /// A netem qdisc on both ends of the coordinator's link (needs the
    /// sch_netem kernel module).
    Netem,
    /// The user-space delay proxy in the coordinator's namespace
    /// (`xtask delay-proxy`): the coordinator connects through it, the
    /// servers reach each other directly.
    Proxy,
}

impl DelayMode {
    fn parse(s: &str) -> Result<DelayMode, String> {
        match s {
            "auto" => Ok(DelayMode::Auto),
            "netem" => Ok(DelayMode::Netem),
            "proxy" => Ok(DelayMode::Proxy),
            other => Err(format!(
                "bench rpc: --delay-mode is auto, netem or proxy, not `{other}`"
            )),
        }
    }
}

/// Model shape written by `transfer-rpc-pipeline make-model`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    /// Hidden size: one stage boundary carries streams × n_embd × 4 bytes.
    pub n_embd: u32,
    /// Layers per stage (the model has stages × this many).
    pub layers_per_stage: u32,
    /// Attention heads.
    pub n_head: u32,
    /// Key/value heads (grouped-query attention).
    pub n_head_kv: u32,
    /// Feed-forward size.
    pub n_ff: u32,
    /// Vocabulary: kept small so that the logits the coordinator reads back
    /// stay small next to the hidden states.
    pub n_vocab: u32,
}

impl ModelShape {
    /// `small`: the default, sized so that on this 2-core machine the
    /// shaped coordinator link weighs more than compute in the hub arm.
    /// Each step also pays a fixed ~5 ms (a dozen RPC round trips, four
    /// stage computes on two shared cores) that no arm removes; compute
    /// grows with n_embd squared, a boundary with n_embd x streams, so a
    /// narrow model with many streams favours the link. Measured at
    /// 200mbit, 4 stages, one group, direct / hub tokens/s (medians of 2-3):
    /// 1024 wide x 4 streams 1.46x; 512 x 8 1.41-1.84x (noisy: builds of
    /// other jobs share the cores); 512 x 16 1.33-1.51x; 256 x 32 1.62x
    /// (hub link ~10 ms of an 18 ms step); 256 x 64 1.77x but 2x longer.
    /// Hidden state per boundary at the default 32 streams: 32 KiB.
    pub const SMALL: ModelShape = ModelShape {
        n_embd: 256,
        layers_per_stage: 1,
        n_head: 8,
        n_head_kv: 2,
        n_ff: 256,
        n_vocab: 128,
    };
    /// `medium`: 512 wide, two layers per stage: compute weighs more, the
    /// link less.
    pub const MEDIUM: ModelShape = ModelShape {
        n_embd: 512,
        layers_per_stage: 2,
        n_head: 8,
        n_head_kv: 2,
        n_ff: 1024,
        n_vocab: 256,
    };
}

/// Options of `cargo xtask bench rpc`.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcArgs {
    /// Pipeline stages = RPC servers.
    pub stages: usize,
    /// Arms to run, in the order of the first repeat.
    pub arms: Vec<Arm>,
    /// Repeats of every cell.
    pub repeats: usize,
    /// tc rate of the coordinator's link (each direction).
    pub rate: String,
    /// One-way delay added to each direction of the coordinator's link.
    pub delay: Option<String>,
    /// How the delay is applied.
    pub delay_mode: DelayMode,
    /// Concurrent groups of streams in flight.
    pub groups: Vec<usize>,
    /// Sequences decoded together in one group.
    pub streams: usize,
    /// Output tokens per run.
    pub tokens: usize,
    /// Prompt tokens per stream.
    pub prompt_len: usize,
    /// Model shape.
    pub model: ModelShape,
    /// Name of the model shape (for the report).
    pub model_name: String,
    /// Compute threads per server.
    pub threads: usize,
    /// `--quick`: one short repeat of everything.
    pub quick: bool,
    /// tbf bucket of the coordinator's link.
    pub burst: String,
    /// Use the binaries in this folder instead of building them.
    pub bin_dir: Option<String>,
    /// Only build the lab, measure its links, start the servers and check
    /// that every host reaches them; no model, no runs.
    pub check_lab: bool,
}

impl Default for RpcArgs {
    fn default() -> Self {
        RpcArgs {
            stages: 4,
            arms: vec![Arm::Hub, Arm::Direct, Arm::Engine],
            repeats: 3,
            rate: "200mbit".into(),
            delay: None,
            delay_mode: DelayMode::Auto,
            groups: vec![1, 3],
            streams: 32,
            tokens: 32,
            prompt_len: 8,
            model: ModelShape::SMALL,
            model_name: "small".into(),
            threads: 1,
            quick: false,
            burst: "4kb".into(),
            bin_dir: None,
            check_lab: false,
        }
    }
}

pub const USAGE: &str = "\
usage: cargo xtask bench rpc [--stages 4] [--arms hub,direct,engine] [--repeats 3]
         [--rate 200mbit] [--delay 2ms] [--delay-mode auto|netem|proxy] [--groups 1,3] [--streams 32] [--tokens 32]
         [--prompt-len 8] [--threads 1] [--model-size small|medium] [--n-embd N] [--burst 4kb] [--quick]
         [--bin-dir DIR (prebuilt transfer-rpc-server and -pipeline; skips the build)]
         [--check-lab (only set up the namespaces, measure the links, start and reach the servers)]
  --delay D adds D to each direction of the coordinator's link: with netem where the kernel
  has sch_netem, else (--delay-mode auto, the default) with a user-space proxy in the
  coordinator's namespace that holds every chunk D before passing it on.";

fn number(name: &str, v: &str, min: usize, max: usize) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "bench rpc: {name} takes a number from {min} to {max}, not `{v}`"
        )),
    }
}

fn list<T>(
    name: &str,
    v: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let items = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(item)
        .collect::<Result<Vec<T>, String>>()?;
    if items.is_empty() {
        return Err(format!("bench rpc: {name} needs at least one value"));
    }
    Ok(items)
}

/// Parses the options after `bench rpc`.
pub fn parse(args: &[String]) -> Result<RpcArgs, String> {
    let mut out = RpcArgs::default();
    let (mut repeats, mut tokens, mut n_embd, mut delay_mode) = (None, None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--quick" {
            out.quick = true;
            continue;
        }
        if a == "--check-lab" {
            out.check_lab = true;
            continue;
        }
        if a == "-h" || a == "--help" {
            return Err(USAGE.into());
        }
        let v = it
            .next()
            .ok_or_else(|| format!("bench rpc: {a} needs a value\n{USAGE}"))?;
        match a.as_str() {
            "--stages" => out.stages = number(a, v, 2, 16)?,
            "--arms" => {
                out.arms = list(a, v, Arm::parse)?;
                let mut seen = out.arms.clone();
                seen.sort();
                seen.dedup();
                if seen.len() != out.arms.len() {
                    return Err("bench rpc: --arms names an arm twice".into());
                }
            }
            "--repeats" => repeats = Some(number(a, v, 1, 100)?),
            "--rate" => out.rate = v.clone(),
            "--delay" => {
                // The proxy needs it as a duration; netem gets the text.
                crate::bench_rpc::delay_proxy::parse_delay(v)
                    .map_err(|e| format!("bench rpc: --{e}"))?;
                out.delay = Some(v.clone());
            }
            "--delay-mode" => delay_mode = Some(DelayMode::parse(v)?),
            "--groups" => out.groups = list(a, v, |g| number("--groups", g, 1, 64))?,
            "--streams" => out.streams = number(a, v, 1, 512)?,
            "--tokens" => tokens = Some(number(a, v, 1, 100_000)?),
            "--prompt-len" => out.prompt_len = number(a, v, 1, 4096)?,
            "--threads" => out.threads = number(a, v, 1, 256)?,
            "--bin-dir" => out.bin_dir = Some(v.clone()),
            "--burst" => out.burst = v.clone(),
            "--n-embd" => n_embd = Some(number(a, v, 16, 16384)?),
            "--model-size" => {
                out.model = match v.as_str() {
                    "small" => ModelShape::SMALL,
                    "medium" => ModelShape::MEDIUM,
                    other => {
                        return Err(format!(
                            "bench rpc: --model-size is small or medium, not `{other}`"
                        ));
                    }
                };
                out.model_name = v.clone();
            }
            other => return Err(format!("bench rpc: unknown option `{other}`\n{USAGE}")),
        }
    }
    if let Some(n) = n_embd {
        if n % out.model.n_head as usize != 0 {
            return Err(format!(
                "bench rpc: --n-embd must be a multiple of the model's {} heads",
                out.model.n_head
            ));
        }
        out.model.n_embd = n as u32;
        out.model_name = format!("{}-embd{n}", out.model_name);
    }
    match (delay_mode, &out.delay) {
        (Some(m), None) if m != DelayMode::Auto => {
            return Err("bench rpc: --delay-mode needs --delay".into());
        }
        (m, _) => out.delay_mode = m.unwrap_or(DelayMode::Auto),
    }
    // --quick shortens what was not given explicitly.
    out.repeats = repeats.unwrap_or(if out.quick { 1 } else { 3 });
    out.tokens = tokens.unwrap_or(if out.quick { 16 } else { 32 });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_are_four_stages_three_arms_three_repeats() {
        let a = parse(&[]);
        assert_eq!(a, Ok(RpcArgs::default()));
        let a = RpcArgs::default();
        assert_eq!((a.stages, a.repeats, a.tokens), (4, 3, 32));
        assert_eq!(a.arms, vec![Arm::Hub, Arm::Direct, Arm::Engine]);
        assert_eq!(a.groups, vec![1, 3]);
        assert_eq!(a.delay, None);
        assert_eq!(a.delay_mode, DelayMode::Auto);
    }

    #[test]
    fn delay_modes() {
        let mode = |v: &[&str]| parse(&s(v)).map(|a| (a.delay, a.delay_mode));
        assert_eq!(
            mode(&["--delay", "2ms"]),
            Ok((Some("2ms".into()), DelayMode::Auto))
        );
        assert_eq!(
            mode(&["--delay-mode", "proxy", "--delay", "5ms"]),
            Ok((Some("5ms".into()), DelayMode::Proxy))
        );
        assert_eq!(
            mode(&["--delay", "500us", "--delay-mode", "netem"]),
            Ok((Some("500us".into()), DelayMode::Netem))
        );
        assert_eq!(mode(&["--delay-mode", "auto"]), Ok((None, DelayMode::Auto)));
        for bad in [
            &["--delay-mode", "proxy"][..],
            &["--delay-mode", "netem"],
            &["--delay", "2ms", "--delay-mode", "tc"],
            &["--delay", "2"],
            &["--delay", "fast"],
            &["--delay", "0ms"],
        ] {
            assert!(parse(&s(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_every_option() -> Result<(), String> {
        let a = parse(&s(&[
            "--stages",
            "3",
            "--arms",
            "engine, hub",
            "--repeats",
            "5",
            "--rate",
            "50mbit",
            "--delay",
            "2ms",
            "--groups",
            "1,2,4",
            "--streams",
            "8",
            "--tokens",
            "16",
            "--prompt-len",
            "4",
            "--threads",
            "2",
            "--model-size",
            "medium",
            "--bin-dir",
            "/b",
        ]))?;
        assert_eq!(a.stages, 3);
        assert_eq!(a.arms, vec![Arm::Engine, Arm::Hub]);
        assert_eq!(
            (a.repeats, a.tokens, a.streams, a.prompt_len),
            (5, 16, 8, 4)
        );
        assert_eq!(a.rate, "50mbit");
        assert_eq!(a.delay.as_deref(), Some("2ms"));
        assert_eq!(a.groups, vec![1, 2, 4]);
        assert_eq!(a.threads, 2);
        assert_eq!(a.model, ModelShape::MEDIUM);
        assert_eq!(a.model_name, "medium");
        assert_eq!(a.bin_dir.as_deref(), Some("/b"));
        Ok(())
    }

    #[test]
    fn quick_shortens_only_what_was_not_given() {
        let q = parse(&s(&["--quick"]));
        assert_eq!(
            q.as_ref().map(|a| (a.quick, a.repeats, a.tokens)),
            Ok((true, 1, 16))
        );
        let e = parse(&s(&["--n-embd", "512"]));
        assert_eq!(
            e.map(|a| (a.model.n_embd, a.model.n_ff, a.model_name)),
            Ok((512, ModelShape::SMALL.n_ff, "small-embd512".to_string()))
        );
        let c = parse(&s(&["--check-lab"]));
        assert_eq!(c.map(|a| (a.check_lab, a.quick)), Ok((true, false)));
        let q = parse(&s(&["--repeats", "2", "--quick"]));
        assert_eq!(q.as_ref().map(|a| (a.repeats, a.tokens)), Ok((2, 16)));
    }

    #[test]
    fn refuses_bad_values() {
        for bad in [
            &["--stages", "1"][..],
            &["--stages", "x"],
            &["--stages"],
            &["--arms", "hub,bogus"],
            &["--arms", "hub,hub"],
            &["--arms", ","],
            &["--groups", "0"],
            &["--repeats", "0"],
            &["--model-size", "huge"],
            &["--n-embd", "100"],
            &["--bogus", "1"],
        ] {
            assert!(parse(&s(bad)).is_err(), "{bad:?}");
        }
    }
}
