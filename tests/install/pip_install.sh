#!/usr/bin/env bash
# `pip install --no-build-isolation .` as a user of a virtualenv does it, then the CPU Python tests against the
# installed package. Usage: pip_install.sh BUILD_DIR PYTHON [PYTEST ARGS...]
#
# A virtualenv over PYTHON with --system-site-packages (Debian's setuptools, wheel, pybind11, pytest, numpy, torch are
# seen, no package index is asked), and pip installs from a clean copy of the package's sources (pyproject.toml,
# setup.py, CMakeLists.txt, README.md, python/), so nothing is written into the source tree. The copy's setup.py
# packages BUILD_DIR's libgdx and extension (GDX_CMAKE_BUILD_DIR) rather than configuring and compiling the project a
# second time: on CI's 2 cores that would cost as long as the build itself (its CUDA files most), and test a build
# other than the one the rest of CTest tested. What this checks is the packaging: pyproject/setup.py, the python
# install component (the extension, libgdx beside it, its $ORIGIN RPATH), the wheel, pip, and the package imported
# from site-packages outside the tree, with no PYTHONPATH or LD_LIBRARY_PATH. Exit 77 (skipped): no venv module.
set -euo pipefail
build=$(cd "$1" && pwd)
python=$2
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH LD_LIBRARY_PATH VIRTUAL_ENV
t0=$(date +%s)
stamp() { echo "pip_install: $1 ($(($(date +%s) - t0)) s)"; }

if ! "$python" -m venv --system-site-packages "$work/venv" >"$work/venv.log" 2>&1; then
  cat "$work/venv.log"
  echo "pip_install: skipped: '$python -m venv' failed (install python3-venv)"
  exit 77
fi
venv_python=$work/venv/bin/python
# PYTHON itself in a virtualenv (`make` run inside one): --system-site-packages reaches its base's packages only, so
# the new one also sees PYTHON's own (pytest, torch, setuptools, pybind11) through a .pth file, after its own.
outer=$("$python" -c 'import sys, sysconfig; sys.prefix != sys.base_prefix and print(sysconfig.get_path("purelib"))')
if [ -n "$outer" ]; then
  echo "$outer" >"$("$venv_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gdx_test_outer_venv.pth"
fi
stamp "virtualenv $work/venv (--system-site-packages)"

mkdir "$work/src"
cp -r "$src/pyproject.toml" "$src/setup.py" "$src/CMakeLists.txt" "$src/README.md" "$src/python" "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/src" && GDX_CMAKE_BUILD_DIR=$build "$venv_python" -m pip install --no-build-isolation --no-index \
  --disable-pip-version-check --no-cache-dir -q .)
stamp "pip install --no-build-isolation . (packaging $build)"
"$venv_python" -m pip show -f gdx | sed -n '1,2p;/^Files:/,$p'

# Outside any source tree: the installed package, its extension and libgdx found by the extension's RPATH.
cd "$work"
"$venv_python" - "$work/venv" <<'EOF'
import os, sys
import gdx, gdx.ep, gdx.p2p
venv = os.path.realpath(sys.argv[1])
for m in (gdx, gdx._gdx):
    assert os.path.realpath(m.__file__).startswith(venv + os.sep), f"{m.__name__} imported from {m.__file__}"
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libgdx.so" in l]
assert libs and all(os.path.realpath(l).startswith(venv + os.sep) for l in libs), f"libgdx loaded from {set(libs)}"
print("pip_install: gdx", gdx.__version__, "from", os.path.dirname(gdx.__file__), "with", os.path.basename(libs[0]))
EOF
stamp "imported from site-packages"

"$venv_python" -m pytest -q -p no:cacheprovider -rs -m "not gpu" "$@" "$src/tests/python"
stamp "CPU Python tests against the installed package passed"
