#!/bin/sh
# Starts N ranks of a gdx program on this host, as torchrun or mpirun would: each copy gets GDX_RANK,
# GDX_WORLD_SIZE, GDX_LOCAL_RANK, GDX_MASTER_ADDR, GDX_MASTER_PORT and GDX_JOB_SECRET for a fresh job. POSIX sh, so
# it also runs under busybox (the Soft-RoCE VM).
#
# Usage:  run_ranks.sh [--rank-env R NAME=VALUE]... N PROGRAM [ARGS...]
#   --rank-env R NAME=VALUE   set NAME=VALUE for rank R only (e.g. GDX_DIRECT=0 for the rank that plays another host)
# Env:    GDX_MASTER_PORT (default: a free port), GDX_MASTER_ADDR (default 127.0.0.1),
#         RUN_RANKS_TIMEOUT (seconds for the whole job, default 120)
# Exit:   the ranks' exit code when they all agree (0: all passed, 77: all skipped), 124 when the job ran past the
#         timeout, else 1. As soon as one rank fails, the others are stopped (TERM, then KILL).
set -u
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above
rank_envs=""
while [ $# -gt 0 ] && [ "$1" = --rank-env ]; do
  [ $# -ge 3 ] || { echo "run_ranks: --rank-env needs R NAME=VALUE" >&2; exit 2; }
  rank_envs="$rank_envs$2 $3
"
  shift 3
done
[ $# -ge 2 ] || { echo "usage: run_ranks.sh [--rank-env R NAME=VALUE]... N PROGRAM [ARGS...]" >&2; exit 2; }
n=$1
shift

port=${GDX_MASTER_PORT:-}
if [ -z "$port" ]; then  # a port the kernel just handed out, so parallel jobs do not meet at 29500
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null) || port=$((20000 + $$ % 20000))
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
trap 'stop_all; exit 130' INT TERM

# Each rank runs in a subshell that records the program's pid (to stop it) and then its exit code.
r=0
while [ "$r" -lt "$n" ]; do
  (
    export GDX_RANK="$r" GDX_WORLD_SIZE="$n" GDX_LOCAL_RANK="$r" GDX_MASTER_PORT="$port"
    export GDX_MASTER_ADDR="${GDX_MASTER_ADDR:-127.0.0.1}" GDX_JOB_SECRET="${GDX_JOB_SECRET:-run_ranks-$$-$port}"
    while read -r for_rank assignment; do
      [ "$for_rank" = "$r" ] && export "$assignment"
    done <<EOF
$rank_envs
EOF
    "$@" &
    echo $! >"$dir/pid.$r"
    wait $!
    code=$?
    # Written aside and renamed: rc.R appears complete, and the monitor's rc.* never matches the partial file.
    echo "$code" >"$dir/partial.$r" && mv "$dir/partial.$r" "$dir/rc.$r"
  ) &
  r=$((r + 1))
done

finished() {  # number of ranks that exited
  c=0
  for f in "$dir"/rc.*; do [ -f "$f" ] && c=$((c + 1)); done
  echo $c
}
signal_all() {
  for f in "$dir"/pid.*; do [ -f "$f" ] && kill "-$1" "$(cat "$f")" 2>/dev/null; done
}
stop_all() {  # TERM, five seconds to leave, then KILL
  signal_all TERM
  t=0
  while [ "$(finished)" -lt "$n" ] && [ $t -lt 25 ]; do sleep 0.2; t=$((t + 1)); done
  signal_all KILL
  wait
}

deadline=$(($(date +%s) + ${RUN_RANKS_TIMEOUT:-120}))
timed_out=0
while [ "$(finished)" -lt "$n" ]; do
  failed=""
  for f in "$dir"/rc.*; do
    [ -f "$f" ] || continue
    case $(cat "$f") in 0 | 77) ;; *) failed="rank ${f##*rc.} exited with $(cat "$f")" ;; esac
  done
  if [ -n "$failed" ]; then
    echo "run_ranks: $failed; stopping the other ranks" >&2
    stop_all
    break
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "run_ranks: the job ran past ${RUN_RANKS_TIMEOUT:-120} s; stopping it" >&2
    timed_out=1
    stop_all
    break
  fi
  sleep 0.2
done
wait

[ $timed_out = 0 ] || exit 124
codes="" first=""
r=0
while [ "$r" -lt "$n" ]; do
  c=$(cat "$dir/rc.$r" 2>/dev/null || echo "?")
  codes="$codes $c"
  [ -n "$first" ] || first=$c
  [ "$c" = "$first" ] || first=mixed
  r=$((r + 1))
done
case $first in
  mixed | "?") echo "run_ranks: exit codes of ranks 0..$((n - 1)):$codes" >&2; exit 1 ;;
  *) exit "$first" ;;
esac
