//! llama.cpp's own op suite, `test-backend-ops` (mode `test`), run
//! unmodified against our `transfer-rpc-server` through ggml's stock RPC
//! client: every case is computed by ggml-cpu in the test process and by
//! the RPC device, and the results compared.
//!
//! `test-backend-ops` has no `--rpc` option: it tests every device in
//! ggml's registry. A small registration shim (`trpcshim.c`, loaded with
//! `GGML_BACKEND_PATH`) adds one RPC device for our server's endpoint
//! through the stock `libggml-rpc.so` of the same build.
//!
//! The stock client aborts its process (SIGABRT, `RPC_STATUS_ASSERT`) when
//! our server refuses a graph and closes the connection. So the suite runs
//! as a child process; after an abort the case in flight is counted as
//! refused (with the server's reason from its log) and the run goes on
//! with the cases after it, named one by one (`-o` takes full case
//! strings). The case order comes from a `support`-mode listing of the
//! same filter, which builds every case's graph but computes nothing.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench_rpc::json;
use crate::llama_tree;

/// The CI subset (`cargo xtask test`'s ggml step), two runs. First the
/// forms our validator refused before issue 22, selected by op (`-o`) and
/// params (`-p`): binary ops with a permuted operand (perm1), NORM of
/// non-packed rows, GLU of odd rows, SUM of a permuted source, SCALE of
/// BF16 (289 cases). Then a sample of what llama.cpp's models run, plus an
/// IM2COL_3D case of an empty result and the fused TOPK_QSA (ggml_cast's
/// CPY with itself as src[1], refused as a cycle before; 4 cases, ~1 s). The full suite (20,766
/// listed cases; FLASH_ATTN_EXT, CONV_2D, IM2COL_3D and MUL_MAT are most
/// of them) is `cargo xtask backend-ops --full`.
pub const CI_RUNS: [(&str, Option<&str>); 2] = [
    (
        "ADD,SUB,MUL,DIV,NORM,SWIGLU,GEGLU,REGLU,GEGLU_ERF,GEGLU_QUICK,SUM,SCALE",
        Some(
            r"perm1=1|noncontig_rows=1|ne_a=\[5,7,11,13\]|permute=\[1,0,2,3\]|type=bf16,ne=\[[0-9,]*\],scale",
        ),
    ),
    (
        "RMS_NORM,SUM_ROWS,MEAN,SILU,GELU,DUP,REPEAT,TOPK_QSA,\
IM2COL_3D(type_input=f32,type_kernel=f32,dst_type=f32,ne_input=[20,20,10,3],\
ne_kernel=[3,3,3,3],IC=3,s0=1,s1=1,s2=1,p0=0,p1=0,p2=0,d0=1,d1=1,d2=1,v=1)",
        None,
    ),
];

/// The op names of the fused cases of the pinned tree's
/// test-backend-ops.cpp (`llama_tree::VERSION`): the `op_desc` of the
/// cases whose `run_whole_graph()` is true, which `support` mode leaves
/// out of the listing, where no listed op has that name; `-o` entries,
/// plain names and one paren-free regex (`test_unary_mul`'s
/// `<UNARY>_MUL`).
const FUSED_OPS: [&str; 24] = [
    "ADD_ADD",
    "ADD_RMS_NORM",
    "FALCON",
    "GATED_DELTA_NET_CACHE_FUSION",
    "GROUP_NORM_MUL_ADD",
    "L2_NORM_BATCH",
    "LLAMA",
    "MOE_REDUCE",
    "MUL_MAT_ID_FUSION",
    "MUL_MAT_VEC_FUSION",
    "NORM_MUL_ADD",
    "NORM_SCALE",
    "RELU_SQR",
    "RMS_NORM_MUL_ADD",
    "RMS_NORM_MUL_ROPE",
    "RMS_NORM_SCALE",
    "ROPE_SET_ROWS",
    "SNAKE_FUSE",
    "SOFTCAP",
    "SSM_CONV_BIAS_SILU",
    "SSM_SCAN_ROLLBACK",
    "TOPK_MOE",
    "TOPK_QSA",
    "^[A-Z_]+_MUL$",
];

/// Longest one child run of the suite may take (the whole suite in one
/// process took 35-45 min here on 2 loaded cores).
const CHILD_LIMIT: Duration = Duration::from_secs(3 * 3600);
/// Longest a child may print nothing (one case in flight): the
/// MUL_MAT_ID cases with 128 q4_K experts of 4096x2048 (4.8 GB of F32 in
/// the client, quantized there) took over 300 s each with three shards
/// side by side on 2 loaded cores.
const CHILD_SILENCE: Duration = Duration::from_secs(1200);
/// Longest the server may take to listen.
const SERVER_START: Duration = Duration::from_secs(30);
/// Most bytes of case names one `-o` argument carries (the kernel's limit
/// for one argument is 128 KiB).
const FILTER_BYTES: usize = 100 * 1024;

