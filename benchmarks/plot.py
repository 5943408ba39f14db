#!/usr/bin/env python3
"""Plots of the JSON that gdx's benchmarks write: gdx beside the peer measured in the same run.

  plot.py [--out DIR] FILE.json...   writes DIR/<name>_bandwidth.{png,svg} and DIR/<name>_latency.{png,svg} for each
                                     file, for the quantities it holds (DIR: plots)
  plot.py --check                    exits 0 when matplotlib can be imported, else says what to install (exit 3)

It reads what every benchmark_* program writes with --json (benchmark_local in host and GPU mode, benchmark_remote,
benchmark_p2p, benchmark_tcpx, benchmark_nvlink, benchmark_moe; their --plot DIR runs this on it) and what
`python -m gdx.bench.ep` and `python -m gdx.bench.p2p` write. The peer is what the same run measured without gdx:
iperf3 and a raw TCP ping-pong over the same path, ib_write_bw and ib_read_bw (verbs: tests/softroce/bench-in-vm.sh
and bench-p2p-in-vm.sh add them), cudaMemcpyAsync, cudaMemcpyPeerAsync and NCCL (send/recv, all_to_all_single), the
raw GPU->CPU->GPU round trip. A peer that is one figure (iperf3's stream, the raw round trip) is a labelled horizontal
line. Sizes (or MoE's tokens per rank) are on a log2 axis; the title names the benchmark, the machine and the date.
MoE plots show the whole dispatch and combine calls (not their halves or CUDA-graph forms), a line per dtype. Other
JSON (Google Benchmark's bench_ring.json, ...) is skipped with a note.
Needs Debian's python3-matplotlib (`make plots` installs it).
"""
import argparse
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

MISSING_MATPLOTLIB = 3  # exit status of --check (and of any run) without matplotlib


@dataclass
class Line:
    label: str
    xs: list
    ys: list
    peer: bool


@dataclass
class Ref:
    """One figure for every size (iperf3's stream, the raw round trip): a horizontal line."""
    label: str
    y: float
    peer: bool


@dataclass
class Chart:
    quantity: str  # "bandwidth" or "latency": the file name's suffix, after `part` where a benchmark draws several
    ylabel: str
    lines: list = field(default_factory=list)
    refs: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    part: str = ""  # "dispatch", "combine": the file name is <json name>_<part>_<quantity>
    tokens: bool = False  # x is MoE's tokens per rank, not a message size in bytes

    def add(self, label, rows, key, peer=False, x="bytes"):
        """A line from rows that have `key` (benchmarks write -1 for "not measured")."""
        points = [(r[x], r[key]) for r in rows if r.get(key) is not None and r[key] >= 0]
        if points:
            self.lines.append(Line(label, [p[0] for p in points], [p[1] for p in points], peer))

    def has_peer(self):
        return any(s.peer for s in self.lines + self.refs)


BANDWIDTH = "bandwidth (GB/s, 10⁹ B/s)"
LATENCY_ONE_WAY = "latency (µs, one way)"


def iperf3_peer(chart, d, where):
    p = d.get("peer_iperf3")
    if not p:
        return
    streams = re.search(r" -P (\d+)", p.get("command", ""))
    streams = f"{streams.group(1)} streams" if streams and streams.group(1) != "1" else "1 stream"
    if p.get("gb_per_s", -1) >= 0:
        chart.refs.append(Ref(f"iperf3 {where}, {streams}: {p['gb_per_s']:.2f} GB/s (peer)", p["gb_per_s"], True))
    else:
        chart.notes.append(f"iperf3 did not run: {p.get('error', '?')}")


def perftest_peer(chart, d, tool):
    """ib_write_bw's or ib_read_bw's table as tests/softroce/ib_write_bw_peer.awk adds it ("peer_<tool>")."""
    p = d.get(f"peer_{tool}")
    if p:
        rows = [{"bytes": r["bytes"], "gb_per_s": r["average_mib_per_s"] * 2**20 / 1e9} for r in p["results"]]
        chart.add(f"{tool} average, perftest (peer)", rows, "gb_per_s", peer=True)


# ---- one reader per benchmark: (transport / path for the title, charts) --------------------------------------------
def read_local(d):
    if d.get("mode") == "gpu":
        return read_local_gpu(d)
    rows = d["results"]
    bw = Chart("bandwidth", BANDWIDTH)
    bw.add("gdx: stream of puts, ring → proxy → TCP → 2nd process", rows, "gb_per_s")
    iperf3_peer(bw, d, "over loopback")
    lat = Chart("latency", LATENCY_ONE_WAY)
    lat.add("gdx: putWithSignal ping-pong", rows, "latency_us")
    lat.add("raw TCP ping-pong, one loopback socket (peer)", rows, "tcp_loopback_latency_us", peer=True)
    return f"host mode, {d.get('transport', 'tcp')} over loopback, two processes", [bw, lat]


