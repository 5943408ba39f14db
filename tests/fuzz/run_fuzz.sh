#!/usr/bin/env bash
# run_fuzz.sh TARGET CORPUS SECONDS: runs one fuzz target for SECONDS over its checked-in corpus (read only: new
# inputs go to a corpus beside the binary). A finding is saved beside the binary as <target>-crash-*, the run fails,
# and the input belongs in the corpus once the decoder is fixed. Exits 77 (skipped) when the target was not built,
# that is where clang++ is missing. A finding exits 1: libFuzzer's own default, 77, would read as skipped.
set -euo pipefail
bin=$1 corpus=$2 seconds=$3
name=$(basename "$bin")
[ -x "$bin" ] || { echo "$name not built (no clang++; install clang and re-run cmake): skipped"; exit 77; }
work="$bin.corpus"
mkdir -p "$work"
echo "$name: fuzzing for $seconds s over $corpus (findings: $bin-*)"
exec "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 \
  -print_final_stats=1 -artifact_prefix="$bin-" "$work" "$corpus"