/// What the suite said of each case.
#[derive(Default, Debug)]
pub struct Counts {
    /// Equal to ggml-cpu's result.
    pub ok: usize,
    /// Computed, but different from ggml-cpu's result.
    pub fail: Vec<String>,
    /// Refused by our server (the client aborted on that case and the
    /// server logged why): `(case, the server's reason)`.
    pub refused: Vec<(String, String)>,
    /// The client died on that case without a refusal in our server's log
    /// (a crash of either side, a timeout): `(case, what is known)`.
    pub aborted: Vec<(String, String)>,
    /// Not run because ggml-cpu does not support it.
    pub not_supported: usize,
    /// Skipped by the suite (large tensors).
    pub skipped: usize,
    /// Listed, but not selectable by name after an abort.
    pub not_run: Vec<String>,
}

impl Counts {
    fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} not supported by ggml-cpu, {} refused, {} aborted, \
             {} skipped, {} not run",
            self.ok,
            self.fail.len(),
            self.not_supported,
            self.refused.len(),
            self.aborted.len(),
            self.skipped,
            self.not_run.len()
        )
    }
}

/// A run as it goes: the counts so far, the listed cases done, printed
/// after every child process (and every minute within one) and, when a
/// journal is open, one JSON line per case and per progress report, so a
/// run killed at any point still leaves its tally.
struct Tally {
    counts: Counts,
    /// Listed cases (the `support` listing of the filters).
    listed: usize,
    /// Listed cases done (reported, refused, aborted or passed over) by
    /// this run.
    done: usize,
    /// Listed cases done by the run a resumed journal records.
    resumed: usize,
    start: Instant,
    last_print: Instant,
    journal: Option<std::fs::File>,
}

/// How often a progress line is printed within one child process.
const PROGRESS_EVERY: Duration = Duration::from_secs(60);

impl Tally {
    fn new(journal: Option<&Path>) -> Result<Tally, String> {
        let journal = match journal {
            Some(p) => {
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                }
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("opening the journal {}: {e}", p.display()))?;
                eprintln!("==> test-backend-ops: journal (JSON lines) {}", p.display());
                Some(f)
            }
            None => None,
        };
        Ok(Tally {
            counts: Counts::default(),
            listed: 0,
            done: 0,
            resumed: 0,
            start: Instant::now(),
            last_print: Instant::now(),
            journal,
        })
    }

    fn write(&mut self, line: String) {
        use std::io::Write;
        if let Some(f) = self.journal.as_mut() {
            // A journal that cannot be written is reported once and dropped:
            // the console still has the tally.
            if let Err(e) = writeln!(f, "{line}") {
                eprintln!("  (journal write failed, closing it: {e})");
                self.journal = None;
            }
        }
    }

    /// One case line of the suite.
    fn case(&mut self, case: &str, result: &str) {
        let plain = strip_ansi(result);
        let kind = classify(&mut self.counts, case, &plain);
        if kind == "fail" {
            eprintln!("  FAIL {case}: {plain}");
        }
        self.write(format!(
            "{{\"case\":{},\"result\":\"{kind}\",\"detail\":{}}}",
            json::string(case),
            json::string(&plain)
        ));
        if self.last_print.elapsed() > PROGRESS_EVERY {
            self.progress("running");
        }
    }

    /// A case the client died on: refused when our server logged a
    /// refusal, aborted otherwise. Printed at once.
    fn died(&mut self, case: String, refusal: Option<String>, client: &ChildOutput) {
        let client_tail = format!("client {}: {}", client.status, tail(&client.stderr, 3));
        let (kind, why) = match refusal {
            Some(r) => ("refused", format!("{r} [{client_tail}]")),
            None => ("aborted", client_tail),
        };
        eprintln!("  {} {case}: {why}", kind.to_uppercase());
        self.write(format!(
            "{{\"case\":{},\"result\":\"{kind}\",\"detail\":{}}}",
            json::string(&case),
            json::string(&why)
        ));
        if kind == "refused" {
            self.counts.refused.push((case, why));
        } else {
            self.counts.aborted.push((case, why));
        }
    }

    fn passed_over(&mut self, cases: &[String]) {
        for c in cases {
            self.write(format!(
                "{{\"case\":{},\"result\":\"not_run\",\"detail\":\"\"}}",
                json::string(c)
            ));
        }
        self.counts.not_run.extend(cases.iter().cloned());
    }

    /// The running counts, on the console and in the journal.
    fn progress(&mut self, label: &str) {
        self.last_print = Instant::now();
        let secs = self.start.elapsed().as_secs_f64();
        let done = self.done + self.resumed;
        eprintln!(
            "  [{label}] {}; {done} of {} listed cases done; {secs:.0} s",
            self.counts.summary(),
            self.listed
        );
        let c = &self.counts;
        let line = format!(
            "{{\"progress\":{},\"passed\":{},\"failed\":{},\"not_supported\":{},\
             \"refused\":{},\"aborted\":{},\"skipped\":{},\"not_run\":{},\"done\":{},\
             \"listed\":{},\"elapsed_s\":{secs:.1}}}",
            json::string(label),
            c.ok,
            c.fail.len(),
            c.not_supported,
            c.refused.len(),
            c.aborted.len(),
            c.skipped,
            c.not_run.len(),
            done,
            self.listed
        );
        self.write(line);
    }
}

