#!/usr/bin/env bash
# `make bench-gpu`: every GPU benchmark of docs/PERFORMANCE.md, one after another, each with its peer of the same run.
# Usage: run_gpu_benchmarks.sh BUILD_DIR OUT_DIR [PYTHON]
#   One GPU:  benchmark_local's GPU mode (the command path, the proxied round trip, the direct-path device API and the
#             forwarder on one GPU).
#   Two GPUs or more, in addition: benchmark_nvlink, benchmark_p2p's IPC table, benchmark_moe (normal mode, then the
#             low-latency mode) and, where the Python package was built with torch available, python -m gdx.bench.ep.
# Each benchmark's whole output goes to OUT_DIR/NAME.txt (and its table to the terminal), its JSON to OUT_DIR/NAME.json.
# A benchmark that fails is reported and the others still run; the exit status says whether all of them passed.
# GDX_BENCH_ONLY="nvlink moe" runs only those (names: local nvlink p2p moe moe_ll python_ep; another name is an error).
# The GPUs counted are those CUDA sees: nvidia-smi's list, cut to CUDA_VISIBLE_DEVICES where that is set.
set -uo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above

build=${1:?usage: run_gpu_benchmarks.sh BUILD_DIR OUT_DIR [PYTHON]}
out=${2:?usage: run_gpu_benchmarks.sh BUILD_DIR OUT_DIR [PYTHON]}
python=${3:-python3}
bin=$build/benchmarks
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off: gdx never uses it, and NCCL's peer must not either
mkdir -p "$out"

names="local nvlink p2p moe moe_ll python_ep"
for n in ${GDX_BENCH_ONLY:-}; do
  if [[ " $names " != *" $n "* ]]; then
    echo "bench-gpu: GDX_BENCH_ONLY names '$n'; the benchmarks are: $names" >&2
    exit 2
  fi
done
# wanted NAME: whether GDX_BENCH_ONLY (when set) names it.
wanted() { [ -z "${GDX_BENCH_ONLY:-}" ] || [[ " $GDX_BENCH_ONLY " == *" $1 "* ]]; }

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then  # nvidia-smi lists every GPU; CUDA sees only these
  visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  [ "$visible" -lt "$gpus" ] && gpus=$visible
fi
if [ "${gpus:-0}" -eq 0 ]; then
  echo "bench-gpu: no GPU visible (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them): nothing to run"
  exit 0
fi
if [ ! -x "$bin/benchmark_local" ] || [ ! -x "$bin/benchmark_nvlink" ]; then
  echo "bench-gpu: $bin has no CUDA benchmarks (was nvcc found when $build was configured?)" >&2
  exit 1
fi
echo "bench-gpu: $gpus GPU(s); results in $out"

failed=()
# run NAME COMMAND...: the command's output to OUT/NAME.txt and the terminal; its failure noted, not fatal.
run() {
  local name=$1
  shift
  wanted "$name" || return 0
  echo "=== $name: $* ($(date -u +%FT%TZ))"
  "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "bench-gpu: $name exited $rc (its output: $out/$name.txt)"
    failed+=("$name")
  fi
}

run local "$bin/benchmark_local" --mode gpu --json "$out/local.json"
if [ "$gpus" -ge 2 ]; then
  run nvlink "$bin/benchmark_nvlink" --max-bytes 1G --json "$out/nvlink.json"
  run p2p "$bin/benchmark_p2p" --device gpu --ipc --min-bytes 1M --max-bytes 256M --json "$out/p2p.json"
  run moe "$bin/benchmark_moe" --json "$out/moe.json"
  run moe_ll "$bin/benchmark_moe" --mode ll --json "$out/moe_ll.json"
  if wanted python_ep; then
    if [ -d "$build/python/gdx" ] && "$python" -c 'import torch' 2>/dev/null; then
      run python_ep env PYTHONPATH="$build/python" "$python" -m gdx.bench.ep --json "$out/python_ep.json"
    else
      echo "bench-gpu: python_ep skipped (no Python package in $build/python, or no torch for $python)"
    fi
  fi
else
  echo "bench-gpu: one GPU visible: benchmark_nvlink, benchmark_p2p --ipc, benchmark_moe and gdx.bench.ep need two"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "bench-gpu: failed: ${failed[*]}"
  exit 1
fi
echo "bench-gpu: done, none failed; results in $out"
