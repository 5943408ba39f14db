#!/bin/bash
# Runs a host-built program against a real kernel RDMA stack: boots Debian's own kernel under QEMU (KVM when the
# CPU allows it, else TCG), creates a Soft-RoCE device (rdma_rxe on the virtio NIC, GID index 1 = ::ffff:10.0.2.15,
# RoCE v2), checks it with ibv_rc_pingpong, then runs the program inside the guest. Nothing is installed on the
# host except the Debian packages below; the kernel package is only downloaded and unpacked into the cache.
#
# Usage:  run-in-vm.sh [--copy FILE]... [--env NAME=VALUE]... [--script GUEST_SCRIPT] [--out DIR] [BINARY [ARGS...]]
#   --copy FILE      copy a program (with the shared libraries it needs) or a data file into the guest's /opt/test
#   --env NAME=VALUE exported in the guest before the program runs
#   --script FILE    a sh script copied to the guest and run there (after BINARY, if one is given); /opt/test is
#                    on its PATH, so it can call the --copy'd programs, ib_write_bw and friends by name
#   --out DIR        the (text) files the guest leaves in /tmp/out come back into DIR (through the serial console)
# Env:    GDX_SOFTROCE_CACHE (default ~/.cache/gdx-softroce)  QEMU_MEM=2G  QEMU_SMP=2  BOOT_TIMEOUT=900
#         GDX_NO_APT=1 (never call apt-get; fail when a package is missing)
# Exit:   0 only when the pingpong, BINARY and the script all succeeded in the guest.
set -euo pipefail
CACHE=${GDX_SOFTROCE_CACHE:-$HOME/.cache/gdx-softroce}
MA=x86_64-linux-gnu
COPIES=() ENVS=() SCRIPT="" OUTDIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --copy) COPIES+=("$2"); shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --script) SCRIPT=$2; shift 2 ;;
    --out) OUTDIR=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
mkdir -p "$CACHE"
# Milestones for the console under `make test` (GDX_CONSOLE_FILE, tests/ctest_progress.sh): CTest shows this script's
# output only once it has ended, minutes later.
console() { [ -z "${GDX_CONSOLE_FILE:-}" ] || { echo "softroce: $*" >>"$GDX_CONSOLE_FILE"; } 2>/dev/null || true; }
guest_milestones() {  # the guest's timed lines ([T ...]) and the scripts' headings (=== ...), as they come
  if [ -n "${GDX_CONSOLE_FILE:-}" ]; then
    sed -un 's/\r$//; /^\[T \|^=== /s/^/softroce: guest: /p' >>"$GDX_CONSOLE_FILE" || cat >/dev/null
  else
    cat >/dev/null
  fi
}

# ---- 1. host packages (Debian 12) -----------------------------------------------------------------------------
PKGS="qemu-system-x86 busybox-static cpio kmod ibverbs-utils ibverbs-providers iproute2 perftest"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  [ "${GDX_NO_APT:-0}" = 1 ] && { echo "softroce: missing packages: $missing" >&2; exit 1; }
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  console "installing" $missing
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# ---- 2. Debian's kernel, unpacked once into the cache (under a lock: ctest may run several of us) ---------------
exec 9>"$CACHE/kernel.lock"
flock 9
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
KV=${KPKG#linux-image-}
if [ ! -f "$CACHE/kroot/boot/vmlinuz-$KV" ]; then
  console "downloading Debian's kernel $KPKG into $CACHE"
  rm -rf "$CACHE/kroot" "$CACHE/dl"; mkdir -p "$CACHE/dl"
  (cd "$CACHE/dl" && apt-get download "$KPKG")
  dpkg -x "$CACHE"/dl/"$KPKG"_*.deb "$CACHE/kroot"
  depmod -b "$CACHE/kroot" "$KV"  # the .deb ships no modules.dep (its postinst makes it)
fi
flock -u 9

# ---- 3. initramfs, private to this run ---------------------------------------------------------------------------
RUN=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$RUN"' EXIT
IR=$RUN/initramfs
mkdir -p "$IR"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc/libibverbs.d,opt/test,lib64,lib/$MA}
cp /bin/busybox "$IR/bin/"
for a in $("$IR/bin/busybox" --list); do [ -e "$IR/bin/$a" ] || ln -s busybox "$IR/bin/$a"; done
ln -s ../bin/busybox "$IR/sbin/modprobe"  # the kernel's request_module() uses /sbin/modprobe

copy_with_libs() {  # an ELF and every shared library it needs (by ldd)
  local f=$1 dst=${2:-$1}
  mkdir -p "$IR$(dirname "$dst")"; cp -L "$f" "$IR$dst"
  ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | while read -r l; do
    [ -e "$IR$l" ] || { mkdir -p "$IR$(dirname "$l")"; cp -L "$l" "$IR$l"; }
  done || true
}
for b in ibv_devices ibv_devinfo ibv_rc_pingpong rdma ib_write_bw ib_write_lat ib_read_bw; do
  copy_with_libs "$(command -v $b)" "/usr/bin/$b"
done
copy_with_libs /usr/lib/$MA/libibverbs/librxe-rdmav34.so  # the rxe userspace provider
cp /etc/libibverbs.d/rxe.driver "$IR/etc/libibverbs.d/"
for f in "${COPIES[@]}"; do copy_with_libs "$f" "/opt/test/$(basename "$f")"; done

