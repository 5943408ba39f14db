#!/usr/bin/env bash
# Installs the build tree BUILD_DIR into a scratch prefix, then builds tests/install/consumer.cpp against it twice —
# with CMake's find_package(gdx) and with pkg-config gdx — and runs both programs without LD_LIBRARY_PATH.
# With PYTHON, also imports the installed Python package. Usage: run.sh BUILD_DIR [PYTHON]
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
unset LD_LIBRARY_PATH
port=$((20000 + RANDOM % 20000))
run() { GDX_RANK=0 GDX_WORLD_SIZE=1 GDX_MASTER_PORT=$port timeout 120 "$@"; }

echo "== find_package(gdx)"
cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cmake-build" >/dev/null
run "$work/cmake-build/consumer"

echo "== pkg-config gdx"
pcdir=$(dirname "$(find "$work/prefix" -name gdx.pc | head -n 1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$work/prefix" --cflags --libs gdx)
echo "pkg-config --cflags --libs gdx: $flags"

# The installed headers are the whole API: every one compiles given only the prefix (and CUDA's include path, which
# gdx.pc names), so none reaches into the library's source folders. The ep headers take CUDA's types: checked where
# the build has CUDA.
echo "== every installed header, from the prefix alone"
all="$work/all_headers.cpp"
: >"$all"
count=0
while read -r h; do
  case "$h" in gdx/ep/*) [[ "$flags" == *GDX_HAVE_CUDA* ]] || continue ;; esac
  echo "#include <$h>" >>"$all"
  count=$((count + 1))
done < <(cd "$work/prefix/include" && find gdx -name '*.hpp' | sort)
# shellcheck disable=SC2086
g++ -std=c++17 -fsyntax-only $flags "$all"
echo "$count headers compiled from $work/prefix/include"
# shellcheck disable=SC2086
g++ -std=c++17 -O1 "$here/consumer.cpp" -o "$work/consumer-pc" $flags
run "$work/consumer-pc"

# The Python package, where the build has it: imported from the prefix, its extension finding libgdx by its rpath.
ext=$(find "$work/prefix" -name '_gdx*.so' | head -n 1)
if [ -n "$ext" ] && [ -n "${2:-}" ]; then
  echo "== python: import gdx from $(dirname "$(dirname "$ext")")"
  PYTHONPATH=$(dirname "$(dirname "$ext")") run "$2" -c 'import gdx, gdx.ep; print("gdx", gdx.__version__, gdx.__file__)'
fi
