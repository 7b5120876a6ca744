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

use crate::llama_tree;

/// The CI subset (`cargo xtask test`'s ggml step), two runs. First the
/// forms our validator refused before issue 22, selected by op (`-o`) and
/// params (`-p`): binary ops with a permuted operand (perm1), NORM of
/// non-packed rows, GLU of odd rows, SUM of a permuted source, SCALE of
/// BF16 (289 cases). Then a sample of what llama.cpp's models run, plus an
/// IM2COL_3D case of an empty result (120 cases). The full suite (20,766
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
        "RMS_NORM,SUM_ROWS,MEAN,SILU,GELU,DUP,REPEAT,\
IM2COL_3D(type_input=f32,type_kernel=f32,dst_type=f32,ne_input=[20,20,10,3],\
ne_kernel=[3,3,3,3],IC=3,s0=1,s1=1,s2=1,p0=0,p1=0,p2=0,d0=1,d1=1,d2=1,v=1)",
        None,
    ),
];

/// Longest one child run of the suite may take.
const CHILD_LIMIT: Duration = Duration::from_secs(3600);
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
    /// Refused by our server (the client aborted on that case): `(case,
    /// the server's reason)`.
    pub refused: Vec<(String, String)>,
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
            "{} ok, {} fail, {} refused (client aborted), {} not supported by ggml-cpu, \
             {} skipped, {} not run",
            self.ok,
            self.fail.len(),
            self.refused.len(),
            self.not_supported,
            self.skipped,
            self.not_run.len()
        )
    }
}

/// `cargo xtask backend-ops [--full] [-o OPS] [-p PARAMS] [--server PATH]`
/// (no `-o` / `--full`: the CI subset).
pub fn run_cli(args: &[String]) -> Result<(), String> {
    let mut ops: Option<String> = None;
    let mut full = false;
    let mut params: Option<String> = None;
    let mut server: Option<PathBuf> = None;
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
            other => return Err(format!("backend-ops: unknown option `{other}`")),
        }
    }
    let server = match server {
        Some(s) => s,
        None => crate::test::build_rpc_server()?,
    };
    if !full && ops.is_none() && params.is_none() {
        return run_ci(&server);
    }
    let start = Instant::now();
    let counts = run(&server, ops.as_deref(), params.as_deref())?;
    report(&counts, start.elapsed());
    verdict(&counts)
}

/// The CI step: the runs of `CI_RUNS` against `server`; any FAIL or
/// refusal fails the step, and so does a run that passed no case.
pub fn run_ci(server: &Path) -> Result<(), String> {
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
        let counts = run(server, Some(ops), *params)?;
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
    if !c.fail.is_empty() || !c.refused.is_empty() || !c.not_run.is_empty() {
        return Err(format!("test-backend-ops: {}", c.summary()));
    }
    if c.ok == 0 {
        return Err("test-backend-ops passed no case: the RPC device was not tested".into());
    }
    Ok(())
}

