#!/usr/bin/env bash
# examples/run_ranks.sh under a rank that exits at once: the healthy ranks are left to finish (the monitor once read
# a rank's half-written exit-code file as a failure and killed the others), and a rank that fails is still seen.
# Usage: check_run_ranks.sh [RUNS (default 40)]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
run_ranks=$here/../examples/run_ranks.sh
runs=${1:-40}
failed=0
# Rank 0 exits at once with 0; the other ranks work for a moment, then exit 0: the job passes every time.
for i in $(seq "$runs"); do
  out=$(RUN_RANKS_TIMEOUT=60 "$run_ranks" 3 sh -c '[ "$GDX_RANK" = 0 ] || sleep 0.4' 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL run $i: exit $rc where every rank exited 0: $out"; failed=1
  fi
done
# Rank 0 fails at once: the job ends with 1 well before the other ranks' 30 s, which were stopped.
start=$(date +%s)
out=$(RUN_RANKS_TIMEOUT=60 "$run_ranks" 2 sh -c '[ "$GDX_RANK" = 0 ] && exit 3; exec sleep 30' 2>&1); rc=$?
took=$(($(date +%s) - start))
if [ $rc -ne 1 ] || [ $took -ge 20 ] || ! grep -q "rank 0 exited with 3" <<<"$out"; then
  echo "FAIL a failing rank: exit $rc after $took s: $out"; failed=1
fi
[ $failed = 0 ] && echo "ok   run_ranks.sh: $runs jobs with a rank exiting at once passed; a failing rank stopped the job"
exit $failed
