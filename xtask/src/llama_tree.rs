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
pub const CMAKE_OPTIONS: [&str; 12] = [
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
];

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
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_pip = Command::new(&python)
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        deps::ensure(&PIP)?;
    }
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
    let want = format!("{}\n{}\n", src.display(), CMAKE_OPTIONS.join("\n"));
    let cache = build.join("CMakeCache.txt");
    if cache.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(());
    }
    let _ = std::fs::remove_file(&stamp);
    let mut cmd = Command::new("cmake");
    cmd.arg("-S")
        .arg(src)
        .arg("-B")
        .arg(build)
        .args(CMAKE_OPTIONS);
    step::run(&format!("configure llama.cpp {VERSION} (cmake)"), &mut cmd)?;
    std::fs::write(&stamp, want).map_err(|e| format!("writing {}: {e}", stamp.display()))
}