# crc32_generic: rxe allocates crc32 for its ICRC; without it "rdma link add" fails with ENOENT.
MODS="virtio_pci virtio_net crc32_generic crc32_pclmul rdma_rxe"
for m in $MODS; do modprobe -d "$CACHE/kroot" -S "$KV" --show-depends "$m"; done |
  awk '$1=="insmod"{print $2}' | sort -u | while read -r ko; do
    rel=${ko#"$CACHE"/kroot}; mkdir -p "$IR$(dirname "$rel")"; cp "$ko" "$IR$rel"; done
cp "$CACHE/kroot/lib/modules/$KV"/modules.{builtin,builtin.modinfo,order} "$IR/lib/modules/$KV/"
depmod -b "$IR" "$KV"

quote() { local out="" a; for a in "$@"; do out+=" '${a//\'/\'\\\'\'}'"; done; echo "$out"; }
GUEST_CMD=""
if [ $# -gt 0 ]; then
  copy_with_libs "$1" "/opt/test/$(basename "$1")"
  GUEST_CMD="/opt/test/$(basename "$1")$(quote "${@:2}")"
fi
[ -z "$SCRIPT" ] || cp "$SCRIPT" "$IR/opt/test/guest-script.sh"
TEST_LINE=""
[ -z "$GUEST_CMD" ] || TEST_LINE="t test-start; $GUEST_CMD; trc=\$?; t test-end"
EXPORTS=""
for e in "${ENVS[@]}"; do EXPORTS+="export $(quote "$e")"$'\n'; done

cat >"$IR/init" <<EOF
#!/bin/sh
export PATH=/opt/test:/usr/bin:/usr/sbin:/bin:/sbin HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /tmp/out
t() { echo "[T \$(cut -d' ' -f1 /proc/uptime)s] \$*"; }
for m in $MODS; do modprobe \$m || echo "modprobe \$m FAILED"; done
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 && t "rxe0 created on eth0"
ibv_devinfo -d rxe0 -v | grep -E 'hca_id|state|link_layer|GID\[|max_qp_wr|atomic_cap'
ibv_rc_pingpong -d rxe0 -g 1 -n 100 >/tmp/srv.log 2>&1 &
sleep 1
ibv_rc_pingpong -d rxe0 -g 1 -n 100 127.0.0.1 >/tmp/cli.log 2>&1; rc=\$?
wait
echo "PINGPONG_RC=\$rc"
[ \$rc = 0 ] || cat /tmp/srv.log /tmp/cli.log
$EXPORTS
trc=0
$TEST_LINE
if [ -f /opt/test/guest-script.sh ]; then t script-start; sh /opt/test/guest-script.sh || trc=1; t script-end; fi
for f in /tmp/out/*; do
  [ -f "\$f" ] || continue
  echo "GDX_OUT_BEGIN \$(basename "\$f")"; cat "\$f"; echo; echo "GDX_OUT_END"
done
echo "TEST_RC=\$trc"
sync; poweroff -f
EOF
chmod +x "$IR/init"
(cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) >"$RUN/initrd.gz"

# ---- 4. boot ---------------------------------------------------------------------------------------------------
ACCEL=tcg; grep -qE 'vmx|svm' /proc/cpuinfo && [ -w /dev/kvm ] && ACCEL=kvm
LOG=$RUN/guest.log
start=$(date +%s.%N)
console "booting kernel $KV under QEMU ($ACCEL)"
timeout "${BOOT_TIMEOUT:-900}" qemu-system-x86_64 -accel $ACCEL -cpu max \
  -m "${QEMU_MEM:-2G}" -smp "${QEMU_SMP:-2}" -nographic -no-reboot \
  -kernel "$CACHE/kroot/boot/vmlinuz-$KV" -initrd "$RUN/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" \
  -netdev user,id=n0 -device virtio-net-pci,netdev=n0 </dev/null | tee -p "$LOG" >(guest_milestones) || true
end=$(date +%s.%N)
echo "softroce: qemu ($ACCEL) ran $(awk "BEGIN{print $end-$start}") s"
# Strip the serial console's carriage returns into a file first: `tr | grep -q` under pipefail fails at random
# once the log outgrows a pipe buffer (grep -q exits at the first match and tr dies of SIGPIPE).
tr -d '\r' <"$LOG" >"$LOG.txt"
if [ -n "$OUTDIR" ]; then  # the guest's /tmp/out, printed between markers by its init
  mkdir -p "$OUTDIR"
  awk -v dir="$OUTDIR" '/^GDX_OUT_BEGIN [A-Za-z0-9._-]+$/ { f = dir "/" $2; printf "" >f; next }
    /^GDX_OUT_END$/ { if (f != "") close(f); f = ""; next }
    f != "" { print >f }' "$LOG.txt"
  sed -n "s|^GDX_OUT_BEGIN \(.*\)|softroce: saved $OUTDIR/\1|p" "$LOG.txt"
fi
grep -q '^PINGPONG_RC=0' "$LOG.txt" || { echo "softroce: PINGPONG FAILED"; exit 1; }
grep -q '^TEST_RC=0' "$LOG.txt" || { echo "softroce: TEST FAILED"; exit 1; }
echo "softroce: ALL OK"
