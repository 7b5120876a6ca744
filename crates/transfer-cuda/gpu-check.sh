#!/usr/bin/env bash
# GPU checks for transfer-cuda.
#
#   crates/transfer-cuda/gpu-check.sh          # here (no GPU, no CUDA toolkit needed):
#                                              # build the GPU test binary and the
#                                              # kv_cache example into crates/transfer-cuda/gpu-bin/
#   crates/transfer-cuda/gpu-check.sh run      # on the GPU machine: run both, unchanged
#   crates/transfer-cuda/gpu-check.sh fake     # here: dry-run both against a fake libcuda
#                                              # (tests/fake-libcuda; needs cc; no real GPU behaviour)
#
# The binaries link no CUDA library: they dlopen libcuda.so.1 (and
# libgdrapi.so.2 when /dev/gdrdrv exists) at run time, so an x86-64 build
# from this machine runs as is on any x86-64 Linux GPU machine with the
# NVIDIA driver. Each GPU test prints "skipped (cuda): <reason>" where there is
# no GPU (a failure under `run`, which sets TRANSFER_REQUIRE=cuda); with one,
# it prints latencies (median/p99) and checks correctness.
#
# With the device tool, after building here, the one command is:
#   run(command="crates/transfer-cuda/gpu-check.sh run", carry=["crates/transfer-cuda/gpu-bin"])
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$here/gpu-bin"

build() {
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-cuda}"
    cd "$root"
    local tests example
    tests="$(cargo test -p transfer-cuda --release --no-run --test gpu --message-format=json \
        | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | tail -n1)"
    example="$(cargo build -p transfer-cuda --release --example kv_cache --message-format=json \
        | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | tail -n1)"
    if [[ -z "$tests" || -z "$example" ]]; then
        echo "gpu-check: could not find the built binaries" >&2
        exit 1
    fi
    mkdir -p "$bin"
    cp "$tests" "$bin/transfer-cuda-gpu"
    cp "$example" "$bin/kv_cache"
    if command -v strip >/dev/null; then
        strip --strip-debug "$bin/transfer-cuda-gpu" "$bin/kv_cache"
    fi
    if command -v ldd >/dev/null && ldd "$bin/transfer-cuda-gpu" | grep libcuda >/dev/null; then
        echo "gpu-check: the test binary links libcuda; it must only dlopen it" >&2
        exit 1
    fi
    ls -l "$bin"
    echo
    echo "Built. On a GPU machine (with this work tree and $bin), run:"
    echo "  crates/transfer-cuda/gpu-check.sh run"
}

run() {
    if [[ ! -x "$bin/transfer-cuda-gpu" || ! -x "$bin/kv_cache" ]]; then
        echo "gpu-check: $bin is missing; run crates/transfer-cuda/gpu-check.sh (build) first" >&2
        exit 1
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi -L || true
    local rc=0
    echo "== GPU tests"
    # A GPU machine must have one: no GPU fails instead of printing "skipped".
    TRANSFER_REQUIRE="${TRANSFER_REQUIRE:-cuda}" "$bin/transfer-cuda-gpu" --test-threads=1 --nocapture || rc=1
    echo "== kv_cache example"
    "$bin/kv_cache" || rc=1
    exit "$rc"
}

fake() {
    local dir
    dir="$(mktemp -d)"
    cc -shared -fPIC -O1 -Wall -Werror -o "$dir/libcuda.so.1" "$here/tests/fake-libcuda/fake_cuda.c" -lpthread
    cc -shared -fPIC -O1 -Wall -Werror -o "$dir/libgdrapi.so.2" "$here/tests/fake-libcuda/fake_gdrapi.c"
    : > "$dir/gdrdrv"
    echo "== dry run against the fake libcuda in $dir (not a GPU)"
    LD_LIBRARY_PATH="$dir" TRANSFER_CUDA_GDRDRV="$dir/gdrdrv" TRANSFER_CUDA_LATENCY_EVENTS="${TRANSFER_CUDA_LATENCY_EVENTS:-200}" run
}

case "${1:-build}" in
    build) build ;;
    run) run ;;
    fake) fake ;;
    *) echo "usage: $0 [build|run|fake]" >&2; exit 2 ;;
esac
