# Host time of one low_latency_dispatch / low_latency_combine call from Python (deep_ep is whichever PYTHONPATH
# gives: DeepEP or the one-line gdx shim), DeepEP's shapes (T 128, H 7168, 288 experts, top-8), 2 ranks; and the
# same pair captured in a CUDA graph (time per replay). Scratch, not part of gdx.
import os, socket, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def host_us(f, n=300):
    best = []
    for _ in range(5):
        torch.cuda.synchronize(); dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize(); dist.barrier()
    return sorted(best)[2]


def rank_main(lr, world, port):
    torch.cuda.set_device(lr)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=lr, world_size=world,
                            device_id=torch.device(f"cuda:{lr}"))
    torch.set_default_dtype(torch.bfloat16)  # as DeepEP's tests/utils.py init_dist does
    torch.set_default_device("cuda")
    import deep_ep
    T, H, E, K = 128, 7168, 288, 8
    group = dist.new_group(list(range(world)))
    nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, world, E)
    buf = deep_ep.Buffer(group, 0, nbytes, low_latency_mode=True, num_qps_per_rank=E // world, explicitly_destroy=True)
    x = torch.randn((T, H), dtype=torch.bfloat16, device="cuda")
    idx = torch.randn((T, E), device="cuda").abs().topk(K, dim=-1).indices.to(deep_ep.topk_idx_t)
    w = torch.rand((T, K), dtype=torch.float32, device="cuda")
    L = E // world
    y = torch.randn((L, T * world, H), dtype=torch.bfloat16, device="cuda")
    stats = torch.zeros(L, dtype=torch.int32, device="cuda")
    _, _, h, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)
    buf.low_latency_combine(y, idx, w, h)
    torch.cuda.synchronize()
    res = {}
    res["low_latency_dispatch (FP8)"] = host_us(lambda: buf.low_latency_dispatch(x, idx, T, E, use_fp8=True))
    res["low_latency_dispatch (FP8, cumulative stats)"] = host_us(
        lambda: buf.low_latency_dispatch(x, idx, T, E, cumulative_local_expert_recv_stats=stats, use_fp8=True))
    res["low_latency_combine"] = host_us(lambda: buf.low_latency_combine(y, idx, w, h))

    def pair():
        _, _, hh, _, _ = buf.low_latency_dispatch(x, idx, T, E, use_fp8=True)
        buf.low_latency_combine(y, idx, w, hh)

    res["dispatch + combine"] = host_us(pair)
    # The same pair in a CUDA graph: GPU time per replay.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            pair()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize(); dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pair()
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize(); dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(200):
        g.replay()
    b.record(); torch.cuda.synchronize()
    res["graph replay (dispatch + combine), GPU us"] = a.elapsed_time(b) / 200 * 1e3
    dist.barrier()
    if lr == 0:
        for k, v in res.items():
            print(f"[host] {k:48s} {v:8.2f} us", flush=True)
    del g
    buf.destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    mp.spawn(rank_main, args=(2, port), nprocs=2)
