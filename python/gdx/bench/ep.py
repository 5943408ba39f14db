"""``python -m gdx.bench.ep``: gdx.ep.Buffer dispatch and combine through the Python layer, between the GPUs of this
host (one process a GPU), beside torch.distributed.all_to_all_single (NCCL) carrying the same bytes per rank in the
same run.

The cases are benchmarks/benchmark_moe's (C++), so the two can be compared line by line: hidden 7168, top-8 of 256
experts, uniformly random routing, 128 .. 4096 tokens per rank, BF16 and FP8 (with scales); the timed calls are the
cached form (the handle of one full dispatch reused), after warm-up; time is the mean per call over `--iters`
back-to-back calls on the current stream (CUDA events), then averaged over the ranks; GB/s counts bytes as DeepEP's
intranode test does (received rows x hidden x 2 for BF16, x (1 + 4/128) for FP8; combine as BF16); beside it the
host's time to issue one call (the Python layer's per-call work plus the launch: once it reaches the GPU time, the GPU
waits for the host). One line a case, as DeepEP prints them, and a JSON file with --json (the fields of
benchmark_moe's and host_us, "benchmark": "moe_python").
"""

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time

SKIPPED = 77  # exit code when this machine cannot run it (no torch, no CUDA GPU, a build without CUDA)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gdx.bench.ep", description=__doc__.split("\n\n")[0].strip("`"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=0,
                   help="ranks (default: the GPUs, 2 to 8; ranks share GPUs when there are fewer)")
    p.add_argument("--tokens", default="128,256,512,1024,2048,4096", help="tokens per rank, comma-separated")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--iters", type=int, default=20, help="timed calls per case")
    p.add_argument("--sms", type=int, default=24, help="blocks (SMs) of the dispatch and combine kernels")
    p.add_argument("--no-nccl", action="store_true", help="skip all_to_all_single (also skipped when ranks share GPUs)")
    p.add_argument("--json", metavar="FILE", help="where the results go (default: none)")
    a = p.parse_args(argv)
    try:
        a.tokens = [int(t) for t in a.tokens.split(",") if t]
    except ValueError:
        p.error(f"--tokens {a.tokens!r}: not a comma-separated list of integers")
    if not a.tokens or min(a.tokens) <= 0:
        p.error("--tokens: needs at least one positive count")
    if a.experts % max(a.ranks, 1):
        p.error(f"--experts {a.experts} is not a multiple of --ranks {a.ranks}")
    a.iters = max(1, a.iters)
    return a