/// What a run selects and where it writes.
#[derive(Default)]
pub struct Options<'a> {
    /// `-o`
    pub ops: Option<&'a str>,
    /// `-p`
    pub params: Option<&'a str>,
    /// A built llama.cpp `bin` folder to take test-backend-ops from instead
    /// of the llama tree's own build.
    pub llama_bin: Option<&'a Path>,
    /// The JSON-lines journal.
    pub journal: Option<&'a Path>,
    /// Cases already done (journals of earlier, killed runs): not run
    /// again, their results counted as they were.
    pub resume: &'a [PathBuf],
    /// `(k, n)`: run only the `k`-th of every `n` cases still to do (from
    /// 0), named case by case, so that `n` runs share the listing.
    pub shard: Option<(usize, usize)>,
}

/// `cargo xtask backend-ops [--full] [-o OPS] [-p PARAMS] [--server PATH]
/// [--llama-bin DIR] [--journal FILE] [--resume FILE]... [--shard K/N]`
/// (no `-o` / `-p` / `--full`: the CI subset), or `cargo xtask backend-ops
/// --tally FILE...` (the tally of journals together).
pub fn run_cli(args: &[String]) -> Result<(), String> {
    let mut ops: Option<String> = None;
    let mut full = false;
    let mut params: Option<String> = None;
    let mut server: Option<PathBuf> = None;
    let mut llama_bin: Option<PathBuf> = None;
    let mut journal: Option<PathBuf> = None;
    let mut resume: Vec<PathBuf> = Vec::new();
    let mut shard: Option<(usize, usize)> = None;
    let mut tally_only = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("backend-ops: {name} needs a value"))
        };
        match a.as_str() {
            "--full" => full = true,
            "-o" => ops = Some(value("-o")?),
            "-p" => params = Some(value("-p")?),
            "--server" => server = Some(PathBuf::from(value("--server")?)),
            "--llama-bin" => llama_bin = Some(PathBuf::from(value("--llama-bin")?)),
            "--journal" => journal = Some(PathBuf::from(value("--journal")?)),
            "--resume" => resume.push(PathBuf::from(value("--resume")?)),
            "--shard" => shard = Some(parse_shard(&value("--shard")?)?),
            "--tally" => tally_only = true,
            other if tally_only => resume.push(PathBuf::from(other)),
            other => return Err(format!("backend-ops: unknown option `{other}`")),
        }
    }
    if tally_only {
        let counts = tally_journals(&resume)?;
        report(&counts, Duration::ZERO);
        return verdict(&counts);
    }
    let server = match server {
        Some(s) => s,
        None => crate::test::build_rpc_server()?,
    };
    if !full && ops.is_none() && params.is_none() {
        return run_ci_with(&server, llama_bin.as_deref());
    }
    // A journal by default for the runs by hand (the long ones).
    let journal = journal.unwrap_or_else(|| {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        llama_tree::root()
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join(format!("backend-ops/run-{stamp}.jsonl"))
    });
    let opts = Options {
        ops: ops.as_deref(),
        params: params.as_deref(),
        llama_bin: llama_bin.as_deref(),
        journal: Some(&journal),
        resume: &resume,
        shard,
    };
    let start = Instant::now();
    let counts = run(&server, &opts)?;
    report(&counts, start.elapsed());
    verdict(&counts)
}

/// The CI step: the runs of `CI_RUNS` against `server`; any FAIL or
/// refusal fails the step, and so does a run that passed no case.
pub fn run_ci(server: &Path) -> Result<(), String> {
    run_ci_with(server, None)
}

/// [`run_ci`] with test-backend-ops from `llama_bin` when given.
fn run_ci_with(server: &Path, llama_bin: Option<&Path>) -> Result<(), String> {
    let name = "llama.cpp test-backend-ops against transfer-rpc-server";
    let start = Instant::now();
    for (i, (ops, params)) in CI_RUNS.iter().enumerate() {
        eprintln!(
            "==> {name} (run {} of {}): -o {ops}{}",
            i + 1,
            CI_RUNS.len(),
            params.map(|p| format!(" -p {p}")).unwrap_or_default()
        );
        // Each run's own time (the build, if any, included), not the
        // step's total so far.
        let run_start = Instant::now();
        let opts = Options {
            ops: Some(ops),
            params: *params,
            llama_bin,
            ..Options::default()
        };
        let counts = run(server, &opts)?;
        report(&counts, run_start.elapsed());
        verdict(&counts).map_err(|e| format!("{name}: {e}"))?;
    }
    let secs = start.elapsed().as_secs_f64();
    crate::step::record(name, secs, true);
    eprintln!("==> {name}: ok ({secs:.1} s)");
    Ok(())
}

fn report(c: &Counts, took: Duration) {
    for f in &c.fail {
        eprintln!("  FAIL {f}");
    }
    for (case, why) in &c.refused {
        eprintln!("  REFUSED {case}: {why}");
    }
    for (case, why) in &c.aborted {
        eprintln!("  ABORTED {case}: {why}");
    }
    for case in &c.not_run {
        eprintln!("  NOT RUN {case}");
    }
    eprintln!(
        "==> test-backend-ops: {} in {:.1} s",
        c.summary(),
        took.as_secs_f64()
    );
}

