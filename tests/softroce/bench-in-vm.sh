# Runs inside the Soft-RoCE guest (run-in-vm.sh --script): benchmark_remote over verbs as two processes, then
# perftest's ib_write_bw on the same device in the same boot, so the two can be compared.
set -u
MAX=${BENCH_MAX_BYTES:-16M}  # Soft-RoCE under TCG moves ~0.1-1 GB/s: keep the run short
rc=0
echo "=== benchmark_remote (verbs, rxe0, two processes) ==="
benchmark_remote --transport verbs --max-bytes "$MAX" --target-bytes "${BENCH_TARGET_BYTES:-32M}" --json /tmp/benchmark_remote.json || rc=1
cat /tmp/benchmark_remote.json
echo "=== ib_write_bw (perftest, rxe0, GID 1) ==="
ib_write_bw -d rxe0 -x 1 -a -n 20 -F >/tmp/ibw_srv.log 2>&1 &
sleep 1
ib_write_bw -d rxe0 -x 1 -a -n 20 -F 127.0.0.1 || rc=1
wait
exit $rc
