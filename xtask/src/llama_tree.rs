//! An unmodified llama.cpp tree, built with cmake, for the steps that run
//! llama.cpp's own programs against our server (test-backend-ops, the
//! ggml backend plugin's tests).
//!
//! The tree is the one PyPI's `llama-cpp-python` 0.3.36 source archive
//! vendors (`vendor/llama.cpp`): a fixed, hash-pinned release that needs no
//! git. Everything lives under `<target>/llama-cpp-0.3.36/` and is kept
//! between runs: the archive (76.6 MB; `pip download` took 41 s here,
//! most of it pip preparing the archive's metadata), the extracted tree,
//! and one cmake build directory that later calls build incrementally.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{deps, step};

/// The llama-cpp-python release whose source archive vendors the tree.
pub const VERSION: &str = "0.3.36";

/// sha256 of `llama_cpp_python-0.3.36.tar.gz` as PyPI serves it.
const ARCHIVE_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";

/// The archive's file name and its top-level folder.
const ARCHIVE: &str = "llama_cpp_python-0.3.36.tar.gz";
const ARCHIVE_ROOT: &str = "llama_cpp_python-0.3.36";

/// cmake options of the build: what llama.cpp's Linux release archives use
/// (backends as loadable libraries, the RPC backend built), a portable
/// AVX2 CPU backend instead of one variant per CPU generation (a sixth of
/// the compile time), tests on (test-backend-ops), no network libraries.
/// The optional parts no step runs (examples, the unified `llama` app, the
/// standalone mtmd library) are off: that only saves configure time, as
/// every build names its targets. The server's web UI is not fetched:
/// with `LLAMA_USE_PREBUILT_UI` on (upstream's default) building
/// llama-server downloads assets from huggingface.co, and this machine (like
/// CI) may reach package registries only; the tests use its HTTP API, not
/// the UI. [`OPT_LEVELS`] sets the optimisation.
pub const CMAKE_OPTIONS: [&str; 16] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_RPC=ON",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_CPU_ALL_VARIANTS=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_MTMD=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
];

/// A CMake file run after every `project()` of the tree
/// (`CMAKE_PROJECT_INCLUDE`): ggml, the code every test computes with
/// (ggml-cpu, ggml-rpc, ggml-base), keeps upstream's Release `-O3`;
/// llama.cpp's own code (libllama, common, the server, test-backend-ops'
/// driver) is built `-O1`. The variables are directory-scoped, so ggml's
/// `project("ggml")` sets them back for ggml's directories only.
/// Measured (one TU each, `c++` as compile_commands.json gives it, CPU
/// seconds -O3 / -O1): common/chat.cpp 17.9 / 13.6, server-context.cpp
/// 30.7 / 20.6; over the whole tree see the commit message.
pub const OPT_LEVELS: &str = "\
# Written by xtask (llama_tree.rs): ggml at -O3, the rest of llama.cpp at -O1.
if(PROJECT_NAME STREQUAL \"ggml\")
  set(CMAKE_C_FLAGS_RELEASE \"-O3 -DNDEBUG\")
  set(CMAKE_CXX_FLAGS_RELEASE \"-O3 -DNDEBUG\")
else()
  set(CMAKE_C_FLAGS_RELEASE \"-O1 -DNDEBUG\")
  set(CMAKE_CXX_FLAGS_RELEASE \"-O1 -DNDEBUG\")
endif()
";

/// What building the tree needs from the system besides pip.
const BUILD_TOOLS: [deps::Package; 2] = [
    deps::Package {
        name: "cmake",
        probes: &["/usr/bin/cmake", "/usr/local/bin/cmake"],
        why: "configures and builds the llama.cpp tree of llama-cpp-python 0.3.36",
    },
    deps::Package {
        name: "g++",
        probes: &["/usr/bin/g++", "/usr/bin/c++", "/usr/local/bin/g++"],
        why: "compiles the llama.cpp tree of llama-cpp-python 0.3.36",
    },
];

/// pip, asked only when the archive is not there yet.
const PIP: [deps::Package; 1] = [deps::Package {
    name: "python3-pip",
    probes: &[
        "/usr/lib/python3/dist-packages/pip/__init__.py",
        "/usr/local/lib/python3*/site-packages/pip/__init__.py",
    ],
    why: "downloads llama-cpp-python 0.3.36's source archive from PyPI",
}];

/// `<target>/llama-cpp-0.3.36`: everything this module makes.
pub fn root() -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            here.parent().unwrap_or(here).join("target")
        }
    };
    target.join(format!("llama-cpp-{VERSION}"))
}

/// Every cmake target a `cargo xtask test` step uses: test-backend-ops
/// (backend_ops.rs), the programs of the plugin's tests (plugin.rs).
pub const CI_TARGETS: [&str; 6] = [
    "test-backend-ops",
    "llama-completion",
    "llama-server",
    "ggml-rpc-server",
    "ggml-rpc",
    "ggml-cpu",
];

/// Installs (in this thread: apt is not to be run twice at once) what
/// [`start_background_build`] needs from the system.
pub fn prepare_tools() -> Result<(), String> {
    deps::ensure(&BUILD_TOOLS)?;
    python_with_pip().map(drop)
}

/// `$PYTHON` (default python3), with pip installed when missing: the
/// archive is fetched with `pip download`.
fn python_with_pip() -> Result<String, String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_pip = Command::new(&python)
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        deps::ensure(&PIP)?;
    }
    Ok(python)
}

