//! System packages the tests and the bench need at run time.
//!
//! Nothing here is needed to *build*: native libraries are loaded at run
//! time. Installed with apt when running as root; otherwise the exact
//! command is printed and the step fails with it.

use std::path::Path;
use std::process::Command;

/// A Debian package and how to tell it is present.
pub struct Package {
    /// Debian/Ubuntu package name.
    pub name: &'static str,
    /// Files of which at least one exists when the package is installed
    /// (one `*` may stand for part of a directory name).
    pub probes: &'static [&'static str],
    /// Why the project needs it.
    pub why: &'static str,
}

/// Runtime packages of the tests and the bench.
pub const RUNTIME: [Package; 3] = [
    Package {
        name: "libfabric1",
        probes: &[
            "/usr/lib/x86_64-linux-gnu/libfabric.so.1",
            "/usr/lib/aarch64-linux-gnu/libfabric.so.1",
            "/opt/amazon/efa/lib/libfabric.so.1",
            "/opt/amazon/efa/lib64/libfabric.so.1",
        ],
        why: "the libfabric backend (tcp, shm providers on this machine)",
    },
    Package {
        name: "libfabric-bin",
        probes: &["/usr/bin/fi_pingpong", "/opt/amazon/efa/bin/fi_pingpong"],
        why: "fi_info and fi_pingpong, the raw provider baseline",
    },
    Package {
        name: "fonts-dejavu-core",
        probes: &["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"],
        why: "a font for the bench's plots",
    },
];

/// C headers the FFI layout tests compile against (the backends' `#[repr(C)]`
/// mirrors are checked field by field against what gcc makes of them).
pub const FFI_HEADERS: [Package; 2] = [
    Package {
        name: "libfabric-dev",
        probes: &["/usr/include/rdma/fabric.h"],
        why: "libfabric headers for transfer-efa's struct layout test",
    },
    Package {
        name: "libibverbs-dev",
        probes: &["/usr/include/infiniband/verbs.h"],
        why: "rdma-core verbs headers for transfer-verbs' struct layout test",
    },
];

/// Native build tools of transfer-rpc's ggml backend (vendored llama.cpp).
pub const GGML_BUILD: [Package; 2] = [
    Package {
        name: "cmake",
        probes: &["/usr/bin/cmake", "/usr/local/bin/cmake"],
        why: "builds the vendored llama.cpp / ggml for transfer-rpc's compute tests",
    },
    Package {
        name: "libclang-dev",
        probes: &[
            "/usr/lib/llvm-*/lib/libclang.so",
            "/usr/lib/x86_64-linux-gnu/libclang.so",
        ],
        why: "bindgen over llama.h (llama-cpp-sys-2)",
    },
];

/// What the soft-RoCE VM of transfer-verbs' suite needs on the host.
pub const VERBS_VM: [Package; 7] = [
    Package {
        name: "qemu-system-x86",
        probes: &["/usr/bin/qemu-system-x86_64"],
        why: "boots the soft-RoCE (rdma_rxe) test VM",
    },
    Package {
        name: "busybox-static",
        probes: &["/bin/busybox", "/usr/bin/busybox"],
        why: "the test VM's userland",
    },
    Package {
        name: "libibverbs1",
        probes: &["/usr/lib/x86_64-linux-gnu/libibverbs.so.1"],
        why: "verbs inside the test VM",
    },
    Package {
        name: "ibverbs-providers",
        probes: &[
            "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
            "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav25.so",
        ],
        why: "the rxe provider inside the test VM",
    },
    Package {
        name: "bc",
        probes: &["/usr/bin/bc"],
        why: "the VM harness's arithmetic",
    },
    Package {
        name: "zstd",
        probes: &["/usr/bin/zstd"],
        why: "unpacks the kernel package",
    },
    Package {
        name: "iproute2",
        probes: &["/usr/bin/ip", "/usr/sbin/ip", "/bin/ip"],
        why: "ip and rdma inside the test VM",
    },
];

/// Open MPI, the baseline of the workloads (`cargo xtask bench --mpi`, the
/// MPI smoke pass of `cargo xtask test`): mpirun and the mpicc wrapper.
pub const OPENMPI: [Package; 2] = [
    Package {
        name: "openmpi-bin",
        probes: &["/usr/bin/mpirun"],
        why: "mpirun, the launcher of the Open MPI workload baseline",
    },
    Package {
        name: "libopenmpi-dev",
        probes: &["/usr/bin/mpicc"],
        why: "mpicc and mpi.h, to build the Open MPI workload baseline",
    },
];

/// Whether `pattern` names an existing file; one `*` may stand for part of
/// a directory name (e.g. `/usr/lib/llvm-*/lib/libclang.so`).
fn probe_exists(pattern: &str) -> bool {
    let Some((head, tail)) = pattern.split_once('*') else {
        return Path::new(pattern).exists();
    };
    let (dir, prefix) = head.rsplit_once('/').unwrap_or(("", head));
    let (suffix, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let Ok(entries) = std::fs::read_dir(if dir.is_empty() { "/" } else { dir }) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with(prefix) && name.ends_with(suffix) && e.path().join(rest).exists()
    })
}

fn present(p: &Package) -> bool {
    p.probes.iter().any(|f| probe_exists(f))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions. Declared here to keep xtask std-only.
    unsafe { geteuid() == 0 }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// Makes sure every package of `pkgs` is installed.
pub fn ensure(pkgs: &[Package]) -> Result<(), String> {
    let missing: Vec<&Package> = pkgs.iter().filter(|p| !present(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
    for p in &missing {
        eprintln!("xtask: missing {} ({})", p.name, p.why);
    }
    let install = format!(
        "apt-get install -y --no-install-recommends {}",
        names.join(" ")
    );
    if !is_root() {
        return Err(format!(
            "system packages missing; install them with:\n    sudo apt-get update && sudo {install}"
        ));
    }
    if Path::new("/usr/bin/apt-get").exists() {
        let mut update = Command::new("apt-get");
        update
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive");
        // A failed update (offline mirror) may still leave a usable cache.
        let _ = crate::step::run("apt-get update", &mut update);
        let mut cmd = Command::new("apt-get");
        cmd.args(["install", "-y", "--no-install-recommends"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive");
        crate::step::run("install system packages", &mut cmd)?;
    } else {
        return Err(format!(
            "no apt-get on this machine; install the equivalent of: {}",
            names.join(" ")
        ));
    }
    match pkgs.iter().find(|p| !present(p)) {
        Some(p) => Err(format!("{} still missing after apt-get install", p.name)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::probe_exists;

    #[test]
    fn probes_with_and_without_a_wildcard() {
        assert!(probe_exists("/proc/self"));
        assert!(!probe_exists("/proc/definitely-not-here"));
        assert!(probe_exists("/pro*/self/status"));
        assert!(!probe_exists("/pro*/self/not-a-file"));
        assert!(!probe_exists("/nothing-*/x"));
    }
}
