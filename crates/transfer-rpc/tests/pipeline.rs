//! The pipeline coordinator against in-process servers (ggml CPU backend)
//! on a tiny synthetic llama GGUF, with llama.cpp itself (llama.h on its
//! CPU backend, same GGUF) as the reference for the greedy tokens.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use llama_cpp_sys_2 as sys;
use transfer_rpc::RpcError;
use transfer_rpc::client::ClientConfig;
use transfer_rpc::pipeline::counters::CounterTable;
use transfer_rpc::pipeline::decode::prompts_of_lengths;
use transfer_rpc::pipeline::synthetic::WeightType;
use transfer_rpc::pipeline::{
    Arm, GroupsResult, LlamaModel, Pipeline, PipelineConfig, RunReport, RunSpec, SyntheticSpec,
    default_prompts, run_groups,
};
use transfer_rpc::protocol::Command;
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig, ServerHandle};

/// Direct copies between the test's servers on loopback.
fn loopback_peers() -> PeerAllow {
    PeerAllow::parse(&["loopback".to_string()]).unwrap()
}
use transfer_rpc::validate::GraphLimits;

const SPEC: SyntheticSpec = SyntheticSpec {
    n_embd: 64,
    n_layer: 4,
    n_head: 4,
    n_head_kv: 2,
    n_ff: 128,
    n_vocab: 128,
    seed: 7,
    weight_type: WeightType::F32,
};
const STREAMS: u32 = 3;
const PROMPT_LEN: u32 = 4;
const NEW_TOKENS: u32 = 10;
/// The weight types besides F32 the coordinator is checked on.
const QUANTIZED: [WeightType; 3] = [WeightType::F16, WeightType::Q8_0, WeightType::Q4_0];
/// Largest |logit - llama.cpp's| accepted on the quantized models. Measured
/// (x86-64 AVX2): 0 for F16 and Q8_0 (same kernels, same batch shapes),
/// 4.8e-7 for Q4_0 (llama.cpp repacks Q4_0 layer weights into its
/// CPU_REPACK layout, whose kernel sums in another order); the margin
/// leaves room for other CPUs' repack kernels.
const QUANT_LOGIT_TOLERANCE: f32 = 1e-4;

struct Fixture {
    path: PathBuf,
    prompts: Vec<Vec<i32>>,
    ref_tokens: Vec<Vec<i32>>,
    ref_logits: Vec<Vec<Vec<f32>>>,
}

