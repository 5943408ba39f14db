# Runs inside the Soft-RoCE guest (run-in-vm.sh --script): benchmark_remote over verbs as two processes, then
# perftest's ib_write_bw on the same device in the same boot, so the two can be compared. Both land in one JSON,
# /tmp/out/softroce_benchmark_remote.json (ib_write_bw's table as its "peer_ib_write_bw"), which run-in-vm.sh --out
# brings back to the host for benchmarks/plot.py (`make plots`).
set -u
MAX=${BENCH_MAX_BYTES:-16M}  # Soft-RoCE under TCG moves ~0.1-1 GB/s: keep the run short
IBW="ib_write_bw -d rxe0 -x 1 -a -n 20 -F"
rc=0
mkdir -p /tmp/out
# What the plot's title says: the program only sees the guest (hostname "(none)").
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
export GDX_BENCH_MACHINE="QEMU VM with Soft-RoCE (rdma_rxe), $cpu, $(grep -c ^processor /proc/cpuinfo) vCPUs"
echo "=== benchmark_remote (verbs, rxe0, two processes) ==="
benchmark_remote --transport verbs --max-bytes "$MAX" --target-bytes "${BENCH_TARGET_BYTES:-32M}" --json /tmp/benchmark_remote.json || rc=1
cat /tmp/benchmark_remote.json
echo "=== ib_write_bw (perftest, rxe0, GID 1) ==="
$IBW >/tmp/ibw_srv.log 2>&1 &
sleep 1
$IBW 127.0.0.1 >/tmp/ibw_cli.log 2>&1 || rc=1
cat /tmp/ibw_cli.log
wait
if [ -s /tmp/benchmark_remote.json ]; then
  awk -v command="$IBW" -f /opt/test/ib_write_bw_peer.awk /tmp/ibw_cli.log /tmp/benchmark_remote.json \
    >/tmp/out/softroce_benchmark_remote.json || rc=1
fi
exit $rc