def _why_not_runnable():
    """Why this machine cannot run the benchmark, or None."""
    from .. import _gdx
    if not _gdx.ep_available():
        return "gdx was built without CUDA (no MoE layer)"
    try:
        import torch
    except ImportError:
        return "torch is not installed for this interpreter"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no CUDA GPU visible to torch"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_us(torch, iters: int, call, rounds: int = 5):
    """(GPU, host) microseconds per call of `iters` back-to-back collective calls on the current stream: the median of
    `rounds` rounds' means (as benchmark_moe's timeMs, so one stalled round does not stand for the case), each after a
    few untimed calls queued right before it that line the ranks' kernels up, so the timed calls do not carry the skew
    with which the ranks left the barrier. The host figure is the time the loop took to issue them (the median round's
    too): where it reaches the GPU figure, the GPU waited for the host (the Python layer's per-call work)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = []
    for _ in range(rounds):
        for _ in range(3):
            call()
        start.record()
        host_start = time.perf_counter()
        for _ in range(iters):
            call()
        host_s = time.perf_counter() - host_start
        end.record()
        end.synchronize()
        results.append((start.elapsed_time(end) / iters * 1e3, host_s / iters * 1e6))
    return sorted(results)[len(results) // 2]


def _inputs(torch, args, rank: int, n: int):
    """Random finite BF16 tokens, their FP8 form with scales, and top-k of distinct experts uniformly at random."""
    g = torch.Generator(device="cuda").manual_seed(17 + rank)
    x = torch.randn((n, args.hidden), dtype=torch.bfloat16, device="cuda", generator=g)
    fp8 = (x.to(torch.float8_e4m3fn), torch.ones((n, args.hidden // 128), dtype=torch.float32, device="cuda"))
    scores = torch.rand((n, args.experts), device="cuda", generator=g)
    topk_idx = scores.topk(args.topk, dim=-1).indices.to(torch.int64)
    topk_weights = torch.full((n, args.topk), 1.0 / args.topk, dtype=torch.float32, device="cuda")
    return x, fp8, topk_idx, topk_weights


def _rank_main(local_rank: int, world: int, port: int, args, results_path: str) -> None:
    import torch
    import torch.distributed as dist

    from ..ep import Buffer, Config

    gpus = torch.cuda.device_count()
    torch.cuda.set_device(local_rank % gpus)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world)
    nccl = dist.new_group(backend="nccl") if not args.no_nccl and gpus >= world else None
    rank = dist.get_rank()
    max_n = max(args.tokens)
    nvl_bytes = max_n * world * (args.hidden * 2 + 128) + (8 << 20)  # as benchmark_moe: all tokens to one rank fit
    buf = Buffer(dist.group.WORLD, nvl_bytes, 0, config=Config(args.sms))
    results = []

    def mean_over_ranks(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return (t / world).tolist()

    def emit(line):
        if rank == 0:
            print(line, flush=True)

    emit(f"[config] ranks={world}, gpu={torch.cuda.get_device_name()}, hidden={args.hidden}, num_topk={args.topk}, "
         f"num_experts={args.experts}, SMs {args.sms}, {args.iters} calls per case")
    x, fp8, topk_idx, topk_w = _inputs(torch, args, rank, args.tokens[0])
    layout = buf.get_dispatch_layout(topk_idx, args.experts)
    _, _, _, _, handle, _ = buf.dispatch(x, num_tokens_per_expert=layout[2], topk_idx=topk_idx, topk_weights=topk_w)
    for _ in range(200):  # warm-up: clocks, first launches, first touch of the peers' mappings
        recv_x, *_ = buf.dispatch(x, handle=handle)
        buf.combine(recv_x, handle)
    torch.cuda.synchronize()

    for n in args.tokens:
        x, fp8, topk_idx, topk_w = _inputs(torch, args, rank, n)
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, args.experts)
        for name, current in (("BF16", x), ("FP8", fp8)):
            # One full dispatch of this dtype; its handle is then reused by the timed calls (the cached form).
            recv, _, _, _, handle, _ = buf.dispatch(current, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                                    num_tokens_per_expert=per_expert, topk_idx=topk_idx,
                                                    topk_weights=topk_w)
            rows = handle.num_recv_tokens
            dispatch_bytes = rows * (args.hidden * 2 if name == "BF16" else args.hidden + args.hidden // 128 * 4)
            cases = [("dispatch", dispatch_bytes, lambda c=current, h=handle: buf.dispatch(c, handle=h))]
            if name == "BF16":
                cases.append(("combine", rows * args.hidden * 2, lambda r=recv, h=handle: buf.combine(r, h)))
            for op, nbytes, call in cases:
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
                dist.barrier()
                us, host_us = _time_us(torch, args.iters, call)
                buf.runtime.check_errors()
                peer_us = _all_to_all_us(torch, dist, nccl, nbytes, args.iters) if nccl is not None else -1.0
                us, nbytes, peer_us, host_us = mean_over_ranks([us, nbytes, peer_us, host_us])
                gbps, peer_gbps = nbytes / us / 1e3, (nbytes / peer_us / 1e3 if peer_us > 0 else -1.0)
                peer = (f"; all_to_all_single (NCCL): {peer_gbps:.2f} GB/s, avg_t: {peer_us:.2f} us"
                        if peer_us > 0 else "")
                emit(f"[{op}] {name}, {n} tokens: {gbps:.2f} GB/s (NVL), avg_t: {us:.2f} us (host {host_us:.2f} us "
                     f"a call){peer}")
                results.append({"tokens": n, "dtype": name.lower(), "op": op, "us": us, "host_us": host_us,
                                "bytes_per_rank": nbytes, "GBps": gbps, "nccl_all_to_all_us": peer_us,
                                "nccl_GBps": peer_gbps})
    dist.barrier()
    if rank == 0:
        with open(results_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f)
    buf.destroy()
    dist.destroy_process_group()


def _all_to_all_us(torch, dist, group, nbytes: float, iters: int) -> float:
    """all_to_all_single of `nbytes` per rank (rounded to a multiple of the ranks) on the NCCL group."""
    world = dist.get_world_size(group)
    n = max(world, int(nbytes) // world * world)
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(5):
        dist.all_to_all_single(b, a, group=group)
    torch.cuda.synchronize()
    dist.barrier()
    return _time_us(torch, iters, lambda: dist.all_to_all_single(b, a, group=group))[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    why = _why_not_runnable()
    if why:
        print(f"gdx.bench.ep: skipped: {why}", file=sys.stderr)
        return SKIPPED
    import torch
    import torch.multiprocessing as mp
    gpus = torch.cuda.device_count()
    world = args.ranks or max(2, min(gpus, 8))
    if args.experts % world:
        print(f"gdx.bench.ep: --experts {args.experts} is not a multiple of the {world} ranks", file=sys.stderr)
        return 2
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with tempfile.TemporaryDirectory(prefix="gdx_bench_ep_") as tmp:
        results_path = os.path.join(tmp, "results.json")
        from gdx.bench.ep import _rank_main  # by its package name, so the spawned ranks can import it
        mp.spawn(_rank_main, args=(world, _free_port(), args, results_path), nprocs=world)
        with open(results_path) as f:
            r = json.load(f)
    if args.json:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        doc = {"benchmark": "moe_python", "gpu": r["gpu"], "machine": f"{world} x {r['gpu']}, {socket.gethostname()}",
               "date": date, "ranks": world, "hidden": args.hidden, "topk": args.topk, "experts": args.experts,
               "sms": args.sms, "iters": args.iters, "results": r["results"],
               "units": "us: mean per call; host_us: the host's time to issue one; GB/s = DeepEP's bytes (received "
                        "rows x hidden x 2, FP8 x (1 + 4/128)) / time; -1: not measured"}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