fn verdict(c: &Counts) -> Result<(), String> {
    if !c.fail.is_empty() || !c.refused.is_empty() || !c.aborted.is_empty() || !c.not_run.is_empty()
    {
        return Err(format!("test-backend-ops: {}", c.summary()));
    }
    if c.ok == 0 {
        return Err("test-backend-ops passed no case: the RPC device was not tested".into());
    }
    Ok(())
}

/// `K/N` with `K < N`.
fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let parsed = s
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
    match parsed {
        Some((k, n)) if k < n => Ok((k, n)),
        _ => Err(format!(
            "backend-ops: --shard takes K/N with K < N, not `{s}`"
        )),
    }
}

/// The cases `journals` record, each once (a case in several counts as
/// the last one says), with their results.
fn journal_union(journals: &[PathBuf]) -> Result<Vec<(String, String, String)>, String> {
    let mut order: Vec<String> = Vec::new();
    let mut last: std::collections::HashMap<String, (String, String)> =
        std::collections::HashMap::new();
    for j in journals {
        for (case, kind, detail) in journal_cases(j)? {
            if last.insert(case.clone(), (kind, detail)).is_none() {
                order.push(case);
            }
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|c| last.remove(&c).map(|(k, d)| (c, k, d)))
        .collect())
}

/// Counts one journal record.
fn count_record(counts: &mut Counts, case: String, kind: &str, detail: String) {
    match kind {
        "refused" => counts.refused.push((case, detail)),
        "aborted" => counts.aborted.push((case, detail)),
        "not_run" => counts.not_run.push(case),
        "fail" => counts.fail.push(format!("{case}: {detail}")),
        "ok" => counts.ok += 1,
        "not_supported" => counts.not_supported += 1,
        "skipped" => counts.skipped += 1,
        _ => {}
    }
}

/// The tally of `journals` together (a run sliced into several).
fn tally_journals(journals: &[PathBuf]) -> Result<Counts, String> {
    let mut counts = Counts::default();
    let cases = journal_union(journals)?;
    let n = cases.len();
    for (case, kind, detail) in cases {
        count_record(&mut counts, case, &kind, detail);
    }
    eprintln!(
        "==> test-backend-ops: {n} cases in {} journal(s)",
        journals.len()
    );
    Ok(counts)
}

/// The cases a journal records as done, with their results (`ok`, `fail`,
/// ...) and details.
fn journal_cases(path: &Path) -> Result<Vec<(String, String, String)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the journal {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        // Progress records have no "case"; a torn last line (a killed
        // run) does not parse: both are passed over.
        let Ok(record) = json::parse(line) else {
            continue;
        };
        let (Some(case), Some(kind)) = (record.str("case"), record.str("result")) else {
            continue;
        };
        let detail = record.str("detail").unwrap_or_default();
        let (case, kind, detail) = (case.to_string(), kind.to_string(), detail.to_string());
        out.push((case, kind, detail));
    }
    Ok(out)
}

/// The listed cases, walked in order as the suite reports them.
struct Walk<'a> {
    cases: &'a [String],
    listed: HashSet<&'a str>,
    /// Every case reported so far (a fused case may be run twice).
    seen: HashSet<String>,
    /// Names the full listing holds more than once (119 of them in the
    /// 0.3.36 suite): a child naming one runs every case of that name.
    twins: HashSet<String>,
    /// The last case reported by the current child.
    last: Option<String>,
    tally: Tally,
}

impl Walk<'_> {
    /// One stdout line of a child.
    fn line(&mut self, line: &str) {
        if let Some((case, result)) = case_line(line) {
            let (case, result) = (case.to_string(), result.to_string());
            self.report(case, &result);
        } else if let Some(slice) = line.strip_prefix("  FAIL fa_vec slice: ") {
            // The FLASH_ATTN_EXT vector-kernel sweep the suite runs after
            // the cases when FLASH_ATTN_EXT is selected (Metal only).
            self.tally.case(&format!("fa_vec slice {slice}"), "FAIL");
        }
    }

    fn report(&mut self, case: String, result: &str) {
        let done = self.tally.done;
        if self.listed.contains(case.as_str()) {
            // Cases named in a batch that `-o` cannot select (its parser
            // splits entries at the first `)`) are passed over. A name
            // listed twice selects both cases, wherever they are: its
            // report moves the walk only where the walk stands (else a twin
            // run out of place, done in an earlier batch or left to another
            // shard, would pass over the cases up to the later one), and it
            // is not counted twice.
            let skip = if self.twins.contains(&case) {
                (self.cases.get(done) == Some(&case)).then_some(0)
            } else {
                self.cases[done..].iter().position(|c| *c == case)
            };
            if let Some(skip) = skip {
                let over: Vec<String> = self.cases[done..done + skip]
                    .iter()
                    .filter(|c| !self.seen.contains(*c))
                    .cloned()
                    .collect();
                self.tally.passed_over(&over);
                self.tally.done += skip + 1;
            }
        }
        if self.seen.insert(case.clone()) {
            self.tally.case(&case, result);
        }
        self.last = Some(case);
    }
}