/// Builds what the suite needs and runs the cases selected by `ops` (`-o`)
/// and `params` (`-p`) against a fresh `server` on a free loopback port.
pub fn run(server: &Path, ops: Option<&str>, params: Option<&str>) -> Result<Counts, String> {
    let bin = llama_tree::ensure_built(&["test-backend-ops", "ggml-cpu", "ggml-rpc"])?;
    let shim = build_shim()?;
    let server = Server::start(server)?;
    let suite = Suite {
        program: bin.join("test-backend-ops"),
        shim,
        endpoint: format!("127.0.0.1:{}", server.port),
        log: server.log.clone(),
    };

    // The case order, from a listing that computes nothing. `support` mode
    // leaves out the fused cases (several nodes checked as one graph), so
    // those are not in it.
    let listing_start = Instant::now();
    let listing = suite.run(&["support"], ops, params)?;
    if !listing.status_ok {
        return Err(format!(
            "test-backend-ops support listing failed ({}): {}",
            listing.status,
            tail(&listing.stderr)
        ));
    }
    let cases: Vec<String> = listing
        .stdout
        .lines()
        .filter_map(|l| case_line(l).map(|(case, _)| case.to_string()))
        .collect();
    if cases.is_empty() {
        return Err(format!(
            "test-backend-ops listed no case for the RPC device (is the shim loaded?): {}",
            tail(&listing.stderr)
        ));
    }
    let listed: HashSet<&str> = cases.iter().map(String::as_str).collect();
    eprintln!(
        "==> test-backend-ops: {} cases listed (and the fused ones) in {:.1} s",
        cases.len(),
        listing_start.elapsed().as_secs_f64()
    );

    let mut counts = Counts::default();
    // Every case reported so far (a fused case may be run twice).
    let mut seen: HashSet<String> = HashSet::new();
    // Listed cases done (reported or refused), in order.
    let mut done = 0usize;
    let mut first = true;
    let mut aborted = false;
    let mut batches = 0usize;
    while first || done < cases.len() {
        let batch_start = Instant::now();
        batches += 1;
        // The first run takes the filters as given (fused cases included);
        // after an abort the rest of the listing is named case by case.
        let batch: Vec<String> = if first {
            Vec::new()
        } else {
            take_batch(&cases[done..])
        };
        let out = if first {
            suite.run(&["test"], ops, params)?
        } else {
            let filter = batch.join(",");
            suite.run(&["test"], Some(&filter), None)?
        };
        let mark = out.log_mark;
        let done_before = done;
        first = false;
        let mut last = None;
        for (case, result) in reported(&out.stdout, &mut counts) {
            if listed.contains(case.as_str()) {
                // Cases named in a batch that `-o` cannot select (its
                // parser splits entries at the first `)`) are passed over.
                // A name listed twice selects both cases: one already done
                // (in an earlier batch) is reported again, and not counted
                // again below.
                if let Some(skip) = cases[done..].iter().position(|c| *c == case) {
                    counts
                        .not_run
                        .extend(cases[done..done + skip].iter().cloned());
                    done += skip + 1;
                }
            }
            if seen.insert(case.clone()) {
                classify(&mut counts, &case, &result);
            }
            last = Some(case);
        }
        // This batch's own cases and time (one child process).
        eprintln!(
            "  batch {batches}: {} listed cases in {:.1} s ({} of {} done)",
            done - done_before,
            batch_start.elapsed().as_secs_f64(),
            done,
            cases.len()
        );
        if !out.signalled {
            // It ran to its end (a FAIL makes the exit status 1): every case
            // it was given must have been reported.
            if done == done_before {
                return Err(format!(
                    "test-backend-ops exited ({}) without reporting a case after {done} of {} \
                     listed cases: {}",
                    out.status,
                    cases.len(),
                    tail(&out.stderr)
                ));
            }
            continue;
        }
        aborted = true;
        let reason = refusal_reason(&out.log, mark)
            .unwrap_or_else(|| format!("client exited with {}: {}", out.status, tail(&out.stderr)));
        if done == cases.len() {
            // Every listed case reported, then the client died: in the
            // FLASH_ATTN_EXT slice sweep or a fused case at the end.
            let after = last.unwrap_or_default();
            counts.refused.push((
                format!("(a fused case or the fa_vec sweep after {after})"),
                reason,
            ));
            break;
        }
        let next = cases[done].clone();
        if !batch.is_empty() {
            // Cases named one by one: the listed case after the last one
            // reported was in flight.
            eprintln!("  refused: {next}: {reason}");
            counts.refused.push((next, reason));
            done += 1;
            continue;
        }
        // The first run (fused cases included): the listed case after the
        // last one reported was in flight, or a fused case before it: run
        // that listed case alone to tell.
        let alone = suite.run(&["test"], Some(&next), None)?;
        let mut alone_reported = false;
        for (case, result) in reported(&alone.stdout, &mut counts) {
            if case == next {
                alone_reported = true;
                if seen.insert(case.clone()) {
                    classify(&mut counts, &case, &result);
                }
            }
        }
        if !alone_reported && !alone.signalled {
            counts.not_run.push(next);
        } else if alone_reported {
            let after = last.unwrap_or_default();
            counts
                .refused
                .push((format!("(a fused case between {after} and {next})"), reason));
        } else {
            let why = refusal_reason(&alone.log, alone.log_mark).unwrap_or(reason);
            eprintln!("  refused: {next}: {why}");
            counts.refused.push((next, why));
        }
        done += 1;
    }

    // After an abort the listing was run case by case, without the fused
    // cases: run those now, selected by op names the listing does not hold
    // (a fused case named like a listed op is not reached this way: only a
    // full run without abort reaches it).
    if aborted && ops.is_none() {
        let mut names: Vec<&str> = cases
            .iter()
            .filter_map(|c| c.split_once('(').map(|(op, _)| op))
            .collect();
        names.sort_unstable();
        names.dedup();
        let filter = format!("^(?!(?:{})$)", names.join("|"));
        let out = suite.run(&["test"], Some(&filter), params)?;
        let mut last = None;
        for (case, result) in reported(&out.stdout, &mut counts) {
            if seen.insert(case.clone()) {
                classify(&mut counts, &case, &result);
            }
            last = Some(case);
        }
        if out.signalled {
            let reason = refusal_reason(&out.log, out.log_mark).unwrap_or_else(|| {
                format!("client exited with {}: {}", out.status, tail(&out.stderr))
            });
            let after = last.unwrap_or_default();
            counts.refused.push((
                format!("(a fused case after {after}; the fused cases after it were not run)"),
                reason,
            ));
        }
    }
    drop(server);
    Ok(counts)
}