/// The llama.cpp tree (download, extraction, configure, then
/// [`CI_TARGETS`]) built in a thread at the lowest CPU priority while the
/// cargo steps run: `nice -n 19` takes only the CPU time those leave idle
/// (test processes waiting on sockets, timeouts and child processes,
/// single-threaded link and download phases), so the cargo steps are not
/// slowed down and the later steps find the tree built or mostly built.
/// The build's output goes to `<root>/background-build.log`, shown when it
/// fails. [`Background::join`] waits for it.
pub struct Background {
    handle: Option<std::thread::JoinHandle<Result<PathBuf, String>>>,
    start: std::time::Instant,
    /// The build's process group (0 until started): stopped when the run
    /// ends early (a failed step) instead of left compiling.
    pgid: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.handle.is_none() {
            return;
        }
        let pgid = self.pgid.load(std::sync::atomic::Ordering::SeqCst);
        if pgid != 0 {
            eprintln!("==> stopping the background llama.cpp build (process group {pgid})");
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{pgid}")])
                .status();
        }
    }
}

pub fn start_background_build() -> Background {
    eprintln!(
        "==> build llama.cpp {VERSION} in the background (nice 19; log in {})",
        root().join("background-build.log").display()
    );
    let pgid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let for_thread = pgid.clone();
    Background {
        handle: Some(std::thread::spawn(move || background_build(&for_thread))),
        start: std::time::Instant::now(),
        pgid,
    }
}

impl Background {
    /// Waits for the background build; the same result a foreground
    /// [`ensure_built`] of [`CI_TARGETS`] would give.
    pub fn join(mut self) -> Result<PathBuf, String> {
        let waited = std::time::Instant::now();
        let handle = self
            .handle
            .take()
            .ok_or("the background llama.cpp build was already joined")?;
        let result = handle
            .join()
            .map_err(|_| "the background llama.cpp build thread panicked".to_string())?;
        crate::step::record(
            &format!("wait for the background llama.cpp {VERSION} build"),
            waited.elapsed().as_secs_f64(),
            result.is_ok(),
        );
        eprintln!(
            "==> build llama.cpp {VERSION} in the background: {} ({:.1} s since it started, \
             {:.1} s waited for here)",
            if result.is_ok() { "ok" } else { "failed" },
            self.start.elapsed().as_secs_f64(),
            waited.elapsed().as_secs_f64()
        );
        result
    }
}

fn background_build(pgid: &std::sync::atomic::AtomicU32) -> Result<PathBuf, String> {
    let root = root();
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let src = ensure_source(&root)?;
    let build = root.join("build");
    configure(&src, &build)?;
    let log_path = root.join("background-build.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    let nice = Path::new("/usr/bin/nice").is_file() || Path::new("/bin/nice").is_file();
    let mut cmd = if nice {
        let mut c = Command::new("nice");
        c.args(["-n", "19", "cmake"]);
        c
    } else {
        Command::new("cmake")
    };
    cmd.arg("--build")
        .arg(&build)
        .args(["--config", "Release", "-j", &jobs.to_string(), "--target"])
        .args(CI_TARGETS)
        .stdout(log)
        .stderr(log2);
    // Its own process group, so that Drop can stop make and the compilers
    // with it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start `cmake --build` for llama.cpp: {e}"))?;
    pgid.store(child.id(), std::sync::atomic::Ordering::SeqCst);
    let status = child
        .wait()
        .map_err(|e| format!("waiting for `cmake --build` of llama.cpp: {e}"))?;
    pgid.store(0, std::sync::atomic::Ordering::SeqCst);
    if !status.success() {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "building llama.cpp {VERSION} ({}) failed ({status}); the end of {}:\n{}",
            CI_TARGETS.join(", "),
            log_path.display(),
            tail.join("\n")
        ));
    }
    Ok(build.join("bin"))
}

