#!/usr/bin/env bash
# Installs the Debian packages of one group, when any is missing. Run by `make` on every build; it only calls
# apt-get when something is absent, so it costs a few dpkg queries otherwise. Each make target asks for the group it
# needs, so that a first `make run` does not wait for a gigabyte of test packages (python3-torch, qemu).
#
#   install-deps.sh build   libgdx and benchmark_local, built and run (`make run`); iperf3 is its peer
#   install-deps.sh all     also what the rest of `make` builds (the default of `make`, `make install`, `make bench`):
#                           GoogleTest and Google Benchmark for the tests and micro benchmarks, python3-dev and
#                           pybind11-dev for the Python package (python/), python3-numpy for README's Python examples
#   install-deps.sh test    also what the tests run (`make test` and the other test targets; the default here):
#                           clang builds the fuzz targets (tests/fuzz/), clang-format checks the sources, iproute2
#                           makes the network namespaces, qemu, busybox, cpio, kmod, rdma-core, ibverbs-utils and
#                           perftest the Soft-RoCE VM (tests/softroce/), python3-pytest runs the Python tests and
#                           python3-torch (CPU) lets them pass torch tensors and use torch.distributed's rendezvous
#                           (the package never links libtorch); python3-venv, python3-pip, python3-setuptools and
#                           python3-wheel are what CTest's pip_install needs for `pip install --no-build-isolation .`
#                           in a virtualenv (no package index asked); python3-matplotlib the plot test
#   install-deps.sh plots   only what `make plots` needs (matplotlib)
#
# GDX_NO_APT=1 skips it (machines without a package mirror; the build then reports what it cannot find).
set -euo pipefail
[ "${GDX_NO_APT:-0}" = 1 ] && exit 0
BUILD="cmake g++ make pkg-config libibverbs-dev ibverbs-providers libnuma-dev libhwloc-dev iperf3"
ALL="$BUILD libgtest-dev libgmock-dev libbenchmark-dev python3 python3-dev pybind11-dev python3-numpy"
TEST="$ALL clang clang-format iproute2 qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-utils perftest
python3-pytest python3-torch python3-venv python3-pip python3-setuptools python3-wheel python3-matplotlib"
PLOTS="python3 python3-matplotlib"
case "${1:-test}" in
  build) PKGS=$BUILD ;;
  all) PKGS=$ALL ;;
  test) PKGS=$TEST ;;
  plots) PKGS=$PLOTS ;;
  *) echo "usage: install-deps.sh [build|all|test|plots] (default test: everything)" >&2; exit 2 ;;
esac
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
command -v apt-get >/dev/null || { echo "install-deps: missing packages:$missing (no apt-get here)" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "install-deps: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
