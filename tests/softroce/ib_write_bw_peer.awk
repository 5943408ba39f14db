# Adds perftest's ib_write_bw table to benchmark_remote's JSON as the peer measured in the same boot, so that
# benchmarks/plot.py draws the two on one plot:
#   awk -v command="ib_write_bw ..." -f ib_write_bw_peer.awk IB_WRITE_BW_OUTPUT BENCHMARK_REMOTE_JSON >OUT.json
# -v key=peer_ib_read_bw names the entry otherwise (ib_read_bw's table, which has the same columns, for benchmark_p2p).
# Rows of the table (after its "#bytes" header): bytes, iterations, BW peak, BW average, MsgRate. perftest's "MB/sec"
# are MiB/s (its --help: "--report_gbits ... instead of MiB/sec"); they are kept as printed, under _mib_per_s.
# POSIX awk only: it runs under busybox in the Soft-RoCE guest and under the host's awk in the unit test.
FILENAME == ARGV[1] {
  if ($1 == "#bytes") table = 1
  else if (table && $1 ~ /^[0-9]+$/ && NF >= 4)
    rows = rows (rows == "" ? "" : ",") "{\"bytes\":" $1 ",\"iterations\":" $2 ",\"peak_mib_per_s\":" $3 \
           ",\"average_mib_per_s\":" $4 (NF >= 5 ? ",\"mpps\":" $5 : "") "}"
  next
}
{ json = json $0 }
END {
  sub(/}[ \t\r]*$/, "", json)
  printf "%s,\"%s\":{\"command\":\"%s\",\"results\":[%s]}}\n", json, key == "" ? "peer_ib_write_bw" : key, command, rows
}