/// Greedy decode with llama.cpp on its CPU backend: flash attention and an
/// F16 KV cache set explicitly (the coordinator's graph does the same), all
/// streams decoded together, one token per stream per llama_decode (the
/// batch shape of the coordinator's steps, so the matrix kernels see the
/// same shapes), sequence b = stream b, one unified KV cache. Prompts may
/// differ in length, fed as the coordinator does: at step i stream b feeds
/// its prompt's token i, then the token it generated at step i - 1; a
/// stream with all its tokens repeats its last one until the others finish
/// (its logits ignored), so every llama_decode has all the streams.
fn llama_reference(
    path: &Path,
    prompts: &[Vec<i32>],
    n_new: u32,
) -> (Vec<Vec<i32>>, Vec<Vec<Vec<f32>>>) {
    let b = prompts.len();
    let max_len = prompts.iter().map(Vec::len).max().unwrap();
    let n_new = n_new as usize;
    let mut tokens = vec![Vec::new(); b];
    let mut logits = vec![Vec::new(); b];
    // SAFETY: llama.h used as documented; every pointer is checked and the
    // batch arrays are written within the n_tokens they were made for.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        let mut no_devices = [std::ptr::null_mut()];
        mp.devices = no_devices.as_mut_ptr();
        mp.n_gpu_layers = 0;
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let model = sys::llama_model_load_from_file(cpath.as_ptr(), mp);
        assert!(!model.is_null(), "llama.cpp loads the synthetic model");
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = 256;
        cp.n_batch = 16;
        cp.n_ubatch = 16;
        cp.n_seq_max = b as u32;
        cp.kv_unified = true;
        cp.n_threads = 1;
        cp.n_threads_batch = 1;
        cp.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.type_k = sys::GGML_TYPE_F16;
        cp.type_v = sys::GGML_TYPE_F16;
        let ctx = sys::llama_init_from_model(model, cp);
        assert!(!ctx.is_null(), "context");
        let batch = sys::llama_batch_init(b as i32, 0, 1);
        for i in 0..max_len + n_new - 1 {
            let mut batch_i = batch;
            batch_i.n_tokens = b as i32;
            for s in 0..b {
                let len = prompts[s].len();
                *batch.token.add(s) = if i < len {
                    prompts[s][i]
                } else {
                    let g: &Vec<i32> = &tokens[s];
                    g[(i - len).min(g.len() - 1)]
                };
                *batch.pos.add(s) = i as i32;
                *batch.n_seq_id.add(s) = 1;
                *(*batch.seq_id.add(s)) = s as i32;
                *batch.logits.add(s) = 1;
            }
            assert_eq!(sys::llama_decode(ctx, batch_i), 0, "llama_decode");
            for s in 0..b {
                if i + 1 >= prompts[s].len() && tokens[s].len() < n_new {
                    let l = sys::llama_get_logits_ith(ctx, s as i32);
                    assert!(!l.is_null());
                    let l = std::slice::from_raw_parts(l, SPEC.n_vocab as usize).to_vec();
                    tokens[s].push(transfer_rpc::pipeline::argmax(&l));
                    logits[s].push(l);
                }
            }
        }
        sys::llama_batch_free(batch);
        sys::llama_free(ctx);
        sys::llama_model_free(model);
    }
    (tokens, logits)
}

/// llama.cpp's backend init and model loading are process-global:
/// references are made one at a time.
static LLAMA: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Prompt lengths of the ragged-prompt tests, one per stream: the shortest
/// stream generates from step 1, the longest from step 4, and every stream
/// finishes at another step.
const RAGGED_LENS: [u32; STREAMS as usize] = [2, 5, 3];

/// The F32 model with prompts of `RAGGED_LENS` and llama.cpp's answers.
fn ragged_fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = fixture().path.clone();
        let prompts = prompts_of_lengths(&RAGGED_LENS, SPEC.n_vocab);
        let (ref_tokens, ref_logits) = {
            let _one_at_a_time = LLAMA.lock().unwrap_or_else(|e| e.into_inner());
            llama_reference(&path, &prompts, NEW_TOKENS)
        };
        Fixture {
            path,
            prompts,
            ref_tokens,
            ref_logits,
        }
    })
}

/// The F32 model and llama.cpp's answers on it.
fn fixture() -> &'static Fixture {
    typed_fixture(WeightType::F32)
}

/// `SPEC` with its matrices of type `ty` (written by ggml's own quantizer)
/// and llama.cpp's answers on it, made once per type.
fn typed_fixture(ty: WeightType) -> &'static Fixture {
    static F: [OnceLock<Fixture>; WeightType::ALL.len()] =
        [const { OnceLock::new() }; WeightType::ALL.len()];
    let i = WeightType::ALL.iter().position(|t| *t == ty).unwrap();
    F[i].get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("trpc-pipeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("tiny-llama-{}.gguf", ty.name()));
        SyntheticSpec {
            weight_type: ty,
            ..SPEC
        }
        .write(&path)
        .unwrap();
        let prompts = default_prompts(STREAMS, PROMPT_LEN, SPEC.n_vocab);
        let (ref_tokens, ref_logits) = {
            let _one_at_a_time = LLAMA.lock().unwrap_or_else(|e| e.into_inner());
            llama_reference(&path, &prompts, NEW_TOKENS)
        };
        Fixture {
            path,
            prompts,
            ref_tokens,
            ref_logits,
        }
    })
}

fn start_server(extensions: bool) -> ServerHandle {
    Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 64 << 20,
            extensions,
            peer_allow: loopback_peers(),
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap()
}

