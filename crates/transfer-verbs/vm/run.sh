#!/bin/bash
# Runs verbs test binaries on a real soft-RoCE (rdma_rxe) stack: boots Debian's
# generic kernel under qemu (KVM when usable, else TCG), loads ib_core,
# ib_uverbs and rdma_rxe, binds rxe0 to a dummy netdev with MTU 9000, runs a
# command inside and exits with that command's status.
#
# Usage:
#   vm/run.sh [--build] [--bin PATH]... [--] [COMMAND...]
#     --build     build transfer-verbs' test binaries here first
#                 (cargo test -p transfer-verbs --no-run --message-format=json)
#                 and copy them all in (/opt/bin/<test name>)
#     --build-test "CARGO TEST ARGS"
#                 also build these test binaries (e.g. "-p transfer-rpc
#                 --features engine --test engine_link") and copy them in
#     --bin PATH  copy PATH (and the shared libraries ldd lists) to /opt/bin
#     COMMAND     run inside the VM by /bin/sh, cwd /tmp, PATH=/opt/bin:...
#                 (default: every copied binary in turn, each must exit 0)
#   Example (what CI runs, see xtask/src/test.rs for the whole command):
#     crates/transfer-verbs/vm/run.sh --build \
#       --build-test "-p transfer-rpc --features engine --test engine_link" -- \
#       'conformance && verbs_device && TRANSFER_RPC_TEST_ENGINE=ibverbs engine_link'

#
# Environment:
#   RXE_VM_CACHE  where the kernel .deb and extracted modules are cached
#                 (default: ${XDG_CACHE_HOME:-$CARGO_TARGET_DIR or target}/rxe-vm-cache)
#   KVER          kernel version (default: what linux-image-amd64 depends on)
#   ACCEL         kvm|tcg|auto (default auto: kvm only if /dev/kvm is a real KVM)
#   MEM (MiB, default 2048)  SMP (default 2)  TIMEOUT (s, default 280)
#   VM_ENV        extra "K=V K=V" exported inside the VM (e.g. RUST_BACKTRACE=1)
#
# Host needs: qemu-system-x86 busybox-static libibverbs1 ibverbs-providers
#             iproute2 (ip, rdma) zstd|xz-utils, and apt-get (kernel download).
# Console of the last run: $RXE_VM_CACHE/last-console.log
# Exit status: the command's status inside the VM; 1 if the VM failed to
# report one (boot failure, timeout).
# pipefail: no pipeline below may stop reading early (head, grep -q, awk exit):
# the writer then dies of SIGPIPE and the whole script exits 141 — which is
# what CI hit once ldconfig -p outgrew the pipe buffer.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
CACHE=${RXE_VM_CACHE:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/transfer-rxe-vm}}
CACHE=${CACHE:-$TARGET/rxe-vm-cache}
MEM=${MEM:-2048}
SMP=${SMP:-2}
TIMEOUT=${TIMEOUT:-280}
ACCEL=${ACCEL:-auto}

t0=$(date +%s.%N)
log() { printf '[rxe-vm %6.1fs] %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

BINS=()
BUILD=0
EXTRA_TESTS=()
while [ $# -gt 0 ]; do
	case $1 in
	--build) BUILD=1; shift ;;
	--build-test) [ $# -ge 2 ] || die "--build-test needs cargo test arguments"; EXTRA_TESTS+=("$2"); shift 2 ;;
	--bin) [ $# -ge 2 ] || die "--bin needs a path"; BINS+=("$2"); shift 2 ;;
	--) shift; break ;;
	-h|--help) sed -n '2,30p' "$0"; exit 0 ;;
	*) break ;;
	esac
done
CMD="$*"

# ------------------------------------------------------------------ host tools
missing=()
for t in qemu-system-x86_64 busybox ip rdma ldd gzip bc python3 apt-get; do
	command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
