#!/bin/bash
# The TCPX session benchmark beside its peers, on one machine in one run: benchmark_tcpx (a TcpxSession pair over
# 127.0.0.1, 64 MiB posted in 512 KiB chunks; it runs iperf3 -P channels x sockets itself when iperf3 is installed),
# then gdx's own benchmark_p2p (one Endpoint connection, sendAsync 8 deep) from 512 KiB to 64 MiB, then a summary of
# the three figures. Tables on stdout; each program's whole output and JSON in OUT_DIR.
#   run_tcpx_benchmark.sh BUILD_DIR [OUT_DIR]        (make bench-tcpx; OUT_DIR defaults to BUILD_DIR/bench-tcpx)
# The TCPX variables (UCCL_TCPX_PERF_SIZE, UCCL_TCPX_PERF_ITERS, UCCL_TCPX_CHUNK_BYTES, UCCL_TCPX_NUM_CHANNELS,
# NCCL_NSOCKS_PERTHREAD) pass through to benchmark_tcpx.
set -euo pipefail
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above
build=${1:?usage: run_tcpx_benchmark.sh BUILD_DIR [OUT_DIR]}
out=${2:-$build/bench-tcpx}
mkdir -p "$out"
for prog in benchmark_tcpx benchmark_p2p; do
  [ -x "$build/benchmarks/$prog" ] || { echo "run_tcpx_benchmark: $build/benchmarks/$prog is not built"; exit 2; }
done
peer=()
if command -v iperf3 >/dev/null 2>&1; then
  echo "run_tcpx_benchmark: peer: $(iperf3 --version | head -n 1)"
else
  echo "run_tcpx_benchmark: iperf3 is not installed (Debian: apt-get install iperf3); benchmark_tcpx runs without it"
  peer=(--no-iperf3)
fi
echo "run_tcpx_benchmark: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), $(nproc) CPUs"
"$build/benchmarks/benchmark_tcpx" --json "$out/benchmark_tcpx.json" "${peer[@]}" 2>&1 | tee "$out/benchmark_tcpx.txt"
"$build/benchmarks/benchmark_p2p" --min-bytes 512K --max-bytes 64M --json "$out/benchmark_p2p.json" 2>&1 |
  tee "$out/benchmark_p2p.txt"
python3 - "$out/benchmark_tcpx.json" "$out/benchmark_p2p.json" <<'EOF'
import json, sys
tcpx, p2p = (json.load(open(p)) for p in sys.argv[1:3])
mib = lambda n: f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"
print(f"\nsummary ({tcpx['machine']}, {tcpx['date']}):")
print(f"  TcpxSession, {mib(tcpx['bytes'])} in {mib(tcpx['chunk_bytes'])} chunks, {tcpx['channels']} channels x "
      f"{tcpx['sockets_per_channel']} sockets: {tcpx['gb_per_s']:.2f} GB/s per GPU (best {tcpx['best_gb_per_s']:.2f})")
for name, d in (("benchmark_tcpx", tcpx), ("benchmark_p2p", p2p)):
    i = d.get("peer_iperf3", {})
    print(f"  iperf3 in {name}'s run: " + (f"{i['command']}: {i['gb_per_s']:.2f} GB/s" if "gb_per_s" in i
                                             else f"did not run ({i.get('error', 'skipped')})"))
rows = {r["bytes"]: r for r in p2p["results"]}
for n in (tcpx["chunk_bytes"], tcpx["bytes"]):
    if n in rows:
        print(f"  benchmark_p2p ({p2p['connection']}), sendAsync {p2p['depth']} deep of {mib(n)}: "
              f"{rows[n]['send_gb_per_s']:.2f} GB/s")
EOF