fn servers(n: usize) -> Vec<ServerHandle> {
    (0..n).map(|_| start_server(true)).collect()
}

fn endpoints(s: &[ServerHandle]) -> Vec<String> {
    s.iter().map(ServerHandle::endpoint).collect()
}

fn spec(endpoints: Vec<String>, arm: Arm, groups: usize) -> RunSpec {
    spec_for(fixture(), endpoints, arm, groups)
}

fn spec_for(f: &Fixture, endpoints: Vec<String>, arm: Arm, groups: usize) -> RunSpec {
    RunSpec {
        model: f.path.clone(),
        ratios: vec![1.0; endpoints.len()],
        endpoints,
        peer_endpoints: None,
        arm,
        streams: STREAMS,
        prompts: f.prompts.clone(),
        tokens: NEW_TOKENS,
        groups,
        client: ClientConfig::default(),
        keep_logits: true,
        engine_wait_ms: 10_000,
    }
}

fn run(endpoints: Vec<String>, arm: Arm, groups: usize) -> (GroupsResult, RunReport) {
    run_for(fixture(), endpoints, arm, groups)
}

fn run_for(
    f: &Fixture,
    endpoints: Vec<String>,
    arm: Arm,
    groups: usize,
) -> (GroupsResult, RunReport) {
    let r = run_groups(&spec_for(f, endpoints, arm, groups)).unwrap();
    let report = RunReport::new(arm, STREAMS, NEW_TOKENS, &r).unwrap();
    (r, report)
}

fn max_logit_diff(r: &GroupsResult) -> f32 {
    max_logit_diff_for(fixture(), r)
}

fn max_logit_diff_for(f: &Fixture, r: &GroupsResult) -> f32 {
    let mut d = 0f32;
    for (ours, theirs) in r.groups[0].output.logits.iter().zip(&f.ref_logits) {
        assert_eq!(ours.len(), theirs.len());
        for (a, b) in ours.iter().zip(theirs) {
            for (x, y) in a.iter().zip(b) {
                d = d.max((x - y).abs());
            }
        }
    }
    d
}

#[test]
fn tokens_equal_llama_cpp_for_one_to_four_stages() {
    let f = fixture();
    assert_eq!(f.ref_tokens.len(), STREAMS as usize);
    for p in 1..=4 {
        let s = servers(p);
        let (r, report) = run(endpoints(&s), Arm::Direct, 1);
        let diff = max_logit_diff(&r);
        println!(
            "P={p}: tokens {:?}, max |logit - llama.cpp| = {diff:e}, md5 {}",
            r.groups[0].output.tokens, report.tokens_md5
        );
        assert_eq!(r.groups[0].output.tokens, f.ref_tokens, "P={p}");
        // Same kernels on the same batch shape: bit-identical in practice.
        assert!(diff <= 1e-5, "P={p}: max logit difference {diff}");
        for h in &s {
            assert_eq!(h.shared().refused_connections(), 0);
        }
    }
}