LIBIBVERBS=$(ldconfig -p 2>/dev/null | awk '/libibverbs\.so\.1 .*x86-64/ && !f {print $NF; f=1}')
[ -n "$LIBIBVERBS" ] || missing+=("libibverbs1")
RXE_PROVIDER=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | sed -n 1p || true)
[ -n "$RXE_PROVIDER" ] && [ -f /etc/libibverbs.d/rxe.driver ] || missing+=("ibverbs-providers")
[ ${#missing[@]} -eq 0 ] || die "missing on the host: ${missing[*]} (apt-get install qemu-system-x86 busybox-static libibverbs1 ibverbs-providers iproute2 bc cpio)"
busybox --list | grep -x sh >/dev/null || die "busybox has no sh applet (install busybox-static)"

# ------------------------------------------------------------------ test binaries
# build_tests ARGS...: cargo test --no-run ARGS, every test executable it
# builds appended to BINS.
build_tests() {
	log "building test binaries: cargo test --no-run $*"
	JSON=$(mktemp)
	# Compiler diagnostics are printed (rendered) if the build fails.
	if ! (cd "$REPO" && cargo test "$@" --no-run --message-format=json-render-diagnostics >"$JSON"); then
		rm -f "$JSON"; die "cargo test $* --no-run failed"
	fi
	local before=${#BINS[@]}
	while read -r exe; do BINS+=("$exe"); done < <(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' "$JSON")
	rm -f "$JSON"
	[ ${#BINS[@]} -gt "$before" ] || die "cargo test $* built no test binary"
}
if [ $BUILD = 1 ]; then
	build_tests -p transfer-verbs
fi
for t in "${EXTRA_TESTS[@]}"; do
	# shellcheck disable=SC2086 # the arguments are meant to be split
	build_tests $t
done
[ ${#BINS[@]} -gt 0 ] || [ -n "$CMD" ] || die "nothing to run: give --build, --bin PATH or a command"

# ------------------------------------------------------------------ kernel (cached)
mkdir -p "$CACHE"
if [ -z "${KVER:-}" ]; then
	KVER=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\(.*\)$/\1/p' | sed -n 1p)
	[ -n "$KVER" ] || KVER=$(ls -d "$CACHE"/kernel-* 2>/dev/null | sed 's/.*kernel-//' | sort -V | tail -1)
	[ -n "$KVER" ] || die "cannot tell the kernel version (apt-get update, or set KVER)"
fi
case $KVER in *-cloud-*) die "the -cloud kernel flavour has no rdma_rxe; use the generic one";; esac
KDIR=$CACHE/kernel-$KVER
if [ ! -f "$KDIR/boot/vmlinuz-$KVER" ]; then
	log "downloading linux-image-$KVER (cached in $CACHE)"
	mkdir -p "$CACHE/debs"
	(cd "$CACHE/debs" && apt-get download "linux-image-$KVER" 2>&1 | { grep -v "unsandboxed" >&2 || true; }; [ -n "$(ls "$CACHE"/debs/linux-image-"$KVER"_*.deb 2>/dev/null)" ]) ||
		die "apt-get download linux-image-$KVER failed"
	rm -rf "$KDIR.tmp"
	dpkg-deb -x "$CACHE"/debs/linux-image-"$KVER"_*.deb "$KDIR.tmp"
	mv "$KDIR.tmp" "$KDIR"
fi
MODSRC=$KDIR/lib/modules/$KVER/kernel

# ------------------------------------------------------------------ initramfs
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rxe-vm.XXXXXX")
QPID=
cleanup() { [ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
R=$WORK/root
mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu/libibverbs,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,root,opt/bin,mods}
ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"
cp "$(command -v busybox)" "$R/usr/bin/busybox"
for a in $(busybox --list); do [ -e "$R/usr/bin/$a" ] || ln -s busybox "$R/usr/bin/$a"; done

copy_lib() { # copy a file to the same /usr-prefixed path inside the root
	local f; f=$(realpath -s "$1"); f=/usr${f#/usr}
	[ -e "$R$f" ] || { mkdir -p "$R$(dirname "$f")"; cp -L "$1" "$R$f"; }
}
copy_with_libs() { # $1 = file, $2 = destination inside the root
	mkdir -p "$R$(dirname "$2")"; rm -f "$R$2"; cp -L "$1" "$R$2"
	ldd "$1" 2>/dev/null | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' | while read -r lib; do
		[ -n "$lib" ] && [ -f "$lib" ] && copy_lib "$lib"
	done
	return 0
}
# busybox-static runs its own applets before $PATH, so these real tools are
# called by full path inside.
copy_with_libs "$(command -v ip)" /usr/sbin/ip.real
copy_with_libs "$(command -v rdma)" /usr/sbin/rdma.real
# libibverbs is dlopen()ed by the crate: copy it, the rxe provider and its driver file.
copy_with_libs "$LIBIBVERBS" "/usr/lib/x86_64-linux-gnu/$(basename "$LIBIBVERBS")"
copy_with_libs "$RXE_PROVIDER" "/usr/lib/x86_64-linux-gnu/libibverbs/$(basename "$RXE_PROVIDER")"
cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
command -v ibv_devinfo >/dev/null && copy_with_libs "$(command -v ibv_devinfo)" /opt/bin/ibv_devinfo
NAMES=()
for b in "${BINS[@]}"; do
	[ -x "$b" ] || die "not an executable: $b"
	n=$(basename "$b"); n=${n%-[0-9a-f]*[0-9a-f]}   # strip cargo's hash suffix
	copy_with_libs "$b" "/opt/bin/$n"; NAMES+=("$n")
done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"

# Modules in load order. crc32_generic provides the crc32 shash rdma_rxe asks
# the crypto API for (no modprobe to autoload it); dummy.ko creates dummy0.
: > "$R/mods/order"
for m in crypto/crc32_generic net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel \
	drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs \
	drivers/infiniband/sw/rxe/rdma_rxe drivers/net/dummy; do
	f=$(ls "$MODSRC/$m".ko* 2>/dev/null | sed -n 1p) || true
	[ -n "$f" ] || die "module $m not in linux-image-$KVER"
	b=$(basename "$m")
	case $f in
	*.xz) xz -dc "$f" > "$R/mods/$b.ko" ;;
	*.zst) zstd -qdc "$f" > "$R/mods/$b.ko" ;;
	*) cp "$f" "$R/mods/$b.ko" ;;
	esac
	echo "$b" >> "$R/mods/order"
done

if [ -n "$CMD" ]; then
	printf '%s\n' "$CMD" > "$R/cmd.sh"
else
	for n in "${NAMES[@]}"; do printf '%s || exit $?\n' "$n"; done > "$R/cmd.sh"
fi
for kv in ${VM_ENV:-}; do printf 'export %q\n' "$kv"; done > "$R/env.sh"

cat > "$R/init" <<'INIT'
#!/bin/sh
export PATH=/opt/bin:/usr/sbin:/usr/bin HOME=/root LD_LIBRARY_PATH=
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
ulimit -l unlimited
up() { cut -d' ' -f1 /proc/uptime; }
echo "VM: kernel $(uname -r) up at $(up)s"
for m in $(cat /mods/order); do insmod /mods/$m.ko || echo "insmod $m failed"; done
/usr/sbin/ip.real link set lo up
/usr/sbin/ip.real link show dummy0 >/dev/null 2>&1 || /usr/sbin/ip.real link add dummy0 type dummy
/usr/sbin/ip.real link set dummy0 mtu 9000
/usr/sbin/ip.real addr add 10.0.0.1/24 dev dummy0
/usr/sbin/ip.real link set dummy0 up
/usr/sbin/rdma.real link add rxe0 type rxe netdev dummy0 || echo "rdma link add failed"
[ -x /opt/bin/ibv_devinfo ] && ibv_devinfo -d rxe0 | grep -E 'hca_id|state|active_mtu|link_layer'
echo "rxe ready at $(up)s"
. /env.sh
cd /tmp
sh /cmd.sh
rc=$?
echo "command finished at $(up)s"
echo "RXE_VM_EXIT=$rc"
sync
poweroff -f
INIT
chmod +x "$R/init"
(cd "$R" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 > "$WORK/initramfs.gz")
log "initramfs $(du -h "$WORK/initramfs.gz" | cut -f1), kernel $KVER, binaries: ${NAMES[*]:-none}"

# ------------------------------------------------------------------ boot
FALLBACK=
if [ "$ACCEL" = auto ]; then
	# PVM "KVM" opens fine but hangs a stock kernel: use KVM only when it
	# looks real, and fall back to TCG if the guest stays silent.
	if grep -qwE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then
		ACCEL=kvm; FALLBACK=tcg
	else
		ACCEL=tcg
	fi
fi
LOG=$WORK/console.log
boot() { # $1 = kvm|tcg; sets qrc; returns 1 if KVM stayed silent
	local acc=$1 waited=0
	if [ "$acc" = kvm ]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max); fi
	log "booting (accel=$acc, ${MEM} MiB, $SMP CPUs, timeout ${TIMEOUT}s)"
	: >"$LOG"
	timeout "$TIMEOUT" qemu-system-x86_64 "${ACC[@]}" -smp "$SMP" -m "$MEM" -nographic -no-reboot \
		-nic none -kernel "$KDIR/boot/vmlinuz-$KVER" -initrd "$WORK/initramfs.gz" \
		-append "console=ttyS0 loglevel=3 panic=-1 quiet" </dev/null >"$LOG" 2>&1 &
	QPID=$!
	if [ -n "$FALLBACK" ] && [ "$acc" = kvm ]; then
		while kill -0 "$QPID" 2>/dev/null && ! grep -q 'VM: kernel' "$LOG"; do
			sleep 1; waited=$((waited + 1))
			if [ $waited -ge "${KVM_BOOT_TIMEOUT:-60}" ]; then
				log "KVM guest silent for ${waited}s: retrying with TCG"
				kill "$QPID" 2>/dev/null; wait "$QPID" 2>/dev/null || true; QPID=
				return 1
			fi
		done
	fi
	set +e; wait "$QPID"; qrc=$?; set -e
	QPID=
	return 0
}
tb=$(date +%s.%N)
boot "$ACCEL" || { tb=$(date +%s.%N); boot "$FALLBACK"; }
cp "$LOG" "$CACHE/last-console.log"
# The console from the first line of our init on (kernel noise before it is skipped).
tr -d '\r' < "$LOG" | sed -n '/VM: kernel/,$p' | grep -v '^RXE_VM_EXIT=' || true
log "VM wall time $(echo "$(date +%s.%N) - $tb" | bc | cut -c1-6)s (qemu exit $qrc)"
rc=$(tr -d '\r' < "$LOG" | sed -n 's/^RXE_VM_EXIT=\([0-9]*\)$/\1/p' | tail -1)
if [ -z "$rc" ]; then
	[ $qrc = 124 ] && log "timed out after ${TIMEOUT}s" || log "the VM reported no exit status"
	exit 1
fi
log "exit status inside the VM: $rc"
exit "$rc"
