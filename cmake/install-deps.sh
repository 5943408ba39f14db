#!/usr/bin/env bash
# Installs the Debian packages gdx builds and tests against, when any is missing. Run by `make` on every
# build; it only calls apt-get when something is absent, so it costs a few dpkg queries otherwise.
# `install-deps.sh plots`: only what `make plots` needs (matplotlib); the full list has it too, for the plot test.
# python3-dev and pybind11-dev build the Python package (python/), python3-pytest and python3-numpy test it;
# python3-venv, python3-pip, python3-setuptools and python3-wheel are what CTest's pip_install needs for
# `pip install --no-build-isolation .` in a virtualenv (no package index asked). python3-torch (CPU) lets its tests pass torch tensors and use torch.distributed's rendezvous (the package never
# links libtorch).
# clang builds the fuzz targets (tests/fuzz/); without it they are skipped.
# GDX_NO_APT=1 skips it (machines without a package mirror; the build then reports what it cannot find).
set -euo pipefail
[ "${GDX_NO_APT:-0}" = 1 ] && exit 0
PKGS="cmake g++ make pkg-config libibverbs-dev ibverbs-providers rdma-core ibverbs-utils libnuma-dev libhwloc-dev
libgtest-dev libgmock-dev libbenchmark-dev iproute2 iperf3 qemu-system-x86 busybox-static cpio kmod perftest
clang-format clang python3 python3-matplotlib python3-dev pybind11-dev python3-pytest python3-numpy python3-torch
python3-venv python3-pip python3-setuptools python3-wheel"
[ "${1:-}" = plots ] && PKGS="python3 python3-matplotlib"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
command -v apt-get >/dev/null || { echo "install-deps: missing packages:$missing (no apt-get here)" >&2; exit 1; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "install-deps: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