/// The quantized (and F16) models, whose matrices the servers multiply in
/// ggml's quantized kernels: the tokens are llama.cpp's on 1 and 3 stages,
/// hub and direct alike, and the logits within `QUANT_LOGIT_TOLERANCE`.
#[test]
fn quantized_models_give_llama_cpp_tokens_on_one_and_three_stages() {
    for ty in QUANTIZED {
        let f = typed_fixture(ty);
        let mut worst = 0f32;
        for (p, arm) in [(1, Arm::Direct), (3, Arm::Direct), (3, Arm::Hub)] {
            let s = servers(p);
            let (r, report) = run_for(f, endpoints(&s), arm, 1);
            let diff = max_logit_diff_for(f, &r);
            worst = worst.max(diff);
            println!(
                "{ty} P={p} {arm}: max |logit - llama.cpp| = {diff:e}, md5 {}",
                report.tokens_md5
            );
            assert_eq!(r.groups[0].output.tokens, f.ref_tokens, "{ty} P={p} {arm}");
            assert!(
                diff <= QUANT_LOGIT_TOLERANCE,
                "{ty} P={p} {arm}: max logit difference {diff}"
            );
            assert!(report.fallbacks.is_empty(), "{ty}: {:?}", report.fallbacks);
            if p > 1 {
                assert_eq!(report.arm_used, arm.to_string());
            }
            for h in &s {
                assert_eq!(h.shared().refused_connections(), 0);
            }
        }
        println!("{ty}: worst max |logit - llama.cpp| = {worst:e}");
    }
    // The types really differ: each quantization moves the logits away
    // from the F32 model's (so no run above silently used F32 weights).
    let f32_logits = &fixture().ref_logits;
    for ty in QUANTIZED {
        let q = &typed_fixture(ty).ref_logits;
        let moved = q
            .iter()
            .flatten()
            .flatten()
            .zip(f32_logits.iter().flatten().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("{ty}: max |logit - F32 model's| = {moved:e}");
        assert!(moved > 1e-4, "{ty}: logits equal the F32 model's");
    }
}

/// Prompts of different lengths (2, 5, 3) decode in one batch: every
/// stream's tokens and logits are llama.cpp's (fed the same way) on 1 and 3
/// stages, hub and direct.
#[test]
fn ragged_prompts_give_llama_cpp_tokens_on_one_and_three_stages() {
    let f = ragged_fixture();
    // The ragged prompts really are ragged and change the answers.
    let lens: Vec<usize> = f.prompts.iter().map(Vec::len).collect();
    assert_eq!(lens, [2, 5, 3]);
    assert_ne!(f.ref_tokens, fixture().ref_tokens);
    for t in &f.ref_tokens {
        assert_eq!(t.len(), NEW_TOKENS as usize);
    }
    for (p, arm) in [(1, Arm::Direct), (3, Arm::Direct), (3, Arm::Hub)] {
        let s = servers(p);
        let (r, report) = run_for(f, endpoints(&s), arm, 1);
        let out = &r.groups[0].output;
        let diff = max_logit_diff_for(f, &r);
        println!(
            "ragged P={p} {arm}: tokens {:?}, max |logit - llama.cpp| = {diff:e}",
            out.tokens
        );
        assert_eq!(out.tokens, f.ref_tokens, "P={p} {arm}");
        assert!(diff <= 1e-5, "P={p} {arm}: max logit difference {diff}");
        // Generating steps: from the shortest prompt's last token (step 1)
        // to the end (step 5 + 10 - 2 = 13).
        assert_eq!(out.step_secs.len(), 13, "P={p} {arm}");
        assert_eq!(report.runtime_fallbacks, 0);
        for h in &s {
            assert_eq!(h.shared().refused_connections(), 0);
        }
    }
}

/// The longest prompt sets the context: one cell short of it is refused
/// before any step (naming the longest prompt), exactly enough decodes.
#[test]
fn ragged_prompts_need_the_longest_prompt_in_the_context() {
    let f = ragged_fixture();
    let s = servers(1);
    let mut model = LlamaModel::open(&f.path).unwrap();
    // Positions 0 ..= max_len + n_new - 2 are used.
    let need = 5 + NEW_TOKENS - 1;
    for ctx in [need - 1, need] {
        let mut p = Pipeline::new(
            &mut model,
            &PipelineConfig {
                endpoints: endpoints(&s),
                peer_endpoints: None,
                ratios: vec![1.0],
                arm: Arm::Direct,
                streams: STREAMS,
                ctx,
                client: ClientConfig::default(),
                engine_wait_ms: 10_000,
            },
        )
        .unwrap();
        let r = p.greedy(&f.prompts, NEW_TOKENS, false);
        if ctx < need {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("5 prompt (the longest)"), "{e}");
        } else {
            assert_eq!(r.unwrap().tokens, f.ref_tokens);
        }
    }
}

