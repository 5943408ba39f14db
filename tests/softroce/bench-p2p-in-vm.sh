# Runs inside the Soft-RoCE guest (run-in-vm.sh --script): benchmark_p2p over verbs (server and client, two
# processes), then perftest's ib_write_bw and ib_read_bw on the same device in the same boot, so that the endpoint's
# write and read can be compared with them. benchmark_p2p's JSON, with both tables added as its "peer_ib_write_bw" and
# "peer_ib_read_bw" (ib_write_bw_peer.awk) for benchmarks/plot.py, and perftest's tables as printed land in /tmp/out,
# which run-in-vm.sh --out brings back to the host (softroce_benchmark_p2p.json, softroce_ib_{write,read}_bw.txt).
set -u
MIN=${BENCH_MIN_BYTES:-4K}  # small blocking transfers too: a false peer death once showed there (heartbeat_clock.hpp)
MAX=${BENCH_MAX_BYTES:-4M}
rc=0
mkdir -p /tmp/out
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
export GDX_BENCH_MACHINE="QEMU VM with Soft-RoCE (rdma_rxe), $cpu, $(grep -c ^processor /proc/cpuinfo) vCPUs"
echo "=== benchmark_p2p (verbs, rxe0, two processes) ==="
benchmark_p2p --transport verbs --min-bytes "$MIN" --max-bytes "$MAX" --target-bytes "${BENCH_TARGET_BYTES:-8M}" \
  --json /tmp/benchmark_p2p.json || rc=1
json=/tmp/benchmark_p2p.json
for tool in ib_write_bw ib_read_bw; do
  echo "=== $tool (perftest, rxe0, GID 1) ==="
  cmd="$tool -d rxe0 -x 1 -a -n 20 -F"
  $cmd >/tmp/${tool}_srv.log 2>&1 &
  sleep 1
  $cmd 127.0.0.1 >/tmp/out/softroce_$tool.txt 2>&1 || rc=1
  cat /tmp/out/softroce_$tool.txt
  wait
  if [ -s "$json" ]; then
    awk -v command="$cmd" -v key="peer_$tool" -f /opt/test/ib_write_bw_peer.awk /tmp/out/softroce_$tool.txt "$json" \
      >"$json.$tool" && json=$json.$tool || rc=1
  fi
done
[ ! -s "$json" ] || cp "$json" /tmp/out/softroce_benchmark_p2p.json
exit $rc
