//! Project automation: `cargo xtask test`, `cargo xtask bench`.
//!
//! Std-only on purpose: it compiles in seconds on a fresh machine, before
//! any system package is installed.

mod backend_ops;
mod bench;
mod bench_llama;
mod bench_mpi;
mod bench_peers;
mod bench_plugin;
mod bench_rpc;
mod bench_vm;
mod deps;
mod llama_tree;
mod netns;
mod plugin;
mod slurm;
mod step;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  test [--no-vm] [--no-ggml] [--no-python] [--python-only]
                      install what is needed, then fmt check, clippy -D warnings,
                      every test of the workspace, the Open MPI smoke pass
                      (mpi-smoke below), transfer-rpc against real
                      ggml / llama.cpp, the Python package's pytest suite, and
                      the verbs suite on soft-RoCE in a VM (the CI command; the
                      flags skip steps, --python-only runs just that one)
  bench [options]     the main job: the engine between two processes on this
                      machine over the default provider, next to raw baselines
                      (--quick, --full, --provider P, --nics N)
    --workload kv|weights|moe|all [--quick|--full] [--provider P]
                      the paper's workloads (WORKLOADS.md in transfer-bench)
                      over tcp and shm, the bound next to them, then the report
                      of every *.jsonl in target/bench/workloads (peers' too);
                      with --netns N [--link-rate R] on namespace hosts (Open
                      MPI too, mpirun reaching each namespace through an
                      `ip netns exec` rsh agent)
    --netns N [--link-rate 1gbit] [--link-delay 1ms]
                      N network-namespace hosts on this machine (root)
    --hosts h1,h2,... real hosts over ssh; h1 drives, the others serve
    --mpi [--workload kv|weights|moe|all] [--transport tcp|shm|all] [--quick|--full]
          [--out-dir D] [--repeats N] [--kv-notify send|put]
                      the Open MPI baseline of the workloads (a C program built
                      with mpicc, run under mpirun; records in D, default
                      target/bench/workloads)
    --peers [--quick] [--repeats 3] [--transports tcp,shm] [--engines ours,ours-caller,mooncake,nixl,nixl-caller] [--no-kv]
                      ours from Python next to NVIDIA NIXL and Mooncake TE (pinned, from
                      PyPI into target/peers-venv), issue 20's rows + the kv workload
    --vm [--quick]    over the native verbs backend inside the soft-RoCE VM,
                      next to perftest (smoke mode unless --quick / --full)
  bench rpc [--stages 4] [--arms hub,direct,engine] [--repeats 3] [--rate 200mbit]
            [--delay 2ms] [--delay-mode auto|netem|proxy] [--groups 1,3] [--streams 32]
            [--tokens 32] [--quick] [--model-size small|medium] [--prompt-len 8]
            [--threads 1] [--bin-dir D]
                      the transfer-rpc pipeline over P namespace servers, the
                      coordinator's link shaped (root; --delay with netem, or
                      a user-space delay proxy where the kernel lacks sch_netem)
  bench llama-rpc [--llama-bin DIR] [--threads default,2,...] [--rounds N] [--model F] [--dev]
                      unmodified llama-bench --rpc over two of our servers vs two
                      stock rpc-servers of that llama.cpp build, side by side
  mpi-smoke           only the Open MPI smoke pass of `test` (the workloads under
                      mpirun and kv across two namespaces when root,
                      transfer-bench launch and workloads launch (kv) as
                      mpirun jobs; uses the
                      tests step's target/debug/transfer-bench)
  bench llama-plugin [--servers 2,4] [--rate 100mbit] [--delay 1ms] [--rounds 3]
            [--engine] [--llama-bin DIR] [--pp 64] [--tg 32] [--reps 2] [--threads 1]
                      unmodified llama-bench --rpc with the stock libggml-rpc.so
                      vs our plugin (libggml-rpc-trpc.so), same servers on
                      namespace hosts, the client's link shaped (root; --delay
                      through the delay proxy), interleaved rounds
  verbs-vm            only the soft-RoCE VM step (transfer-verbs suite, engine link)
  backend-ops [--full] [-o OPS] [-p PARAMS] [--server PATH] [--llama-bin DIR]
            [--journal FILE] [--resume FILE]... [--shard K/N]
                      llama.cpp's test-backend-ops (mode test, unmodified, from
                      the llama-tree build, or DIR's) against transfer-rpc-server
                      through ggml's RPC client; refused cases are counted and
                      the run goes on past them (default: the CI subset of ops).
                      Running counts after every client process and every
                      minute, each failure and abort with its reason at once,
                      every case in a JSON-lines journal (default
                      target/backend-ops/run-<time>.jsonl); --resume skips the
                      cases of earlier journals, --shard runs every N-th case
                      left (N runs side by side)
  backend-ops --tally FILE...
                      the tally of several journals (a run in slices) together
  llama-tree [TARGET...]
                      download (PyPI's llama-cpp-python 0.3.36 source archive,
                      sha256-pinned), configure and build llama.cpp's cmake
                      TARGETs under target/llama-cpp-0.3.36/ (incremental);
                      prints the folder of the built programs
  deps                install (or print how to install) the system packages
  slurm-smoke [--mode quick|smoke] [--bin PATH]
                      opt-in (root): a throwaway Slurm cluster on this machine
                      (munge, slurmctld, two slurmd as nodes n1 n2) runs one
                      real `srun -N2 transfer-bench launch` job, then stops
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test::run(&args[1..]),
        Some("bench") if args.get(1).is_some_and(|a| a == "rpc") => bench_rpc::run(&args[2..]),
        Some("bench") if args.get(1).is_some_and(|a| a == "llama-rpc") => {
            bench_llama::run(&args[2..])
        }
        Some("bench") if args[1..].iter().any(|a| a == "--peers") => bench_peers::run(&args[1..]),
        Some("bench") if args.get(1).is_some_and(|a| a == "llama-plugin") => {
            bench_plugin::run(&args[2..])
        }
        Some("bench") => bench::run(&args[1..]),
        // Internal: the bulk transfer `bench rpc` runs between namespace hosts.
        Some("link-probe") => bench_rpc::link_probe::run(&args[1..]),
        // Internal: `bench rpc --delay` without sch_netem.
        Some("delay-proxy") => bench_rpc::delay_proxy::run(&args[1..]),
        Some("backend-ops") => backend_ops::run_cli(&args[1..]),
        Some("llama-tree") => {
            let targets: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            llama_tree::ensure_built(&targets).map(|bin| println!("{}", bin.display()))
        }
        Some("deps") => deps::ensure(&deps::RUNTIME),
        Some("verbs-vm") => test::verbs_vm(),
        Some("mpi-smoke") => bench_mpi::smoke(&test::bench_binary()),
        Some("slurm-smoke") => slurm::run(&args[1..]),
        Some("help" | "--help" | "-h") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}