#[test]
fn hub_and_direct_give_identical_tokens() {
    for p in 1..=4 {
        let s = servers(p);
        let (_, hub) = run(endpoints(&s), Arm::Hub, 1);
        let (_, direct) = run(endpoints(&s), Arm::Direct, 1);
        assert_eq!(hub.tokens_md5, direct.tokens_md5, "P={p}");
        assert_eq!(hub.arm_used, if p == 1 { "none" } else { "hub" });
        assert_eq!(direct.arm_used, if p == 1 { "none" } else { "direct" });
        assert!(hub.fallbacks.is_empty() && direct.fallbacks.is_empty());
        assert_eq!(direct.runtime_fallbacks, 0);
    }
}

/// `other` has, per step, exactly `boundaries` fewer GET_TENSOR and
/// SET_TENSOR than `hub`, and the hidden state's bytes are gone on both
/// sides: SET_TENSOR frames (header 9, tensor 296, cache flag 1, offset 8,
/// data) and GET_TENSOR answers (8 + data).
fn assert_hidden_state_removed(
    hub: &CounterTable,
    other: &CounterTable,
    boundaries: f64,
    hidden: u64,
) {
    let (get, set) = (Command::GetTensor, Command::SetTensor);
    assert_eq!(
        hub.per_step(get).count - other.per_step(get).count,
        boundaries,
        "GET_TENSOR per step"
    );
    assert_eq!(
        hub.per_step(set).count - other.per_step(set).count,
        boundaries,
        "SET_TENSOR per step"
    );
    assert_eq!(
        hub.per_step(set).request_bytes - other.per_step(set).request_bytes,
        boundaries * (9.0 + 296.0 + 1.0 + 8.0 + hidden as f64)
    );
    assert_eq!(
        hub.per_step(get).response_bytes - other.per_step(get).response_bytes,
        boundaries * (8.0 + hidden as f64)
    );
}

#[test]
fn direct_removes_the_hidden_state_from_the_coordinator() {
    let hidden = u64::from(STREAMS) * u64::from(SPEC.n_embd) * 4;
    for p in [2usize, 4] {
        let s = servers(p);
        let (_, hub) = run(endpoints(&s), Arm::Hub, 1);
        let (_, direct) = run(endpoints(&s), Arm::Direct, 1);
        println!(
            "P={p} hub:\n{}\nP={p} direct:\n{}",
            hub.counters, direct.counters
        );
        let b = (p - 1) as f64;
        let (h, d) = (&hub.counters, &direct.counters);
        assert_hidden_state_removed(h, d, b, hidden);
        assert_eq!(d.per_step(Command::CopyTensorTo).count, b);
        assert_eq!(h.per_step(Command::CopyTensorTo).count, 0.0);
        // Everything else the direct arm adds is the small COPY_TENSOR_TO.
        let copy = d.per_step(Command::CopyTensorTo);
        assert!(copy.request_bytes / b < 1024.0 && copy.response_bytes / b <= 9.0);
        assert!(
            hub.coordinator_bytes_per_step() - direct.coordinator_bytes_per_step()
                > b * 2.0 * hidden as f64 - b * 1024.0
        );
        assert_eq!(hub.tokens_md5, direct.tokens_md5);
    }
}

#[test]
fn engine_falls_back_to_direct_and_direct_to_hub() {
    let f = fixture();
    // Our servers, without an engine: engine -> direct on every boundary.
    let s = servers(3);
    let (r, report) = run(endpoints(&s), Arm::Engine, 1);
    assert_eq!(report.arm_used, "direct");
    assert_eq!(report.fallbacks.len(), 2);
    assert!(
        report
            .fallbacks
            .iter()
            .all(|x| x.from == Arm::Engine && x.to == Arm::Direct)
    );
    assert_eq!(r.groups[0].output.tokens, f.ref_tokens);
    assert!(report.to_json().contains("\"fallbacks\":2"));

    // The middle server behaves like upstream (extension off): neither of
    // its boundaries can go direct, both fall back to the hub.
    let s = [start_server(true), start_server(false), start_server(true)];
    let (r, report) = run(endpoints(&s), Arm::Direct, 1);
    assert_eq!(report.arm_used, "hub");
    assert_eq!(report.fallbacks.len(), 2);
    assert!(
        report
            .fallbacks
            .iter()
            .all(|x| x.from == Arm::Direct && x.to == Arm::Hub)
    );
    assert_eq!(r.groups[0].output.tokens, f.ref_tokens);
    assert_eq!(report.counters.per_step(Command::CopyTensorTo).count, 0.0);
    // Engine against that set: engine -> direct -> hub.
    let (r, report) = run(endpoints(&s), Arm::Engine, 1);
    assert_eq!(report.arm_used, "hub");
    assert_eq!(report.fallbacks.len(), 4);
    assert_eq!(r.groups[0].output.tokens, f.ref_tokens);
}