def read_local_gpu(d):
    rows = d["sizes"]
    lat = Chart("latency", "latency (µs, round trip kernel → proxy → same kernel)")
    lat.add("gdx: put + signal round trip, GPU windows", rows, "latency_us")
    if "put_with_signal_host_windows_us" in d:
        us = d["put_with_signal_host_windows_us"]
        lat.lines.append(Line("gdx: putWithSignal 8 B, host-mapped windows", [8], [us], False))
    for key, label in (("raw_round_trip_us", "raw GPU→CPU→GPU round trip, host-mapped flag"),
                       ("raw_round_trip_device_signal_us", "same, answer copied into device memory")):
        if key in d:
            lat.refs.append(Ref(f"{label}: {d[key]:.2f} µs (peer)", d[key], True))
    bw = Chart("bandwidth", BANDWIDTH)
    bw.add("gdx: stream of puts, GPU windows", rows, "gb_per_s")
    bw.add("cudaMemcpyAsync device→device, back to back (peer)", rows, "cuda_memcpy_gb_per_s", peer=True)
    return f"GPU mode, one GPU, {d.get('transport', '?')} transport", [lat, bw]


def read_remote(d):
    bw = Chart("bandwidth", BANDWIDTH)
    transport = d.get("transport", "?")
    bw.add(f"gdx: one-sided writes over {transport}, {d.get('depth', '?')} in flight", d["results"], "gb_per_s")
    perftest_peer(bw, d, "ib_write_bw")
    iperf3_peer(bw, d, "between the ranks' hosts")
    return f"{transport}, {d.get('device', 'cpu')} windows, rank 0 → rank 1", [bw]


NVLINK_GDX = [("gdx_put", "gdx: device put, one launch per put"),
              ("gdx_put_in_kernel", "gdx: device puts from one launch"),
              ("peer_copy_copy_engines_from_16MiB", "gdx::peerCopy (defaults)"),
              ("peer_copy_queue", "gdx::PeerCopyQueue, back to back from the host")]
NVLINK_PEERS = [("cuda_memcpy_peer_async", "cudaMemcpyPeerAsync (peer)"),
                ("nccl_send_recv", "NCCL send/recv, PyTorch (peer)")]


def read_nvlink(d):
    rows = d["bandwidth_GBps"]
    bw = Chart("bandwidth", BANDWIDTH)
    for key, label in NVLINK_GDX:
        bw.add(label, rows, key)
    for key, label in NVLINK_PEERS:
        bw.add(label, rows, key, peer=True)
    lat = Chart("latency", LATENCY_ONE_WAY)
    entries = d.get("put_with_signal_latency_us_one_way", [])
    if entries and "form" in entries[0]:
        by_form = {}
        for e in entries:
            by_form.setdefault(e["form"], []).append(e)
        for form in ("thread", "warp", "block"):
            lat.add(f"gdx: put with signal, {form} form", by_form.get(form, []), "us")
        signal = by_form.get("signal", [])
    else:  # older files tag the byte counts: 0 is a signal alone, an odd count the warp form of (count - 1) bytes
        lat.add("gdx: put with signal, thread form", [e for e in entries if e["bytes"] and e["bytes"] % 2 == 0], "us")
        lat.add("gdx: put with signal, warp form",
                [{"bytes": e["bytes"] - 1, "us": e["us"]} for e in entries if e["bytes"] % 2 == 1], "us")
        signal = [e for e in entries if e["bytes"] == 0]
    for e in signal:
        lat.refs.append(Ref(f"gdx: signal alone: {e['us']:.2f} µs", e["us"], False))
    lat.add("NCCL send/recv ping-pong, PyTorch (peer)", d.get("nccl_latency_us_one_way", []), "us", peer=True)
    path = "NVLink, direct path (CUDA IPC)" if d.get("direct", True) else "through the proxy"
    return f"GPU 0 → GPU 1 over {path}", [bw, lat]


def read_p2p(d):
    rows, depth = d["results"], d.get("depth", "?")
    bw = Chart("bandwidth", BANDWIDTH)
    bw.add(f"gdx: send/recv, {depth} in flight", rows, "send_gb_per_s")
    bw.add("gdx: sendv of 16 pieces", rows, "sendv_gb_per_s")
    bw.add(f"gdx: one-sided write, {depth} in flight", rows, "write_gb_per_s")
    bw.add(f"gdx: one-sided read, {depth} in flight", rows, "read_gb_per_s")
    perftest_peer(bw, d, "ib_write_bw")
    perftest_peer(bw, d, "ib_read_bw")
    iperf3_peer(bw, d, "toward the server's host")
    lat = Chart("latency", "latency (µs)")
    lat.add("gdx: send/recv, one way (half a round trip)", rows, "send_us")
    lat.add("gdx: blocking write, until the data is placed", rows, "write_us")
    lat.add("gdx: blocking read", rows, "read_us")
    lat.add("gdx's TCP transport alone, one way", rows, "transport_us")
    lat.add("raw TCP ping-pong, one way (peer)", rows, "raw_tcp_us", peer=True)
    where = d.get("connection") or d.get("transport", "?")
    return f"gdx::p2p::Endpoint over {where}, {d.get('device', 'cpu')} regions, client → server", [bw, lat]


