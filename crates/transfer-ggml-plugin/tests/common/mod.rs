//! Shared pieces of the plugin's integration tests: the built plugin, a C
//! compiler, our servers as processes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Environment variable: a llama.cpp build directory whose `bin/` holds the
/// shared ggml libraries and programs (GGML_BACKEND_DL=ON, GGML_RPC=ON).
pub const ENV_LLAMA_BUILD: &str = "TRANSFER_LLAMA_BUILD";
/// Environment variable: the llama.cpp source tree of that build (headers).
pub const ENV_LLAMA_SRC: &str = "TRANSFER_LLAMA_SRC";
/// Environment variable: llama-cpp-sys-2's cmake output (`out/` with
/// `lib/libggml*.a`), the second host (ggml 0.26, backend API 3).
pub const ENV_SYS_OUT: &str = "TRANSFER_LLAMA_SYS_OUT";
/// Environment variable: llama-cpp-sys-2's vendored llama.cpp tree (headers).
pub const ENV_SYS_SRC: &str = "TRANSFER_LLAMA_SYS_SRC";
/// Environment variable: a `transfer-rpc-server` built with ggml compute.
pub const ENV_SERVER_BIN: &str = "TRANSFER_RPC_SERVER_BIN";
/// Environment variable: a `transfer-rpc-pipeline` (writes the test model).
pub const ENV_PIPELINE_BIN: &str = "TRANSFER_RPC_PIPELINE_BIN";

/// The value of `var`; the ignored tests run only from `cargo xtask test`,
/// which sets them, so a missing one is a failure, not a skip.
pub fn env_path(var: &str) -> PathBuf {
    PathBuf::from(
        std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} is not set: run this test through `cargo xtask test`")
        }),
    )
}

/// The plugin this test binary was built with (`target/<profile>/deps`).
pub fn plugin_so() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libtransfer_ggml_plugin.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libtransfer_ggml_plugin.so not found next to {}",
        exe.display()
    );
}

/// A scratch directory under the target directory, emptied first (one per
/// test name: a rerun reuses and clears it).
pub fn scratch(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().join(format!("plugin-test-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles one of `tests/hosts/*.c` with `cc` and `args`.
pub fn compile(source: &str, out: &Path, args: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/hosts")
        .join(source);
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-O1")
        .arg("-o")
        .arg(out)
        .arg(&src)
        .args(args)
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "compiling {}", src.display());
}

/// The logs of the servers started so far (those still running).
static LOGS: Mutex<Vec<std::sync::Weak<Mutex<Vec<String>>>>> = Mutex::new(Vec::new());

/// Forgets every running server's log lines so far (a run that is repeated
/// counts only its last attempt). The ignored cases run one at a time
/// (`--test-threads 1`, as `cargo xtask test` runs them).
pub fn clear_server_logs() {
    quiet_logs();
    for l in LOGS
        .lock()
        .unwrap()
        .iter()
        .filter_map(std::sync::Weak::upgrade)
    {
        l.lock().unwrap().clear();
    }
}

/// A `transfer-rpc-server` process on an ephemeral loopback port, killed on
/// drop; its log lines are kept (with `-v`: one line per command).
pub struct Server {
    pub child: Child,
    pub endpoint: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(bin: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(bin)
            .args(["--port", "0", "--peer-allow", "loopback"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting transfer-rpc-server");
        let stderr = child.stderr.take().unwrap();
        let mut lines = std::io::BufReader::new(stderr).lines();
        let mut endpoint = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                endpoint = rest.split(',').next().map(str::to_owned);
                break;
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        LOGS.lock().unwrap().push(Arc::downgrade(&log));
        let keep = log.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                keep.lock().unwrap().push(l);
            }
        });
        Server {
            child,
            endpoint: endpoint.expect("the server did not start"),
            log,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until no running server has logged a line for 300 ms (deadline
/// 10 s): a server's last lines reach its reader thread after the client
/// that caused them exited.
pub fn quiet_logs() {
    let lines = || -> usize {
        LOGS.lock()
            .unwrap()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|l| l.lock().unwrap().len())
            .sum()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut last = lines();
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = lines();
        if now == last {
            return;
        }
        last = now;
    }
}