#[test]
fn three_groups_in_a_ring_match_the_single_group_run() {
    let s = servers(3);
    let (single, _) = run(endpoints(&s), Arm::Direct, 1);
    let (r, report) = run(endpoints(&s), Arm::Direct, 3);
    assert_eq!(r.groups.len(), 3);
    let firsts: Vec<&String> = r.groups.iter().map(|g| &g.endpoints[0]).collect();
    assert!(firsts[0] != firsts[1] && firsts[1] != firsts[2] && firsts[0] != firsts[2]);
    for g in &r.groups {
        assert_eq!(
            g.output.tokens, single.groups[0].output.tokens,
            "group {}",
            g.group
        );
        assert_eq!(g.output.tokens, fixture().ref_tokens);
    }
    assert_eq!(report.groups, 3);
    assert!(report.tokens_per_s > 0.0);
}

#[test]
fn a_server_that_never_answers_is_an_error_naming_stage_and_server() {
    let live = start_server(true);
    // Accepts connections (the kernel does) but never answers HELLO; kept
    // bound so no other test's server can take the port.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = silent.local_addr().unwrap().to_string();
    let mut sp = spec(vec![live.endpoint(), dead.clone()], Arm::Direct, 1);
    sp.client.io_timeout = Some(std::time::Duration::from_millis(300));
    let err = run_groups(&sp).unwrap_err();
    match &err {
        RpcError::Stage { stage, server, .. } => {
            assert_eq!(*stage, 1);
            assert_eq!(server, &dead);
        }
        other => panic!("expected a stage error, got {other}"),
    }
    assert!(err.to_string().contains(&dead));
    println!("{err}");
}

#[test]
fn a_server_dying_mid_run_is_an_error_naming_its_stage() {
    use transfer_rpc::pipeline::{LlamaModel, Pipeline, PipelineConfig};
    for (dying, arm) in [(1usize, Arm::Direct), (2, Arm::Direct), (1, Arm::Hub)] {
        let mut s = servers(3);
        let mut model = LlamaModel::open(&fixture().path).unwrap();
        let mut p = Pipeline::new(
            &mut model,
            &PipelineConfig {
                endpoints: endpoints(&s),
                peer_endpoints: None,
                ratios: vec![1.0; 3],
                arm,
                streams: STREAMS,
                ctx: 16,
                client: ClientConfig::default(),
                engine_wait_ms: 10_000,
            },
        )
        .unwrap();
        let tokens = vec![1; STREAMS as usize];
        p.step(&tokens, 0).unwrap();
        let dead = s[dying].endpoint();
        s[dying].shutdown();
        let mut err = None;
        for pos in 1..4 {
            if let Err(e) = p.step(&tokens, pos) {
                err = Some(e);
                break;
            }
        }
        match err {
            Some(RpcError::Stage { stage, server, .. }) => {
                assert_eq!((stage, &server), (dying, &dead), "{arm}");
            }
            other => panic!("{arm}: expected a stage error, got {other:?}"),
        }
    }
}

/// The engine arm: servers with a TransferEngine over libfabric's tcp
/// provider on loopback (skipped with a printed reason where libfabric
/// cannot open it).
#[cfg(feature = "engine")]
mod engine_arm {
    use super::*;
    use transfer_rpc::engine_link::{EngineLink, EngineLinkConfig};
    use transfer_rpc::pipeline::BoundaryPath;
    use transfer_rpc::protocol::engine::CloseKind;