/// Builds what the suite needs and runs the cases selected by `opts`
/// against a fresh `server` on a free loopback port.
pub fn run(server: &Path, opts: &Options) -> Result<Counts, String> {
    let bin = match opts.llama_bin {
        Some(b) => b.to_path_buf(),
        None => llama_tree::ensure_built(&["test-backend-ops", "ggml-cpu", "ggml-rpc"])?,
    };
    let shim = build_shim()?;
    let server = Server::start(server)?;
    let suite = Suite {
        program: bin.join("test-backend-ops"),
        shim,
        endpoint: format!("127.0.0.1:{}", server.port),
        log: server.log.clone(),
    };
    let (ops, params) = (opts.ops, opts.params);

    // The case order, from a listing that computes nothing. `support` mode
    // leaves out the fused cases (several nodes checked as one graph), so
    // those are not in it.
    let listing_start = Instant::now();
    let listing = suite.run(&["support"], ops, params, &mut |_| {})?;
    if !listing.status_ok {
        return Err(format!(
            "test-backend-ops support listing failed ({}): {}",
            listing.status,
            tail(&listing.stderr, 5)
        ));
    }
    let mut cases: Vec<String> = listing
        .stdout
        .lines()
        .filter_map(|l| case_line(l).map(|(case, _)| case.to_string()))
        .collect();
    // An empty listing is fine when the device is there (a filter
    // selecting only fused cases, which `support` mode leaves out).
    if cases.is_empty() && !listing.stdout.contains("RPC0") {
        return Err(format!(
            "test-backend-ops listed no case for the RPC device (is the shim loaded?): {}",
            tail(&listing.stderr, 5)
        ));
    }
    eprintln!(
        "==> test-backend-ops: {} cases listed (and the fused ones) in {:.1} s",
        cases.len(),
        listing_start.elapsed().as_secs_f64()
    );
    let twins: HashSet<String> = {
        let mut once: HashSet<&str> = HashSet::new();
        cases
            .iter()
            .filter(|c| !once.insert(c.as_str()))
            .cloned()
            .collect()
    };
    let mut tally = Tally::new(opts.journal)?;
    tally.listed = cases.len();
    let mut seen: HashSet<String> = HashSet::new();
    // Resuming: the journals' cases count as they were and are not run
    // again; the rest of the listing is named case by case (and so is a
    // shard's part of it).
    let resumed = !opts.resume.is_empty();
    if resumed {
        let mut done_names: HashSet<String> = HashSet::new();
        for (case, kind, detail) in journal_union(opts.resume)? {
            // Passed over before: run again.
            if kind == "not_run" {
                continue;
            }
            seen.insert(case.clone());
            done_names.insert(case.clone());
            count_record(&mut tally.counts, case, &kind, detail);
        }
        let before_len = cases.len();
        cases.retain(|c| !done_names.contains(c));
        tally.resumed = before_len - cases.len();
    }
    if let Some((k, n)) = opts.shard {
        cases = cases
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % n == k)
            .map(|(_, c)| c)
            .collect();
        tally.listed = tally.resumed + cases.len();
    }
    let by_name = resumed || opts.shard.is_some();
    if by_name {
        tally.progress("resumed");
    }

    let mut walk = Walk {
        cases: &cases,
        listed: cases.iter().map(String::as_str).collect(),
        seen,
        twins,
        last: None,
        tally,
    };
    let mut first = !by_name;
    let mut aborted = false;
    let mut batches = 0usize;
    while first || walk.tally.done < cases.len() {
        let batch_start = Instant::now();
        batches += 1;
        // The first run takes the filters as given (fused cases included);
        // after an abort the rest of the listing is named case by case.
        let batch: Vec<String> = if first {
            Vec::new()
        } else {
            take_batch(&cases[walk.tally.done..])
        };
        let done_before = walk.tally.done;
        walk.last = None;
        let out = if first {
            suite.run(&["test"], ops, params, &mut |l| walk.line(l))?
        } else {
            let filter = batch.join(",");
            suite.run(&["test"], Some(&filter), None, &mut |l| walk.line(l))?
        };
        let mark = out.log_mark;
        first = false;
        walk.tally.progress(&format!(
            "process {batches}: {} cases in {:.0} s",
            walk.tally.done - done_before,
            batch_start.elapsed().as_secs_f64()
        ));
        let done = walk.tally.done;
        if !out.signalled {
            // It ran to its end (a FAIL makes the exit status 1): every case
            // it was given must have been reported.
            if done == done_before && done < cases.len() {
                return Err(format!(
                    "test-backend-ops exited ({}) without reporting a case after {done} of {} \
                     listed cases: {}",
                    out.status,
                    cases.len(),
                    tail(&out.stderr, 5)
                ));
            }
            continue;
        }
        aborted = true;
        let refusal = refusal_reason(&out.log, mark);
        if done == cases.len() {
            // Every listed case reported, then the client died: in the
            // FLASH_ATTN_EXT slice sweep or a fused case at the end.
            let after = walk.last.clone().unwrap_or_default();
            walk.tally.died(
                format!("(a fused case or the fa_vec sweep after {after})"),
                refusal,
                &out,
            );
            break;
        }
        let next = cases[done].clone();
        if !batch.is_empty() {
            // Cases named one by one: the listed case after the last one
            // reported was in flight.
            walk.tally.died(next, refusal, &out);
            walk.tally.done += 1;
            continue;
        }
        // The first run (fused cases included): the listed case after the
        // last one reported was in flight, or a fused case before it: run
        // that listed case alone to tell.
        let last = walk.last.clone();
        let mut alone_lines: Vec<String> = Vec::new();
        let alone = suite.run(&["test"], Some(&next), None, &mut |l| {
            alone_lines.push(l.to_string())
        })?;
        let mut alone_reported = false;
        for l in &alone_lines {
            if let Some((case, result)) = case_line(l) {
                if case == next {
                    alone_reported = true;
                    if walk.seen.insert(case.to_string()) {
                        walk.tally.case(case, result);
                    }
                }
            }
        }
        if !alone_reported && !alone.signalled {
            walk.tally.passed_over(std::slice::from_ref(&next));
        } else if alone_reported {
            let after = last.unwrap_or_default();
            walk.tally.died(
                format!("(a fused case between {after} and {next})"),
                refusal,
                &out,
            );
        } else {
            let why = refusal_reason(&alone.log, alone.log_mark).or(refusal);
            walk.tally.died(next, why, &alone);
        }
        walk.tally.done += 1;
    }

    // After an abort the listing was run case by case, without the fused
    // cases: run those now, selected by their own names (a fused case
    // named like a listed op, e.g. ADD with nf > 1, is not reached this
    // way: only a run without abort reaches it). `-o` has no negation a
    // filter could use here: an entry holding `(` is taken as one exact
    // case name, so no grouped regex reaches the op-name matcher.
    if (aborted || resumed) && ops.is_none() && opts.shard.is_none() {
        let listed_ops: HashSet<&str> = walk
            .listed
            .iter()
            .filter_map(|c| c.split_once('(').map(|(op, _)| op))
            .collect();
        let names: Vec<&str> = FUSED_OPS
            .iter()
            .copied()
            .filter(|n| !listed_ops.contains(n))
            .collect();
        walk.last = None;
        let out = suite.run(&["test"], Some(&names.join(",")), params, &mut |l| {
            walk.line(l)
        })?;
        if out.signalled {
            let refusal = refusal_reason(&out.log, out.log_mark);
            let after = walk.last.clone().unwrap_or_default();
            walk.tally.died(
                format!("(a fused case after {after}; the fused cases after it were not run)"),
                refusal,
                &out,
            );
        }
        walk.tally.progress("fused cases");
    } else if aborted {
        eprintln!(
            "  (the fused cases after the abort were not run: `-o {}` selects them)",
            FUSED_OPS.join(",")
        );
    }
    drop(server);
    walk.tally.progress("end");
    Ok(walk.tally.counts)
}