/// The case lines of a run's output (FLASH_ATTN_EXT slice sweep failures
/// are counted as they go).
fn reported(stdout: &str, counts: &mut Counts) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in stdout.lines() {
        if let Some((case, result)) = case_line(line) {
            out.push((case.to_string(), result.to_string()));
        } else if let Some(slice) = line.strip_prefix("  FAIL fa_vec slice: ") {
            // The FLASH_ATTN_EXT vector-kernel sweep the suite runs after
            // the cases when FLASH_ATTN_EXT is selected.
            counts.fail.push(format!("fa_vec slice {slice}"));
        }
    }
    out
}

/// test-backend-ops with the shim, against one server.
struct Suite {
    program: PathBuf,
    shim: PathBuf,
    endpoint: String,
    log: PathBuf,
}

impl Suite {
    /// Runs `mode` on the RPC device with the filters given.
    fn run(
        &self,
        mode: &[&str],
        ops: Option<&str>,
        params: Option<&str>,
    ) -> Result<ChildOutput, String> {
        let mut cmd = Command::new(&self.program);
        cmd.args(mode).args(["-b", "RPC0"]);
        add_filters(&mut cmd, ops, params);
        cmd.env("GGML_BACKEND_PATH", &self.shim)
            .env("TRANSFER_RPC_ENDPOINT", &self.endpoint)
            // No gdb backtrace on an abort (a refused case).
            .env("GGML_NO_BACKTRACE", "1");
        let log_mark = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let mut out = run_child(&mut cmd)?;
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

fn classify(counts: &mut Counts, case: &str, result: &str) {
    // Colour codes around OK / FAIL.
    let plain: String = strip_ansi(result);
    if plain.ends_with("OK") {
        counts.ok += 1;
    } else if plain.ends_with("FAIL") {
        counts.fail.push(format!("{case}: {plain}"));
    } else if plain.starts_with("not supported") {
        counts.not_supported += 1;
    } else if plain.starts_with("skipping") {
        counts.skipped += 1;
    } else if plain == "yes" || plain == "no" {
        // support mode (not expected here)
    } else {
        counts
            .fail
            .push(format!("{case}: unrecognised result `{plain}`"));
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
    /// Killed by a signal (the stock client's abort on a refusal).
    signalled: bool,
    stdout: String,
    stderr: String,
}

/// Runs a child to completion (killed past `CHILD_LIMIT`), collecting its
/// output; stderr is read on a thread so that neither pipe fills.
fn run_child(cmd: &mut Command) -> Result<ChildOutput, String> {
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
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            lines.push(l);
        }
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{:?} ran past {} s and was killed",
                    cmd.get_program(),
                    CHILD_LIMIT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    let _ = out_thread.join();
    lines.extend(rx.try_iter());
    let stderr = err_thread.join().unwrap_or_default();
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

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
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
        classify(&mut c, "X()", "\u{1b}[1;31mFAIL\u{1b}[0m");
        classify(&mut c, "X()", "[X] MAA = 1 > 0 \u{1b}[1;32mOK\u{1b}[0m");
        classify(&mut c, "X()", "not supported [CPU]");
        assert_eq!((c.ok, c.fail.len(), c.not_supported), (1, 1, 1));
    }

    #[test]
    fn batches_fit_one_argument() {
        let cases: Vec<String> = (0..5).map(|i| format!("A(i={i})")).collect();
        assert_eq!(take_batch(&cases).len(), 5);
        let long: Vec<String> = (0..5).map(|_| "x".repeat(FILTER_BYTES / 2)).collect();
        assert_eq!(take_batch(&long).len(), 1);
    }
}