    /// A server with its own engine, or `None` (reason printed).
    fn engine_server() -> Option<ServerHandle> {
        let link = match EngineLink::open(EngineLinkConfig::loopback("tcp")) {
            Ok(l) => l,
            // A failure instead where TRANSFER_REQUIRE names tcp.
            Err(e) => {
                transfer_core::testing::skip_or_fail("tcp", format!("cannot open the engine: {e}"));
                return None;
            }
        };
        let server = Server::bind(
            ServerConfig {
                bind: "127.0.0.1:0".into(),
                memory_quota: 64 << 20,
                max_buffer_size: 64 << 20,
                engine: Some(link),
                peer_allow: loopback_peers(),
                ..ServerConfig::default()
            },
            Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
        )
        .unwrap()
        .spawn()
        .unwrap();
        Some(server)
    }

    fn engine_servers(n: usize) -> Option<Vec<ServerHandle>> {
        (0..n).map(|_| engine_server()).collect()
    }

    #[test]
    fn engine_arm_gives_the_reference_tokens_for_one_to_four_stages() {
        let f = fixture();
        for p in 1..=4 {
            let Some(s) = engine_servers(p) else { return };
            let (r, report) = run(endpoints(&s), Arm::Engine, 1);
            assert_eq!(r.groups[0].output.tokens, f.ref_tokens, "P={p}");
            assert!(max_logit_diff(&r) <= 1e-5, "P={p}");
            assert_eq!(report.arm_used, if p == 1 { "none" } else { "engine" });
            assert!(report.fallbacks.is_empty(), "P={p}: {:?}", report.fallbacks);
            assert_eq!(report.runtime_fallbacks, 0, "P={p}");
        }
    }

    #[test]
    fn engine_arm_gives_the_reference_tokens_on_quantized_models() {
        for ty in QUANTIZED {
            let f = typed_fixture(ty);
            let Some(s) = engine_servers(3) else { return };
            let (r, report) = run_for(f, endpoints(&s), Arm::Engine, 1);
            let diff = max_logit_diff_for(f, &r);
            println!("{ty} P=3 engine: max |logit - llama.cpp| = {diff:e}");
            assert_eq!(r.groups[0].output.tokens, f.ref_tokens, "{ty}");
            assert!(diff <= QUANT_LOGIT_TOLERANCE, "{ty}: {diff}");
            assert_eq!(report.arm_used, "engine");
            assert!(report.fallbacks.is_empty(), "{ty}: {:?}", report.fallbacks);
            assert_eq!(report.runtime_fallbacks, 0, "{ty}");
        }
    }

    #[test]
    fn engine_removes_the_hidden_state_and_the_barrier_from_the_coordinator() {
        let hidden = u64::from(STREAMS) * u64::from(SPEC.n_embd) * 4;
        for p in [2usize, 4] {
            let Some(s) = engine_servers(p) else { return };
            let (_, hub) = run(endpoints(&s), Arm::Hub, 1);
            let (_, engine) = run(endpoints(&s), Arm::Engine, 1);
            println!("P={p} engine:\n{}", engine.counters);
            let b = (p - 1) as f64;
            let (h, e) = (&hub.counters, &engine.counters);
            // Exactly one hidden-state round trip per boundary per step is
            // gone, and no COPY_TENSOR_TO / PEER_BARRIER replaces it.
            assert_hidden_state_removed(h, e, b, hidden);
            assert_eq!(e.per_step(Command::CopyTensorTo).count, 0.0);
            assert_eq!(e.per_step(Command::PeerBarrier).count, 0.0);
            // What replaces it: one small ENGINE_WRITE on the source and
            // one ENGINE_WAIT on the destination per boundary.
            let write = e.per_step(Command::EngineWrite);
            let wait = e.per_step(Command::EngineWait);
            assert_eq!((write.count, wait.count), (b, b));
            assert!(write.request_bytes / b < 400.0 && wait.request_bytes / b < 64.0);
            assert_eq!(hub.tokens_md5, engine.tokens_md5);
        }
    }