/// test-backend-ops with the shim, against one server.
struct Suite {
    program: PathBuf,
    shim: PathBuf,
    endpoint: String,
    log: PathBuf,
}

impl Suite {
    /// Runs `mode` on the RPC device with the filters given, handing each
    /// stdout line to `on_line` as it comes.
    fn run(
        &self,
        mode: &[&str],
        ops: Option<&str>,
        params: Option<&str>,
        on_line: &mut dyn FnMut(&str),
    ) -> Result<ChildOutput, String> {
        let mut cmd = Command::new(&self.program);
        cmd.args(mode).args(["-b", "RPC0"]);
        add_filters(&mut cmd, ops, params);
        cmd.env("GGML_BACKEND_PATH", &self.shim)
            .env("TRANSFER_RPC_ENDPOINT", &self.endpoint)
            // No gdb backtrace on an abort (a refused case).
            .env("GGML_NO_BACKTRACE", "1");
        let log_mark = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let mut out = run_child(&mut cmd, on_line)?;
        out.log_mark = log_mark;
        out.log = self.log.clone();
        Ok(out)
    }
}

fn add_filters(cmd: &mut Command, ops: Option<&str>, params: Option<&str>) {
    if let Some(o) = ops {
        cmd.arg("-o").arg(o);
    }
    if let Some(p) = params {
        cmd.arg("-p").arg(p);
    }
}

/// The next cases that fit in one `-o` argument (at least one).
fn take_batch(remaining: &[String]) -> Vec<String> {
    let mut bytes = 0usize;
    let mut out = Vec::new();
    for c in remaining {
        if !out.is_empty() && bytes + c.len() + 1 > FILTER_BYTES {
            break;
        }
        bytes += c.len() + 1;
        out.push(c.clone());
    }
    out
}

/// A console line of one case, `  OP(params): result`, split into the
/// case string (what `-o` matches) and the result. The result follows the
/// last `): ` (params hold no `): `).
fn case_line(line: &str) -> Option<(&str, &str)> {
    let line = line.strip_prefix("  ")?;
    let cut = line.rfind("): ")?;
    let case = &line[..=cut];
    let op_end = case.find('(')?;
    let op = &case[..op_end];
    if op.is_empty() || !op.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    Some((case, line[cut + 3..].trim()))
}