def read_p2p_python(d):
    rows = d["results"]
    bw = Chart("bandwidth", BANDWIDTH)
    bw.add("gdx.p2p: send/recv, posted back to back", rows, "sendrecv_GBps")
    bw.add("gdx.p2p: write_async, in flight together", rows, "write_GBps")
    lat = Chart("latency", "latency (µs)")
    lat.add("gdx.p2p: send/recv, one way (half a round trip)", rows, "sendrecv_latency_us")
    lat.add("gdx.p2p: blocking write, until the data is placed", rows, "write_latency_us")
    where = f"gdx.p2p.Endpoint over {d.get('transport', '?')}, {d.get('device', 'cpu')} memory, client → server"
    return where, [bw, lat]


def read_tcpx(d):
    row = {"bytes": d["bytes"], "mean": d["gb_per_s"], "best": d.get("best_gb_per_s", -1)}
    bw = Chart("bandwidth", BANDWIDTH)
    chunk = d.get("chunk_bytes", 0)
    bw.add(f"gdx: TcpxSession, {size_label(chunk)}-byte posts, mean of {d.get('iters', '?')} transfers", [row], "mean")
    bw.add("gdx: TcpxSession, the best transfer", [row], "best")
    iperf3_peer(bw, d, "toward the server's host")
    shape = f"{d.get('channels', '?')} channels x {d.get('sockets_per_channel', '?')} sockets"
    return f"tcp, {shape}, {d.get('device', 'cpu')} buffers, client → server", [bw]


MOE_OPS = ("dispatch", "combine")  # the whole calls; the halves (-send, -recv) and -graph forms are left out


def read_moe(d):
    rows = [r for r in d["results"] if r.get("op") in MOE_OPS and "dtype" in r]
    charts = []
    for op in MOE_OPS:
        dtypes = list(dict.fromkeys(r["dtype"] for r in rows if r["op"] == op))  # in the order they were measured
        bw = Chart("bandwidth", BANDWIDTH, part=op, tokens=True)
        lat = Chart("latency", "time per call (µs)", part=op, tokens=True)
        for dt in dtypes:
            mine = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            bw.add(f"gdx: {op}, {dt}", mine, "GBps", x="tokens")
            lat.add(f"gdx: {op}, {dt}", mine, "us", x="tokens")
        for dt in dtypes:
            mine = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            bw.add(f"NCCL all_to_all_single, {dt}'s bytes (peer)", mine, "nccl_GBps", peer=True, x="tokens")
            lat.add(f"NCCL all_to_all_single, {dt}'s bytes (peer)", mine, "nccl_all_to_all_us", peer=True, x="tokens")
        bw.notes.append("GB/s: bytes as DeepEP counts them (received rows x hidden x 2 for BF16) / time per call")
        charts += [bw, lat]
    hosts = d.get("hosts", 1)
    where = f"{d.get('ranks', '?')} ranks" + (f" on {hosts} emulated hosts" if hosts > 1 else "")
    return (f"{where}, hidden {d.get('hidden', '?')}, top-{d.get('topk', '?')} of {d.get('experts', '?')} experts",
            charts)


READERS = {"benchmark_local": read_local, "benchmark_remote": read_remote, "benchmark_nvlink": read_nvlink,
           "nvlink": read_nvlink, "benchmark_p2p": read_p2p, "benchmark_tcpx": read_tcpx, "moe": read_moe,
           "moe_python": read_moe, "p2p_python": read_p2p_python}
# What each JSON's "benchmark" is called in a plot's title.
PROGRAMS = {"nvlink": "benchmark_nvlink", "moe": "benchmark_moe", "moe_python": "python -m gdx.bench.ep",
            "p2p_python": "python -m gdx.bench.p2p"}


# ---- drawing --------------------------------------------------------------------------------------------------------
def size_label(n):
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def size_ticks(xs):
    """Powers of two over the sizes, every 1, 2 or 4 octaves so that about ten are labelled (4K, 1M, 1G)."""
    lo, hi = math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs)))
    step = 1 if hi - lo <= 12 else 2 if hi - lo <= 24 else 4
    return [2**k for k in range(lo - lo % step, hi + 1, step)]


