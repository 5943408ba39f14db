#!/usr/bin/env python3
"""CTest benchmark_plots: benchmarks/plot.py draws one made-up JSON of every benchmark format (tests/fixtures/plot),
writing non-empty PNG and SVG files whose SVG names both gdx's series and the peer's (python -m gdx.bench.p2p measures
no peer: its own series only). benchmark_remote and benchmark_p2p over verbs get their peers the way the Soft-RoCE
guest adds them: perftest's text through tests/softroce/ib_write_bw_peer.awk.
Exits 77 (CTest SKIP_RETURN_CODE) when matplotlib is missing.   Usage: plot_test.py SOURCE_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77

# fixture -> {plot: labels its SVG must hold: gdx's series first, then the peer's}
EXPECTED = {
    "fixture_benchmark_local_host": {
        "bandwidth": ["gdx: stream of puts", "iperf3 over loopback, 1 stream"],
        "latency": ["gdx: putWithSignal ping-pong", "raw TCP ping-pong"]},
    "fixture_benchmark_local_gpu": {
        "latency": ["gdx: put + signal round trip", "raw GPU→CPU→GPU round trip"],
        "bandwidth": ["gdx: stream of puts, GPU windows", "cudaMemcpyAsync device→device"]},
    "fixture_benchmark_remote_tcp": {"bandwidth": ["gdx: one-sided writes over tcp", "iperf3 between the ranks"]},
    "fixture_benchmark_remote_verbs": {"bandwidth": ["gdx: one-sided writes over verbs", "ib_write_bw average"]},
    "fixture_benchmark_nvlink": {
        "bandwidth": ["gdx: device put", "cudaMemcpyPeerAsync", "NCCL send/recv"],
        "latency": ["gdx: put with signal", "NCCL send/recv ping-pong"]},
    "fixture_benchmark_p2p": {
        "bandwidth": ["gdx: send/recv, 8 in flight", "gdx: one-sided read",
                      "iperf3 toward the server's host, 4 streams"],
        "latency": ["gdx: send/recv, one way", "raw TCP ping-pong, one way"]},
    "fixture_benchmark_p2p_verbs": {"bandwidth": ["gdx: one-sided write", "ib_write_bw average", "ib_read_bw average"]},
    "fixture_benchmark_tcpx": {"bandwidth": ["gdx: TcpxSession, 512K-byte posts", "iperf3 toward the server's host"]},
    "fixture_benchmark_moe": {
        "dispatch_bandwidth": ["gdx: dispatch, bf16", "gdx: dispatch, fp8", "NCCL all_to_all_single, fp8's bytes"],
        "dispatch_latency": ["gdx: dispatch, bf16", "NCCL all_to_all_single, bf16's bytes"],
        "combine_bandwidth": ["gdx: combine, bf16", "NCCL all_to_all_single, bf16's bytes"],
        "combine_latency": ["gdx: combine, bf16", "NCCL all_to_all_single, bf16's bytes"]},
    "fixture_gdx_bench_p2p": {"bandwidth": ["gdx.p2p: send/recv", "gdx.p2p: write_async"],
                              "latency": ["gdx.p2p: send/recv, one way", "gdx.p2p: blocking write"]},
}
MADE = {"fixture_benchmark_remote_verbs", "fixture_benchmark_p2p_verbs"}  # a fixture and perftest's text, joined here


def main():
    src = sys.argv[1]
    plot = os.path.join(src, "benchmarks", "plot.py")
    fixtures = os.path.join(src, "tests", "fixtures", "plot")
    check = subprocess.run([sys.executable, plot, "--check"], capture_output=True, text=True)
    if check.returncode == 3:
        print(f"SKIP: {check.stderr.strip()}")
        return SKIP
    if check.returncode != 0:
        print(f"FAIL: plot.py --check exited {check.returncode}: {check.stderr}")
        return 1
    tmp = tempfile.mkdtemp(prefix="gdx_plot_test_")
    verbs = os.path.join(tmp, "fixture_benchmark_remote_verbs.json")
    with open(verbs, "w") as out:
        subprocess.run(["awk", "-v", "command=ib_write_bw -d rxe0 -x 1 -a -n 20 -F", "-f",
                        os.path.join(src, "tests", "softroce", "ib_write_bw_peer.awk"),
                        os.path.join(fixtures, "fixture_ib_write_bw.txt"),
                        os.path.join(fixtures, "fixture_benchmark_remote_verbs.json")], stdout=out, check=True)
    # benchmark_p2p over verbs: both perftest tables (the fixture's ib_write_bw text stands for ib_read_bw's too).
    p2p = os.path.join(fixtures, "fixture_benchmark_p2p.json")
    for tool in ("ib_write_bw", "ib_read_bw"):
        made = os.path.join(tmp, f"fixture_benchmark_p2p_verbs.{tool}")
        with open(made, "w") as out:
            subprocess.run(["awk", "-v", f"command={tool} -d rxe0", "-v", f"key=peer_{tool}", "-f",
                            os.path.join(src, "tests", "softroce", "ib_write_bw_peer.awk"),
                            os.path.join(fixtures, "fixture_ib_write_bw.txt"), p2p], stdout=out, check=True)
        p2p = made
    p2p_verbs = os.path.join(tmp, "fixture_benchmark_p2p_verbs.json")
    os.rename(p2p, p2p_verbs)
    with open(verbs) as f:
        peer = json.load(f)["peer_ib_write_bw"]["results"]
    if len(peer) != 23 or peer[-1] != {"bytes": 8388608, "iterations": 20, "peak_mib_per_s": 16.40,
                                       "average_mib_per_s": 16.02, "mpps": 0.000002}:
        print(f"FAIL: ib_write_bw_peer.awk read {len(peer)} rows, last {peer[-1] if peer else None}")
        return 1
    # Google Benchmark's JSON lies in the same build folder: `make plots` passes it too, and it must be skipped.
    other = os.path.join(tmp, "bench_ring.json")
    with open(other, "w") as f:
        json.dump({"context": {}, "benchmarks": []}, f)
    files = [verbs, p2p_verbs, other] + [os.path.join(fixtures, f"{name}.json")
                                         for name in EXPECTED if name not in MADE]
    out = os.path.join(tmp, "plots")
    run = subprocess.run([sys.executable, plot, "--out", out] + files, capture_output=True, text=True)
    print(run.stdout + run.stderr)
    if run.returncode != 0:
        print(f"FAIL: plot.py exited {run.returncode}")
        return 1
    failures = []
    for name, plots in EXPECTED.items():
        for quantity, labels in plots.items():
            base = os.path.join(out, f"{name}_{quantity}")
            for ext in ("png", "svg"):
                if not os.path.exists(f"{base}.{ext}") or os.path.getsize(f"{base}.{ext}") == 0:
                    failures.append(f"{base}.{ext} missing or empty")
            if os.path.exists(f"{base}.svg"):
                with open(f"{base}.svg", encoding="utf-8") as f:
                    svg = f.read()
                failures += [f"{base}.svg lacks '{s}'" for s in labels + ["FIXTURE", "2026-01-01"] if s not in svg]
    if any(f.startswith("bench_ring") for f in os.listdir(out)):
        failures.append("bench_ring.json was plotted instead of skipped")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        return 1  # the plots stay in tmp to be looked at
    print(f"ok: {sum(len(p) for p in EXPECTED.values())} plots, PNG and SVG, gdx and its peer in each")
    shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