/// Counts one case by its result (colour codes stripped) and says which
/// kind it was (the journal's `result`).
fn classify(counts: &mut Counts, case: &str, plain: &str) -> &'static str {
    if plain.ends_with("OK") {
        counts.ok += 1;
        "ok"
    } else if plain.ends_with("FAIL") {
        counts.fail.push(format!("{case}: {plain}"));
        "fail"
    } else if plain.starts_with("not supported") {
        counts.not_supported += 1;
        "not_supported"
    } else if plain.starts_with("skipping") {
        counts.skipped += 1;
        "skipped"
    } else {
        counts
            .fail
            .push(format!("{case}: unrecognised result `{plain}`"));
        "fail"
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out.trim().to_string()
}

/// The server's last session error logged after byte `mark` of its log.
fn refusal_reason(log: &Path, mark: u64) -> Option<String> {
    let mut f = std::fs::File::open(log).ok()?;
    f.seek(SeekFrom::Start(mark)).ok()?;
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    text.lines()
        .rfind(|l| l.contains("refused"))
        .map(|l| l.trim_start_matches("transfer-rpc-server: ").to_string())
}

struct ChildOutput {
    /// Where the server's log stood when the child started, and the log.
    log_mark: u64,
    log: PathBuf,
    status: String,
    status_ok: bool,
    /// Killed by a signal (the stock client's abort on a refusal, or our
    /// kill past `CHILD_LIMIT` / `CHILD_SILENCE`).
    signalled: bool,
    stdout: String,
    stderr: String,
}

/// Runs a child to completion, handing each stdout line to `on_line` as
/// it comes; stderr is read on a thread so that neither pipe fills. A
/// child running past `CHILD_LIMIT`, or silent on stdout for
/// `CHILD_SILENCE` (a case that hangs), is killed and reported as
/// signalled, its stderr naming why.
fn run_child(cmd: &mut Command, on_line: &mut dyn FnMut(&str)) -> Result<ChildOutput, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {:?}: {e}", cmd.get_program()))?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let stdout = child.stdout.take();
    let deadline = Instant::now() + CHILD_LIMIT;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out_thread = std::thread::spawn(move || {
        if let Some(o) = stdout {
            for line in BufReader::new(o).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }
    });
    let mut lines = Vec::new();
    let mut last_line = Instant::now();
    let mut killed: Option<String> = None;
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            on_line(&l);
            lines.push(l);
            last_line = Instant::now();
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline || last_line.elapsed() > CHILD_SILENCE => {
                killed = Some(if Instant::now() > deadline {
                    format!("killed by the runner: ran past {} s", CHILD_LIMIT.as_secs())
                } else {
                    format!(
                        "killed by the runner: no output for {} s",
                        CHILD_SILENCE.as_secs()
                    )
                });
                let _ = child.kill();
                match child.wait() {
                    Ok(s) => break s,
                    Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
                }
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    let _ = out_thread.join();
    for l in rx.try_iter() {
        on_line(&l);
        lines.push(l);
    }
    let mut stderr = err_thread.join().unwrap_or_default();
    if let Some(k) = killed {
        stderr.push_str(&k);
    }
    Ok(ChildOutput {
        log_mark: 0,
        log: PathBuf::new(),
        status: status.to_string(),
        status_ok: status.success(),
        signalled: status.code().is_none(),
        stdout: lines.join("\n"),
        stderr,
    })
}

/// The last `n` lines of `s`, on one line.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// `libggml-trpcshim.so`, compiled from `trpcshim.c` when missing or older
/// than its source.
fn build_shim() -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/trpcshim.c");
    let out = llama_tree::root().join("libggml-trpcshim.so");
    let fresh = match (std::fs::metadata(&src), std::fs::metadata(&out)) {
        (Ok(s), Ok(o)) => match (s.modified(), o.modified()) {
            (Ok(s), Ok(o)) => o >= s,
            _ => false,
        },
        _ => false,
    };
    if fresh {
        return Ok(out);
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    crate::step::run(
        "compile the RPC registration shim (libggml-trpcshim.so)",
        Command::new(&cc)
            .args([
                "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
            ])
            .arg(&out)
            .arg(&src)
            .arg("-ldl"),
    )?;
    Ok(out)
}

/// Our server on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
    /// Its stdout and stderr.
    log: PathBuf,
}