/// Makes sure `targets` (cmake target names, e.g. `test-backend-ops`,
/// `ggml-rpc`) are built and up to date, downloading, checking, extracting
/// and configuring the tree first where that has not been done yet.
/// Returns the folder of the built programs and libraries (`build/bin`).
pub fn ensure_built(targets: &[&str]) -> Result<PathBuf, String> {
    let root = root();
    std::fs::create_dir_all(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let src = ensure_source(&root)?;
    deps::ensure(&BUILD_TOOLS)?;
    let build = root.join("build");
    configure(&src, &build)?;
    if !targets.is_empty() {
        let jobs = std::thread::available_parallelism().map_or(2, usize::from);
        let mut cmd = Command::new("cmake");
        cmd.arg("--build")
            .arg(&build)
            .args(["--config", "Release", "-j", &jobs.to_string(), "--target"])
            .args(targets);
        step::run(
            &format!(
                "build llama.cpp {VERSION} ({}; the first build compiles libllama and ggml, \
                 tens of minutes on 2 cores)",
                targets.join(", ")
            ),
            &mut cmd,
        )?;
    }
    Ok(build.join("bin"))
}

/// The extracted `vendor/llama.cpp`, downloading and checking the archive
/// first when needed.
fn ensure_source(root: &Path) -> Result<PathBuf, String> {
    let src = root.join("src");
    let tree = src.join(ARCHIVE_ROOT).join("vendor/llama.cpp");
    if tree.join("CMakeLists.txt").is_file() {
        return Ok(tree);
    }
    let archive = ensure_archive(root)?;
    // Extracted beside and renamed into place: an interrupted extraction
    // leaves no half tree that the check above would take for a whole one.
    let partial = root.join("src.partial");
    let _ = std::fs::remove_dir_all(&partial);
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&partial)
        .map_err(|e| format!("creating {}: {e}", partial.display()))?;
    step::run(
        "extract llama.cpp from the archive",
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&partial)
            .arg(format!("{ARCHIVE_ROOT}/vendor/llama.cpp")),
    )?;
    std::fs::rename(&partial, &src)
        .map_err(|e| format!("renaming {} to {}: {e}", partial.display(), src.display()))?;
    if !tree.join("CMakeLists.txt").is_file() {
        return Err(format!(
            "{ARCHIVE} has no vendor/llama.cpp/CMakeLists.txt (looked in {})",
            tree.display()
        ));
    }
    Ok(tree)
}

/// The source archive, checked against its pinned sha256 (downloaded with
/// pip when absent or not matching).
fn ensure_archive(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("download");
    let archive = dir.join(ARCHIVE);
    if archive.is_file() && sha256(&archive)? == ARCHIVE_SHA256 {
        return Ok(archive);
    }
    let _ = std::fs::remove_file(&archive);
    let python = python_with_pip()?;
    // `--no-binary :all:`: the source archive, never a wheel; `--no-deps`:
    // only this one file.
    step::run(
        &format!("download llama-cpp-python {VERSION}'s source archive from PyPI (76.6 MB)"),
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--progress-bar",
                "off",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
            ])
            .arg(&dir)
            .arg(format!("llama-cpp-python=={VERSION}")),
    )?;
    if !archive.is_file() {
        return Err(format!(
            "pip download left no {ARCHIVE} in {}",
            dir.display()
        ));
    }
    let got = sha256(&archive)?;
    if got != ARCHIVE_SHA256 {
        let _ = std::fs::remove_file(&archive);
        return Err(format!(
            "{ARCHIVE} from PyPI has sha256 {got}, expected {ARCHIVE_SHA256}: refusing to build it"
        ));
    }
    Ok(archive)
}

/// sha256 of a file, as hex (coreutils' sha256sum: xtask stays std-only).
fn sha256(file: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .map_err(|e| format!("sha256sum {}: could not start: {e}", file.display()))?;
    if !out.status.success() {
        return Err(format!(
            "sha256sum {} failed ({}): {}",
            file.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| format!("sha256sum {} printed nothing", file.display()))
}

/// Configures `build` from `src` unless it already was with these options
/// (a stamp file holds them). cmake re-runs itself on later builds when
/// the tree's CMakeLists change; the stamp only covers our options.
fn configure(src: &Path, build: &Path) -> Result<(), String> {
    let stamp = build.join("xtask-cmake-options");
    let include = build.join("xtask-opt-levels.cmake");
    let want = format!(
        "{}\n{}\n{OPT_LEVELS}",
        src.display(),
        CMAKE_OPTIONS.join("\n")
    );
    let cache = build.join("CMakeCache.txt");
    if cache.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(());
    }
    let _ = std::fs::remove_file(&stamp);
    std::fs::create_dir_all(build).map_err(|e| format!("creating {}: {e}", build.display()))?;
    std::fs::write(&include, OPT_LEVELS)
        .map_err(|e| format!("writing {}: {e}", include.display()))?;
    let mut cmd = Command::new("cmake");
    cmd.arg("-S")
        .arg(src)
        .arg("-B")
        .arg(build)
        .args(CMAKE_OPTIONS)
        .arg(format!("-DCMAKE_PROJECT_INCLUDE={}", include.display()));
    step::run(&format!("configure llama.cpp {VERSION} (cmake)"), &mut cmd)?;
    std::fs::write(&stamp, want).map_err(|e| format!("writing {}: {e}", stamp.display()))
}