    #[test]
    fn engine_arm_gives_the_reference_tokens_on_ragged_prompts() {
        let f = ragged_fixture();
        for p in [1usize, 3] {
            let Some(s) = engine_servers(p) else { return };
            let (r, report) = run_for(f, endpoints(&s), Arm::Engine, 1);
            assert_eq!(r.groups[0].output.tokens, f.ref_tokens, "P={p}");
            assert!(max_logit_diff_for(f, &r) <= 1e-5, "P={p}");
            assert_eq!(report.arm_used, if p == 1 { "none" } else { "engine" });
            assert!(report.fallbacks.is_empty(), "P={p}: {:?}", report.fallbacks);
            assert_eq!(report.runtime_fallbacks, 0, "P={p}");
        }
    }

    #[test]
    fn engine_falls_back_to_direct_where_a_server_has_no_engine() {
        let f = fixture();
        let Some(first) = engine_server() else { return };
        let Some(last) = engine_server() else { return };
        let s = [first, start_server(true), last];
        let (r, report) = run(endpoints(&s), Arm::Engine, 1);
        assert_eq!(report.arm_used, "direct");
        assert_eq!(report.fallbacks.len(), 2, "{:?}", report.fallbacks);
        for x in &report.fallbacks {
            assert_eq!((x.from, x.to), (Arm::Engine, Arm::Direct));
            assert!(x.reason.contains("ENGINE_*"), "{}", x.reason);
        }
        assert_eq!(r.groups[0].output.tokens, f.ref_tokens);
    }

    #[test]
    fn a_failed_engine_step_is_redone_on_the_fallback_path() {
        let f = fixture();
        let Some(s) = engine_servers(3) else { return };
        let mut model = LlamaModel::open(&f.path).unwrap();
        let mut p = Pipeline::new(
            &mut model,
            &PipelineConfig {
                endpoints: endpoints(&s),
                peer_endpoints: None,
                ratios: vec![1.0; 3],
                arm: Arm::Engine,
                streams: STREAMS,
                ctx: PROMPT_LEN + NEW_TOKENS,
                client: ClientConfig::default(),
                engine_wait_ms: 300,
            },
        )
        .unwrap();
        // Only the broken boundary gets a short wait: a healthy write on a
        // slow CI machine must not be mistaken for a failure.
        p.boundaries[0].engine_wait_ms = 30_000;
        p.boundaries[1].engine_wait_ms = 300;
        // Break the second boundary behind the coordinator's back: its
        // source no longer knows the outbound target, so the next write is
        // refused and the destination's wait times out.
        let BoundaryPath::Engine(e) = p.boundaries[1].path else {
            panic!(
                "boundary 1 is not on the engine path: {:?}",
                p.boundaries[1].path
            )
        };
        assert!(
            p.stages[1]
                .client
                .engine_close(CloseKind::Outbound, e.outbound.0)
                .unwrap()
        );
        let out = p.greedy(&f.prompts, NEW_TOKENS, false).unwrap();
        assert_eq!(out.tokens, f.ref_tokens);
        assert!(matches!(p.boundaries[0].path, BoundaryPath::Engine(_)));
        assert_eq!(p.boundaries[1].path, BoundaryPath::Direct);
        assert_eq!(p.boundaries[1].runtime_fallbacks, 1);
        let why = p.boundaries[1].last_failure.clone().unwrap();
        println!("{why}");
        assert!(why.contains("boundary 1"), "{why}");
    }

    #[test]
    fn three_engine_groups_in_a_ring_match_the_reference() {
        let f = fixture();
        let Some(s) = engine_servers(3) else { return };
        let (r, report) = run(endpoints(&s), Arm::Engine, 3);
        assert_eq!(report.arm_used, "engine");
        assert!(report.fallbacks.is_empty(), "{:?}", report.fallbacks);
        assert_eq!(report.runtime_fallbacks, 0);
        for g in &r.groups {
            assert_eq!(g.output.tokens, f.ref_tokens, "group {}", g.group);
        }
    }
}