impl Server {
    fn start(program: &Path) -> Result<Server, String> {
        // A port the kernel just handed out and released: free unless
        // something grabs it in between (then the server fails to bind
        // and we say so).
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let log = llama_tree::root().join(format!("transfer-rpc-server-{port}.log"));
        let log = log.as_path();
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let err_file = log_file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = Command::new(program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(err_file))
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let deadline = Instant::now() + SERVER_START;
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Server {
                    child,
                    port,
                    log: log.to_path_buf(),
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{} exited ({status}) before listening on port {port}; log: {}",
                    program.display(),
                    log.display()
                ));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not listen on port {port} within {} s",
                    program.display(),
                    SERVER_START.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The refusal reasons were taken from it as the run went.
        let _ = std::fs::remove_file(&self.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_lines_split_at_the_last_paren() {
        assert_eq!(
            case_line(
                "  ADD(type=f16,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=1,src_overlap=0): \u{1b}[1;32mOK\u{1b}[0m"
            ),
            Some((
                "ADD(type=f16,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=1,src_overlap=0)",
                "\u{1b}[1;32mOK\u{1b}[0m"
            ))
        );
        assert_eq!(case_line("Testing 2 devices"), None);
        assert_eq!(case_line("  Backend 2/2: RPC0"), None);
        let mut c = Counts::default();
        let kinds: Vec<&str> = [
            "\u{1b}[1;31mFAIL\u{1b}[0m",
            "[X] MAA = 1 > 0 \u{1b}[1;32mOK\u{1b}[0m",
            "not supported [CPU]",
        ]
        .iter()
        .map(|r| classify(&mut c, "X()", &strip_ansi(r)))
        .collect();
        assert_eq!(kinds, ["fail", "ok", "not_supported"]);
        assert_eq!((c.ok, c.fail.len(), c.not_supported), (1, 1, 1));
    }

    #[test]
    fn a_journal_reads_back_what_the_tally_wrote() {
        let path = std::env::temp_dir().join(format!(
            "xtask-backend-ops-journal-{}.jsonl",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let mut t = Tally::new(Some(&path)).expect("journal opens");
        t.case("ADD(type=f16,ne=[1,2,3,4])", "\u{1b}[1;32mOK\u{1b}[0m");
        t.case("MUL(x=\"q\\\")", "FAIL");
        t.progress("process 1");
        let client = ChildOutput {
            log_mark: 0,
            log: PathBuf::new(),
            status: "signal: 6 (SIGABRT)".into(),
            status_ok: false,
            signalled: true,
            stdout: String::new(),
            stderr: "load_backend: x\nggml-rpc.cpp:1: RPC_STATUS_ASSERT\n".into(),
        };
        t.died("NORM(eps=1)".into(), Some("refused: rows".into()), &client);
        t.died("SUM(a=1)".into(), None, &client);
        drop(t);
        let back = journal_cases(&path).expect("journal reads");
        let _ = std::fs::remove_file(&path);
        let kinds: Vec<(&str, &str)> = back
            .iter()
            .map(|(c, k, _)| (c.as_str(), k.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("ADD(type=f16,ne=[1,2,3,4])", "ok"),
                ("MUL(x=\"q\\\")", "fail"),
                ("NORM(eps=1)", "refused"),
                ("SUM(a=1)", "aborted"),
            ]
        );
        assert!(back[2].2.starts_with("refused: rows [client signal: 6"));
        assert!(back[3].2.ends_with("RPC_STATUS_ASSERT"));
    }

    #[test]
    fn a_twin_run_out_of_place_passes_nothing_over() {
        // A shard names X(1) and test-backend-ops also runs X(1)'s twin,
        // listed earlier (another shard's), before A(1).
        let cases: Vec<String> = ["A(1)", "X(1)", "B(1)"].map(String::from).to_vec();
        let mut walk = Walk {
            cases: &cases,
            listed: cases.iter().map(String::as_str).collect(),
            seen: HashSet::new(),
            twins: HashSet::from(["X(1)".to_string()]),
            last: None,
            tally: Tally::new(None).expect("no journal"),
        };
        for l in ["  X(1): OK", "  A(1): OK", "  X(1): OK", "  B(1): OK"] {
            walk.line(l);
        }
        assert_eq!(walk.tally.done, 3);
        assert!(walk.tally.counts.not_run.is_empty());
        assert_eq!(walk.tally.counts.ok, 3);
        // A name `-o` cannot select is still passed over.
        let cases: Vec<String> = ["A(1)", "P(f(x))", "B(1)"].map(String::from).to_vec();
        let mut walk = Walk {
            cases: &cases,
            listed: cases.iter().map(String::as_str).collect(),
            seen: HashSet::new(),
            twins: HashSet::new(),
            last: None,
            tally: Tally::new(None).expect("no journal"),
        };
        for l in ["  A(1): OK", "  B(1): OK"] {
            walk.line(l);
        }
        assert_eq!(walk.tally.done, 3);
        assert_eq!(walk.tally.counts.not_run, ["P(f(x))"]);
    }

    #[test]
    fn fused_names_are_single_filter_entries() {
        // test-backend-ops splits `-o` at commas and takes an entry holding
        // `(` as one exact case name: neither may appear in an op entry.
        for n in FUSED_OPS {
            assert!(!n.contains(',') && !n.contains('('), "{n}");
        }
    }

    #[test]
    fn batches_fit_one_argument() {
        let cases: Vec<String> = (0..5).map(|i| format!("A(i={i})")).collect();
        assert_eq!(take_batch(&cases).len(), 5);
        let long: Vec<String> = (0..5).map(|_| "x".repeat(FILTER_BYTES / 2)).collect();
        assert_eq!(take_batch(&long).len(), 1);
    }
}
