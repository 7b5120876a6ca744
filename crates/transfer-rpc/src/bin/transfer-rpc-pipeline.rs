//! `transfer-rpc-pipeline`: writes synthetic llama GGUFs and runs a llama
//! model layer-split over transfer-rpc servers (hub, direct or engine
//! stage boundaries), printing per-step counters and a summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use transfer_rpc::client::ClientConfig;
use transfer_rpc::pipeline::decode::prompts_of_lengths;
use transfer_rpc::pipeline::placement::parse_tensor_split;
use transfer_rpc::pipeline::synthetic::WeightType;
use transfer_rpc::pipeline::{
    Arm, LlamaModel, RunReport, RunSpec, SyntheticSpec, default_prompts, run_groups,
};

#[derive(Debug, Parser)]
#[command(name = "transfer-rpc-pipeline", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write a random-weight llama GGUF (F32 norms; matrices, token_embd and
    /// output of `--weight-type`).
    MakeModel {
        /// Output path.
        #[arg(long)]
        out: PathBuf,
        /// Embedding width.
        #[arg(long, default_value_t = 256)]
        n_embd: u32,
        /// Layers.
        #[arg(long, default_value_t = 4)]
        n_layer: u32,
        /// Attention heads.
        #[arg(long, default_value_t = 4)]
        n_head: u32,
        /// Key/value heads.
        #[arg(long, default_value_t = 2)]
        n_head_kv: u32,
        /// Feed-forward width.
        #[arg(long, default_value_t = 512)]
        n_ff: u32,
        /// Vocabulary size.
        #[arg(long, default_value_t = 128)]
        n_vocab: u32,
        /// Seed of the weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Type of the weight matrices (token_embd and output included):
        /// f32, f16, q8_0 or q4_0 (quantized by ggml itself; n_embd and
        /// n_ff must then be multiples of 32).
        #[arg(long, default_value = "f32")]
        weight_type: String,
        /// Give the model a byte-fallback SentencePiece vocabulary, so
        /// llama.cpp's programs run it from a text prompt (n_vocab >= 259).
        #[arg(long)]
        byte_vocab: bool,
    },
    /// Run greedy decoding over the servers.
    Run {
        /// The GGUF.
        #[arg(long)]
        model: PathBuf,
        /// Servers, one per stage: HOST:PORT[,HOST:PORT...].
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// Where the servers reach each other (the destination a direct
        /// copy names), one per server in `--servers` order (default:
        /// `--servers`). Needed when the coordinator reaches the servers
        /// through a relay they cannot use themselves, such as the bench's
        /// user-space delay proxy on the coordinator's loopback.
        #[arg(long, value_delimiter = ',')]
        peer_endpoints: Vec<String>,
        /// Layer split ratios, one per server (default: equal).
        #[arg(long, default_value = "")]
        tensor_split: String,
        /// Stage boundary path: hub, direct or engine.
        #[arg(long, default_value = "direct")]
        arm: String,
        /// Streams (tokens per step).
        #[arg(long, default_value_t = 4)]
        streams: u32,
        /// Prompt tokens per stream.
        #[arg(long, default_value_t = 8)]
        prompt_len: u32,
        /// Ragged prompts: tokens of each stream's prompt, one per stream
        /// (e.g. 3,5,8; overrides `--prompt-len`). Same token pattern as
        /// the uniform prompts, truncated or extended per stream.
        #[arg(long, value_delimiter = ',')]
        prompt_lens: Vec<u32>,
        /// Tokens to generate per stream.
        #[arg(long, default_value_t = 32)]
        tokens: u32,
        /// Pipeline groups at once (a ring over the servers).
        #[arg(long, default_value_t = 1)]
        groups: usize,
        /// Write one JSON object with the results here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Print only errors.
        #[arg(long)]
        quiet: bool,
        /// Engine arm: how long a destination waits for a write's
        /// immediates before the step is redone on the fallback path.
        #[arg(long, default_value_t = 10_000)]
        engine_wait_ms: u32,
    },
    /// Run ggml's own RPC server (upstream's `rpc-server`, compiled from
    /// the ggml this crate computes with) on the CPU device until killed.
    /// The llama-rpc bench runs it next to ours, so a difference between
    /// ggml versions is not read as a difference between servers.
    #[cfg(feature = "upstream-rpc")]
    UpstreamServer {
        /// Address to listen on.
        #[arg(short = 'H', long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on.
        #[arg(short, long, default_value_t = 50052)]
        port: u16,
        /// CPU threads (default: half the hardware threads, as upstream's
        /// `rpc-server`).
        #[arg(short, long)]
        threads: Option<usize>,
    },
}

fn run(cli: Cli) -> transfer_rpc::Result<()> {
    match cli.cmd {
        Cmd::MakeModel {
            out,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            n_vocab,
            seed,
            weight_type,
            byte_vocab,
        } => {
            let spec = SyntheticSpec {
                weight_type: WeightType::parse(&weight_type)?,
                n_embd,
                n_layer,
                n_head,
                n_head_kv,
                n_ff,
                n_vocab,
                seed,
            };
            if byte_vocab {
                spec.build_tokenizable()?.write(&out)?;
            } else {
                spec.write(&out)?;
            }
            eprintln!("transfer-rpc-pipeline: wrote {} ({spec:?})", out.display());
            Ok(())
        }
        Cmd::Run {
            model,
            servers,
            peer_endpoints,
            tensor_split,
            arm,
            streams,
            prompt_len,
            prompt_lens,
            tokens,
            groups,
            json,
            quiet,
            engine_wait_ms,
        } => {
            let arm = Arm::parse(&arm)?;
            let ratios = parse_tensor_split(&tensor_split, servers.len())?;
            let n_vocab = LlamaModel::open(&model)?.hparams.n_vocab;
            let prompts = if prompt_lens.is_empty() {
                default_prompts(streams, prompt_len, n_vocab)
            } else if prompt_lens.len() != streams as usize {
                return Err(transfer_rpc::RpcError::refused(
                    "--prompt-lens",
                    format!(
                        "{} lengths for {streams} streams (one per stream)",
                        prompt_lens.len()
                    ),
                ));
            } else {
                prompts_of_lengths(&prompt_lens, n_vocab)
            };
            let spec = RunSpec {
                model,
                endpoints: servers,
                peer_endpoints: (!peer_endpoints.is_empty()).then_some(peer_endpoints),
                ratios,
                arm,
                streams,
                prompts,
                tokens,
                groups,
                client: ClientConfig::default(),
                keep_logits: false,
                engine_wait_ms,
            };
            let result = run_groups(&spec)?;
            let report = RunReport::new(arm, streams, tokens, &result)?;
            if !quiet {
                println!("{}", report.counters);
                print!("{}", report.summary());
            }
            if let Some(path) = json {
                std::fs::write(&path, report.to_json() + "\n")
                    .map_err(|e| transfer_rpc::RpcError::io("--json", e))?;
            }
            Ok(())
        }
        #[cfg(feature = "upstream-rpc")]
        Cmd::UpstreamServer {
            host,
            port,
            threads,
        } => upstream_server(&host, port, threads),
    }
}

#[cfg(feature = "upstream-rpc")]
fn upstream_server(host: &str, port: u16, threads: Option<usize>) -> transfer_rpc::Result<()> {
    let threads = threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
    });
    eprintln!("transfer-rpc-pipeline: ggml's rpc-server on {host}:{port}, {threads} threads");
    transfer_rpc::upstream::serve(&format!("{host}:{port}"), threads)
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transfer-rpc-pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}