GDX_COLORS = ["#1f5fbf", "#2a9d8f", "#6a4c93", "#0b3d91", "#5aa9e6"]
PEER_COLORS = ["#e4572e", "#f3a712", "#a8201a", "#7f7f7f", "#c77dff"]


def draw(plt, chart, title, base):
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    values = [y for s in chart.lines for y in s.ys] + [r.y for r in chart.refs]
    # Soft-RoCE moves megabytes per second: GB/s would read as 0.01 everywhere.
    scale, ylabel = (1e3, chart.ylabel.replace("GB/s, 10⁹", "MB/s, 10⁶")) \
        if chart.quantity == "bandwidth" and max(values) < 1 else (1, chart.ylabel)
    fig, ax = plt.subplots(figsize=(9, 5.6))
    colors = {False: itertools.cycle(GDX_COLORS), True: itertools.cycle(PEER_COLORS)}
    for s in chart.lines:
        style = "none" if len(s.xs) == 1 else "--" if s.peer else "-"
        ax.plot(s.xs, [y * scale for y in s.ys], label=s.label, color=next(colors[s.peer]), linestyle=style,
                marker="s" if s.peer else "o", markersize=5, linewidth=1.6 if s.peer else 2.2)
    for r in chart.refs:
        ax.axhline(r.y * scale, label=r.label, color=next(colors[r.peer]), linestyle=":" if r.peer else "-.",
                   linewidth=1.8)
    xs = [x for s in chart.lines for x in s.xs]
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)
    ax.xaxis.set_major_locator(FixedLocator(size_ticks(xs)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: str(int(round(v))) if chart.tokens
                                               else size_label(int(round(v)))))
    ax.xaxis.set_minor_locator(NullLocator())
    if max(values) / max(min(v for v in values if v > 0), 1e-12) > 30:  # decades apart: log, else linear from 0
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        ax.set_ylim(bottom=0, top=max(values) * scale * 1.15)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("tokens per rank (log2 scale)" if chart.tokens else "message size (bytes, log2 scale)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    notes = chart.notes + ([] if chart.has_peer() else ["no peer was measured for this quantity in this run"])
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, color="#444444", va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    written = []
    for ext in ("png", "svg"):
        path = f"{base}_{chart.part + '_' if chart.part else ''}{chart.quantity}.{ext}"
        # No date in the SVG's metadata: plots of the same JSON are the same file (docs/plots is checked in).
        fig.savefig(path, dpi=110, metadata={"Date": None} if ext == "svg" else None)
        written.append(path)
    plt.close(fig)
    return written


def plot_file(plt, path, out):
    """The paths written for one JSON file; [] for a format this script does not know."""
    with open(path) as f:
        d = json.load(f)
    name = d.get("benchmark") if isinstance(d, dict) else None
    if name not in READERS:
        print(f"plot.py: skipped {path}: not a JSON of a gdx benchmark ({', '.join(sorted(READERS))})")
        return []
    where, charts = READERS[name](d)
    program = PROGRAMS.get(name, name)
    machine = d.get("machine") or d.get("gpu") or "machine not recorded"
    title = f"{program}: {machine}\n{where}, {d.get('date', 'date not recorded')}"
    base = os.path.join(out, os.path.splitext(os.path.basename(path))[0])
    written = []
    for chart in charts:
        if chart.lines:
            chart.notes += [d["note"]] if d.get("note") else []
            written += draw(plt, chart, title, base)
    return written


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        # Debian's python3-matplotlib belongs to /usr/bin/python3; a python3 first on PATH (pyenv, a venv) lacks it.
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system) \
                and not os.environ.get("GDX_PLOT_REEXEC"):
            os.environ["GDX_PLOT_REEXEC"] = "1"
            os.execv(system, [system] + sys.argv)
        print("plot.py: needs matplotlib: apt-get install python3-matplotlib (or `make plots`, which installs it)",
              file=sys.stderr)
        sys.exit(MISSING_MATPLOTLIB)
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG: searchable, and smaller
    matplotlib.rcParams["svg.hashsalt"] = "gdx"  # stable element ids: the same JSON gives the same SVG
    import matplotlib.pyplot as plt
    return plt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", metavar="FILE.json")
    ap.add_argument("--out", default="plots", metavar="DIR", help="where the PNG and SVG files go (default: plots)")
    ap.add_argument("--check", action="store_true", help="only check that matplotlib is there")
    args = ap.parse_args()
    plt = import_pyplot()
    if args.check:
        return 0
    if not args.files:
        ap.error("no JSON file given")
    os.makedirs(args.out, exist_ok=True)
    failed = False
    for path in args.files:
        try:
            for written in plot_file(plt, path, args.out):
                print(f"plot.py: wrote {written}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"plot.py: {path}: cannot plot it: {type(e).__name__}: {e}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
