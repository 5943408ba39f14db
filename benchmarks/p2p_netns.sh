#!/bin/bash
# benchmark_p2p between two network namespaces joined by a veth pair, as between two hosts: the server (and an
# `iperf3 -s` beside it) in one namespace, the client in the other, so the endpoint's TCP connection and iperf3's
# streams cross the same link in the same run (benchmark_p2p runs iperf3 -P with as many streams as its connection has
# sockets toward the server's address). Needs root and network namespaces; exits 77 (skipped) without them.
#   p2p_netns.sh BENCHMARK_P2P OUT_JSON [benchmark_p2p flags...]
set -u
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac  # the comment above
bin=$1
json=$2
shift 2
ns=gdxb$$r$((RANDOM % 1000))  # fresh names even beside what a killed earlier run left behind
srv=${ns}s cli=${ns}c
srvAddr=10.78.$(($$ % 250)).1 cliAddr=10.78.$(($$ % 250)).2

cleanup() {
  [ -n "${iperfPid:-}" ] && kill "$iperfPid" 2>/dev/null
  [ -n "${serverPid:-}" ] && kill "$serverPid" 2>/dev/null
  ip netns del "$srv" 2>/dev/null
  ip netns del "$cli" 2>/dev/null
  ip link del "${ns}a" 2>/dev/null  # a pair that never left the root namespace
}
trap cleanup EXIT

if ! ip netns add "$srv" 2>/dev/null; then
  echo "p2p_netns: skipped: ip netns add failed (not root, or no network namespaces in this kernel)"
  exit 77
fi
ip netns add "$cli" &&
  ip link add "${ns}a" type veth peer name "${ns}b" &&
  ip link set "${ns}a" netns "$srv" && ip link set "${ns}b" netns "$cli" &&
  ip -n "$srv" addr add "$srvAddr/24" dev "${ns}a" && ip -n "$cli" addr add "$cliAddr/24" dev "${ns}b" &&
  ip -n "$srv" link set "${ns}a" up && ip -n "$cli" link set "${ns}b" up &&
  ip -n "$srv" link set lo up && ip -n "$cli" link set lo up || {
  echo "p2p_netns: skipped: creating a veth pair between the namespaces failed (no veth in this kernel?)"
  exit 77
}
command -v iperf3 >/dev/null || echo "p2p_netns: iperf3 not found (Debian package iperf3): no peer figure"

# The client runs iperf3 toward port 5201 of the server's address after its own measurements; the server keeps
# answering tests until it is killed.
ip netns exec "$srv" iperf3 -s -p 5201 >/dev/null 2>&1 &
iperfPid=$!
port=$((20000 + $$ % 20000))
ip netns exec "$srv" "$bin" --role server --port "$port" --json /dev/null "$@" &
serverPid=$!
sleep 0.5
export GDX_BENCH_MACHINE="two network namespaces joined by a veth pair, $(grep -m1 'model name' /proc/cpuinfo |
  cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs"
ip netns exec "$cli" "$bin" --role client --peer "$srvAddr" --port "$port" --json "$json" "$@"
rc=$?
if [ $rc != 0 ]; then
  exit $rc  # the server may be waiting for the client that failed: cleanup stops it
fi
wait "$serverPid" || rc=1
serverPid=
exit $rc
