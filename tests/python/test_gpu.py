"""GPU tests (label gpu): torch CUDA tensors as windows between two ranks (two GPUs, or one serving both), the
device channel's bytes, and gdx.ep.Buffer checked the way DeepEP's intranode test checks its Buffer: the layout
against a Python recomputation, rank-valued tokens, counts per rank and expert, combine against the reference sum.
Skipped without torch, CUDA or a build of gdx with CUDA. Run: ctest -L gpu -R python (or make test-gpu)."""

import pytest

import gdx
from conftest import free_port, run_ranks

pytestmark = pytest.mark.gpu


def _cuda_or_skip():
    torch = pytest.importorskip("torch", reason="torch is not installed for this interpreter")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    return torch


def _set_device(rank):
    import torch
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return torch


def _cuda_windows(rank, world):
    torch = _set_device(rank)
    with gdx.Context() as ctx:
        g = torch.Generator(device="cuda").manual_seed(500 + rank)
        send = torch.randint(0, 256, (1 << 22,), dtype=torch.uint8, device="cuda", generator=g)
        recv = torch.full((1 << 22,), 0xEE, dtype=torch.uint8, device="cuda")
        ws, wr = ctx.register_window(send), ctx.register_window(recv)
        assert ws.kind == "cuda"
        ch = ctx.channel(1 - rank)
        torch.cuda.synchronize()
        ch.put_with_signal(wr, 0, ws, signal=0)
        ctx.wait(0, 1, timeout=60)
        ch.flush()
        g = torch.Generator(device="cuda").manual_seed(500 + 1 - rank)
        expected = torch.randint(0, 256, (1 << 22,), dtype=torch.uint8, device="cuda", generator=g)
        assert torch.equal(recv.cpu(), expected.cpu()), f"rank {rank}: received bytes differ"

        handle = ctx.device_channel(1 - rank)
        assert len(handle) == gdx.DEVICE_CHANNEL_SIZE
        off, size = gdx.DEVICE_CHANNEL_LAYOUT["peer"]
        assert int.from_bytes(handle[off:off + size], "little") == 1 - rank
        off, size = gdx.DEVICE_CHANNEL_LAYOUT["numSignals"]
        assert int.from_bytes(handle[off:off + size], "little") == ctx.num_signals
        ctx.barrier()


def test_cuda_tensor_windows_and_device_channel():
    _cuda_or_skip()
    run_ranks(2, _cuda_windows)


# ---- gdx.ep.Buffer -----------------------------------------------------------------------------------------------

NUM_TOKENS, HIDDEN, NUM_EXPERTS, NUM_TOPK = 512, 2048, 16, 4


def _routing(torch, rank, num_tokens):
    g = torch.Generator().manual_seed(900 + rank)
    scores = torch.rand((num_tokens, NUM_EXPERTS), generator=g)
    topk_idx = torch.topk(scores, NUM_TOPK, dim=-1).indices.to(torch.int64)
    topk_idx[torch.rand((num_tokens, NUM_TOPK), generator=g) < 0.1] = -1  # some slots select no expert
    weights = torch.rand((num_tokens, NUM_TOPK), generator=g, dtype=torch.float32)
    return topk_idx, weights


def _ep_buffer(rank, world, store_port):
    torch = _set_device(rank)
    import torch.distributed as dist
    from gdx.ep import Buffer, EventOverlap
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{store_port}", rank=rank, world_size=world)
    try:
        local = NUM_EXPERTS // world
        cfg = Buffer.get_dispatch_config(world)
        buf = Buffer(dist.group.WORLD, cfg.get_nvl_buffer_size_hint(HIDDEN * 2, world), 0)
        with pytest.raises(gdx.InvalidArgumentError, match="low_latency_mode=True"):
            buf.low_latency_dispatch(None, None, 128, NUM_EXPERTS)

        all_idx, all_w = zip(*[_routing(torch, r, NUM_TOKENS) for r in range(world)])
        topk_idx, topk_w = all_idx[rank].cuda(), all_w[rank].cuda()
        x = torch.ones((NUM_TOKENS, HIDDEN), dtype=torch.bfloat16, device="cuda") * rank

        # Layout against a Python recomputation.
        per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, NUM_EXPERTS)
        idx = all_idx[rank]
        ref_in_rank = torch.stack([((idx >= r * local) & (idx < (r + 1) * local)).any(1) for r in range(world)], 1)
        assert per_rdma is None
        assert torch.equal(in_rank.cpu(), ref_in_rank)
        assert torch.equal(per_rank.cpu(), ref_in_rank.sum(0).to(torch.int32))
        assert torch.equal(per_expert.cpu(), torch.stack([(idx == e).sum() for e in range(NUM_EXPERTS)]).int())

        recv_x, recv_idx, recv_w, counts, handle, event = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            topk_idx=topk_idx, topk_weights=topk_w, async_finish=True)
        event.current_stream_wait()
        torch.cuda.synchronize()

        # Reference: rows by source rank, each source's tokens in order, those with an expert on this rank.
        lo, hi = rank * local, (rank + 1) * local
        src_rank, src_tok, ref_idx, ref_w = [], [], [], []
        for s in range(world):
            mine = (all_idx[s] >= lo) & (all_idx[s] < hi)
            for t in torch.nonzero(mine.any(1)).flatten().tolist():
                src_rank.append(s)
                src_tok.append(t)
                ref_idx.append(torch.where(mine[t], all_idx[s][t] - lo, torch.full_like(all_idx[s][t], -1)))
                ref_w.append(torch.where(mine[t], all_w[s][t], torch.zeros_like(all_w[s][t])))
        n = len(src_rank)
        assert recv_x.shape == (n, HIDDEN) and handle.num_recv_tokens == n
        assert torch.equal(recv_x.float().cpu(), torch.tensor(src_rank).float()[:, None].expand(n, HIDDEN))
        assert torch.equal(handle.recv_src_idx.cpu(), torch.tensor(src_tok, dtype=torch.int32))
        assert torch.equal(recv_idx.cpu(), torch.stack(ref_idx))
        assert torch.equal(recv_w.cpu(), torch.stack(ref_w))
        assert counts == [int((torch.stack(ref_idx) == e).sum()) for e in range(local)]

        # Cached dispatch: the same rows again.
        again, none_idx, none_w, none_counts, none_handle, _ = buf.dispatch(x, handle=handle)
        assert none_idx is None and none_handle is None
        assert torch.equal(again.cpu(), recv_x.cpu())
        _cached_forms(torch, buf, rank, world, handle)

        # Combine: every token comes back summed over the ranks it went to (DeepEP's check).
        combined, combined_w, _ = buf.combine(recv_x, handle, topk_weights=recv_w)
        expected = x.float() * in_rank.sum(1, keepdim=True).float()
        assert torch.equal(combined.float().cpu(), expected.cpu())
        assert torch.allclose(combined_w.cpu(), topk_w.cpu() * (topk_idx.cpu() >= 0), atol=1e-6)

        # num_worst_tokens: no host synchronisation; the first rows are the same, the others select no expert.
        worst = NUM_TOKENS * world
        wx, widx, _, wcounts, whandle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=topk_w,
                                                        num_tokens_per_expert=per_expert, num_worst_tokens=worst)
        assert wx.shape[0] == worst and wcounts == [] and whandle.num_recv_tokens is None
        assert torch.equal(wx[:n].cpu(), recv_x.cpu())
        assert torch.equal(widx[:n].cpu(), recv_idx.cpu()) and bool((widx[n:] == -1).all())
        assert isinstance(EventOverlap(), EventOverlap)

        # DeepEP's handle[0]: rank_prefix_matrix, [i][j] = tokens ranks 0..i send to rank j.
        counts = torch.tensor([[int(((all_idx[s] >= r * local) & (all_idx[s] < (r + 1) * local)).any(1).sum())
                                for r in range(world)] for s in range(world)], dtype=torch.int32)
        assert torch.equal(handle[0].cpu(), counts.cumsum(0, dtype=torch.int32))
        assert handle[3] is handle.recv_src_idx and handle[4] is in_rank
        with pytest.raises(NotImplementedError, match="channel_prefix_matrix"):
            handle[1]
        _deepep_modes(torch, buf, rank, world, topk_idx, topk_w, per_rank, in_rank, per_expert)
        _without_topk(torch, buf, rank, world, x, recv_x, handle, in_rank, per_expert)
        _buffer_accessors(torch, buf)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _without_topk(torch, buf, rank, world, x, recv_topk_x, topk_handle, in_rank, per_expert):
    """DeepEP's dispatch without top-k: routed by is_token_in_rank alone, each local expert's count the sum of the
    sources' num_tokens_per_expert; the same rows as the top-k form of the same routing, then its cached form and a
    combine without weights."""
    import torch.distributed as dist
    g = torch.Generator(device="cuda").manual_seed(4100 + rank)
    x_rand = torch.randn(x.shape, dtype=torch.bfloat16, device="cuda", generator=g)
    recv, recv_idx, recv_w, counts, handle, _ = buf.dispatch(x, num_tokens_per_rank=in_rank.sum(0).int(),
                                                             is_token_in_rank=in_rank,
                                                             num_tokens_per_expert=per_expert)
    assert recv_idx is None and recv_w is None
    assert torch.equal(recv.cpu(), recv_topk_x.cpu()), f"rank {rank}: rows differ from the top-k form"
    assert torch.equal(handle[0].cpu(), topk_handle[0].cpu())
    assert torch.equal(handle.recv_src_idx.cpu(), topk_handle.recv_src_idx.cpu())
    everyone = [None] * world
    dist.all_gather_object(everyone, per_expert.cpu())
    local = per_expert.numel() // world
    assert counts == torch.stack(everyone).sum(0)[rank * local:(rank + 1) * local].tolist()
    cached, *_ = buf.dispatch(x_rand, handle=handle)
    combined, combined_w, _ = buf.combine(cached, handle)
    assert combined_w is None
    fanout = in_rank.sum(1, keepdim=True).float()
    diff = _calc_diff(combined.float() / fanout.clamp(min=1), x_rand.float() * (fanout > 0))
    assert diff < 5e-6, f"rank {rank}: combine without weights, calc_diff {diff}"
    with pytest.raises(gdx.InvalidArgumentError, match="topk_idx or is_token_in_rank"):
        buf.dispatch(x, num_tokens_per_expert=per_expert)


def _buffer_accessors(torch, buf):
    """DeepEP's accessors: the local buffer as a tensor (the window's memory, sliced and viewed), the comm stream
    (nothing of gdx runs on it), is_sm90_compiled."""
    from gdx.ep import Buffer
    assert Buffer.is_sm90_compiled() is True
    whole = buf.get_local_buffer_tensor(torch.int32)
    assert whole.is_cuda and whole.numel() == buf.num_nvl_bytes // 4
    part = buf.get_local_buffer_tensor(torch.bfloat16, torch.Size((4, 8)), offset=16)
    assert part.shape == (4, 8) and part.data_ptr() == whole.data_ptr() + 32
    with pytest.raises(gdx.InvalidArgumentError, match="more than"):
        buf.get_local_buffer_tensor(torch.uint8, torch.Size((buf.num_nvl_bytes + 1,)))
    stream = buf.get_comm_stream()
    assert isinstance(stream, torch.cuda.Stream) and buf.get_comm_stream() is stream
    torch.cuda.current_stream().wait_stream(stream)


def _deepep_modes(torch, buf, rank, world, topk_idx, topk_w, per_rank, in_rank, per_expert):
    """DeepEP's intranode loop: previous_event and async_finish on and off, random BF16, rank-valued BF16 and FP8
    (rank-valued bytes with scales); received rows per source checked through handle[0] as DeepEP's check_data
    does, combine against the reference sum."""
    from gdx.ep import Buffer
    g = torch.Generator(device="cuda").manual_seed(77 + rank)
    x_rank = torch.ones((NUM_TOKENS, HIDDEN), dtype=torch.bfloat16, device="cuda") * rank
    x_rand = torch.randn((NUM_TOKENS, HIDDEN), dtype=torch.bfloat16, device="cuda", generator=g)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    x_fp8 = None
    if fp8 is not None:  # rank r as e4m3 (exact for small integers), scales 1 .. 2 so they are checked too
        scales = torch.rand((NUM_TOKENS, HIDDEN // 128), device="cuda", generator=g) + 1
        x_fp8 = (x_rank.to(fp8), scales)
    fanout = in_rank.sum(1, keepdim=True).float()
    for previous in (False, True):
        for async_finish in (False, True):
            for current in (c for c in (x_rand, x_rank, x_fp8) if c is not None):
                args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                            topk_idx=topk_idx, topk_weights=topk_w, async_finish=async_finish)
                if previous:
                    args["previous_event"] = Buffer.capture()
                recv, recv_idx, recv_w, counts, handle, event = buf.dispatch(current, **args)
                if async_finish:
                    event.current_stream_wait()
                prefix = handle[0].cpu()
                rows = int(prefix[world - 1][rank])
                recv_x = recv[0] if isinstance(recv, tuple) else recv
                assert recv_x.shape[0] == rows == handle.num_recv_tokens
                assert counts == [int((recv_idx == e).sum()) for e in range(NUM_EXPERTS // world)]
                if current is not x_rand:  # DeepEP's check_data: rows of source i hold i
                    got = recv_x.float().cpu()
                    start = 0
                    for i in range(world):
                        end = int(prefix[i][rank])
                        assert bool((got[start:end] == i).all()), f"rank {rank}: rows from rank {i} differ"
                        start = end
                if isinstance(recv, tuple):
                    assert torch.equal(recv[1].cpu(), _rows_of(torch, current[1], handle, prefix, rank, world))
                    continue  # combine is BF16 only
                cargs = dict(topk_weights=recv_w, async_finish=async_finish)
                if previous:
                    cargs["previous_event"] = Buffer.capture()
                combined, combined_w, event = buf.combine(recv_x, handle, **cargs)
                if async_finish:
                    event.current_stream_wait()
                # Sums in f32 of BF16 rows: rank-valued rows are exact, random ones within DeepEP's calc_diff bound.
                check = (combined.float() / fanout.clamp(min=1)).double() + 1  # + 1: DeepEP's calc_diff
                ref = (current.float() * (fanout > 0)).double() + 1
                diff = 1 - 2 * (check * ref).sum() / (check * check + ref * ref).sum()
                assert float(diff) < 5e-6, f"rank {rank}: combine differs from the reference (calc_diff {diff})"


def _cached_forms(torch, buf, rank, world, handle):
    """The cached dispatch (handle given) with random BF16 rows from a non-contiguous tensor and with random FP8 rows
    and scales: every received row is its source token's, found through recv_src_idx and handle[0]; and its checks
    (wrong dtype, scales of the wrong shape, top-k with a handle, not a handle), made before anything is sent."""
    g = torch.Generator(device="cuda").manual_seed(2100 + rank)
    prefix = handle[0].cpu()
    wide = torch.randn((NUM_TOKENS, 2 * HIDDEN), dtype=torch.bfloat16, device="cuda", generator=g)
    x = wide[:, ::2]  # not contiguous: a contiguous copy is what is sent
    recv, *rest, event = buf.dispatch(x, handle=handle, async_finish=True)
    event.current_stream_wait()
    assert rest == [None, None, None, None]
    assert torch.equal(recv.cpu(), _rows_of(torch, x.contiguous(), handle, prefix, rank, world))
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        x8 = torch.randn((NUM_TOKENS, HIDDEN), device="cuda", generator=g).to(fp8)
        scales = torch.rand((NUM_TOKENS, HIDDEN // 128), device="cuda", generator=g) + 0.5
        (recv8, recv_scales), *_ = buf.dispatch((x8, scales), handle=handle)
        assert recv8.dtype == fp8 and recv_scales.dtype == torch.float32
        assert torch.equal(recv8.view(torch.uint8).cpu(),
                           _rows_of(torch, x8.view(torch.uint8), handle, prefix, rank, world))
        assert torch.equal(recv_scales.cpu(), _rows_of(torch, scales, handle, prefix, rank, world))
        with pytest.raises(gdx.InvalidArgumentError, match="x_scales"):
            buf.dispatch((x8, scales[:, 1:]), handle=handle)
        with pytest.raises(gdx.InvalidArgumentError, match="x_scales"):
            buf.dispatch((x8, scales.double()), handle=handle)
    with pytest.raises(gdx.InvalidArgumentError, match="bfloat16"):
        buf.dispatch(x.float(), handle=handle)
    with pytest.raises(gdx.InvalidArgumentError, match="takes no topk_idx"):
        buf.dispatch(x, handle=handle, topk_idx=torch.zeros((NUM_TOKENS, 1), dtype=torch.int64, device="cuda"))
    with pytest.raises(gdx.InvalidArgumentError, match="DispatchHandle"):
        buf.dispatch(x, handle=(handle[0],))


def _rows_of(torch, per_token, handle, prefix, rank, world):
    """The received rows `per_token` ([N, ...], each rank's own) must give: every source's rows of the tokens it
    sent here, in order, found through recv_src_idx and handle[0]."""
    import torch.distributed as dist
    gathered = [None] * world
    dist.all_gather_object(gathered, per_token.cpu())
    src_idx = handle.recv_src_idx.cpu().long()
    out, start = [], 0
    for i in range(world):
        end = int(prefix[i][rank])
        out.append(gathered[i][src_idx[start:end]])
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("path", ["torch extension", "pointers"])
def test_ep_buffer_like_deepep_intranode_test(path):
    _cuda_or_skip()
    if not gdx._gdx.ep_available():
        pytest.skip("gdx was built without CUDA")
    if path == "torch extension":
        pytest.importorskip("gdx._gdx_torch", reason="gdx was built without its torch extension")
    run_ranks(2, _ep_buffer, free_port(), env={"GDX_EP_TORCH_EXTENSION": "1" if path != "pointers" else "0"})


# ---- gdx.ep.Buffer, low-latency mode -------------------------------------------------------------------------------

LL_TOKENS, LL_HIDDEN, LL_EXPERTS, LL_TOPK = 64, 2048, 16, 4


def _ll_inputs(torch, rank):
    """DeepEP's low-latency test inputs: every element of token t is the rank, except the last 128, which are t (one
    FP8 scale block each, so both survive FP8 exactly); top-k over random scores with some slots -1."""
    n = LL_TOKENS - 5 * rank  # the ranks send different numbers of tokens
    g = torch.Generator().manual_seed(1300 + rank)
    x = torch.full((n, LL_HIDDEN), float(rank), dtype=torch.bfloat16)
    x[:, -128:] = torch.arange(n, dtype=torch.bfloat16)[:, None]
    topk_idx = torch.topk(torch.rand((n, LL_EXPERTS), generator=g), LL_TOPK, dim=-1).indices.to(torch.int64)
    topk_idx[torch.rand((n, LL_TOPK), generator=g) < 0.15] = -1
    weights = torch.rand((n, LL_TOPK), generator=g, dtype=torch.float32)
    return x.cuda(), topk_idx.cuda(), weights.cuda()


def _check_ll_dispatch(torch, rank, world, recv, recv_count, handle, all_idx, use_fp8, what):
    local = LL_EXPERTS // world
    recv_x, scales = recv if use_fp8 else (recv, None)
    # FP8 read back as DeepEP's per_token_cast_back does: times the scale, rounded to BF16.
    values = (recv_x.float() * scales.repeat_interleave(128, dim=2)).to(torch.bfloat16).float() if use_fp8 else \
        recv_x.float()
    values, count = values.cpu(), recv_count.cpu()
    src_info, layout = handle[0].cpu(), handle[1].cpu()
    assert handle[2:] == (LL_TOKENS, LL_HIDDEN, LL_EXPERTS), what
    for j in range(local):
        expert = rank * local + j
        first = 0
        for s in range(world):
            want = torch.nonzero((all_idx[s] == expert).any(1)).flatten()
            begin, rows = int(layout[j][s]) >> 32, int(layout[j][s]) & 0xFFFFFFFF
            assert (begin, rows) == (first, len(want)), f"{what}: expert {j}, source {s}: range"
            got = src_info[j][begin:begin + rows].long()
            assert torch.equal(got.sort().values, want), f"{what}: expert {j}, source {s}: tokens"
            block = values[j][begin:begin + rows]
            assert bool((block[:, :-128] == s).all()), f"{what}: expert {j}: rows from rank {s} differ"
            assert torch.equal(block[:, -1], got.float()), f"{what}: expert {j}: token ids from rank {s}"
            first += rows
        assert int(count[j]) == first, f"{what}: count of expert {j}"
    return values


def _ll_combine_reference(torch, x, topk_idx, weights):
    return x.float() * weights.masked_fill(topk_idx < 0, 0).sum(1, keepdim=True)


def _calc_diff(a, b):
    a, b = a.double() + 1, b.double() + 1  # + 1: DeepEP's calc_diff
    return float(1 - 2 * (a * b).sum() / (a * a + b * b).sum())


def _ll_deepep_extras(torch, buf, rank, world, x, topk_idx, weights, all_idx, reference):
    """DeepEP's low-latency options: UE8M0-packed and float scales in DeepEP's layout, wait-cost stats, zero-copy
    combine, use_logfmt, the mask calls, and one profiler line per kernel name."""
    local = LL_EXPERTS // world
    (qx, fscales), count, handle, _, _ = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=True,
                                                                   round_scale=True)
    (ux, uscales), ucount, uhandle, _, _ = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS,
                                                                     use_fp8=True, round_scale=True, use_ue8m0=True)
    rows = LL_TOKENS * world
    # DeepEP's layout: [L, rows, groups] viewed over memory [L, groups, rows] (column-major in the last two).
    assert fscales.shape == (local, rows, LL_HIDDEN // 128) and fscales.stride() == (rows * LL_HIDDEN // 128, 1, rows)
    assert uscales.shape == (local, rows, LL_HIDDEN // 512) and uscales.stride() == (rows * LL_HIDDEN // 512, 1, rows)
    assert uscales.dtype == torch.int32 and torch.equal(ucount.cpu(), count.cpu())
    for j in range(local):
        n = int(count[j])
        # The rows of one expert arrive in no fixed order: both calls' rows are put in (source, token, slot) order.
        q, u = _ll_row_order(handle, j, n, world), _ll_row_order(uhandle, j, n, world)
        assert torch.equal(ux[j, u].view(torch.uint8).cpu(), qx[j, q].view(torch.uint8).cpu()), f"expert {j}: fp8"
        # Each int32 holds four exponents: byte b of group g is block 4g + b; 2^(e - 127) is the float scale.
        exps = uscales[j, u].contiguous().view(torch.uint8).long().cpu()
        assert torch.equal((exps << 23).int().view(torch.float32), fscales[j, q].cpu()), f"expert {j}: ue8m0"
        assert bool((torch.log2(fscales[j, :n].cpu()).frac() == 0).all()), f"expert {j}: round_scale"
    with pytest.raises(gdx.InvalidArgumentError, match="round_scale"):
        buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=True, use_ue8m0=True)

    # Wait-cost stats: cycles per source rank, added up over calls.
    wait_d = torch.zeros(world, dtype=torch.int64, device="cuda")
    wait_c = torch.zeros(world, dtype=torch.int64, device="cuda")
    recv, count, handle, _, _ = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=False,
                                                         dispatch_wait_recv_cost_stats=wait_d)
    combined, _, _ = buf.low_latency_combine(recv, topk_idx, weights, handle, combine_wait_recv_cost_stats=wait_c)
    first = (wait_d.clone(), wait_c.clone())
    buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=False, dispatch_wait_recv_cost_stats=wait_d)
    torch.cuda.synchronize()
    for name, now, before in (("dispatch", wait_d, first[0]), ("combine", wait_c, first[1])):
        assert bool((before >= 0).all()) and int(before.sum()) > 0, f"rank {rank}: {name} wait stats {before}"
    assert bool((wait_d >= first[0]).all()) and int(wait_d.sum()) > int(first[0].sum()), "stats are cumulative"
    with pytest.raises(gdx.InvalidArgumentError, match="int64"):
        buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, dispatch_wait_recv_cost_stats=wait_d.int())

    # Zero-copy combine: the rows come from the buffer get_next_low_latency_combine_buffer hands out; x is not read.
    zero = buf.get_next_low_latency_combine_buffer(handle)
    assert zero.shape == recv.shape and zero.dtype == torch.bfloat16
    zero.copy_(recv)
    zc, _, _ = buf.low_latency_combine(torch.zeros_like(recv), topk_idx, weights, handle, zero_copy=True)
    assert torch.equal(zc.cpu(), combined.cpu()), f"rank {rank}: zero-copy combine differs"
    # use_logfmt: accepted, the rows go as BF16 (exact).
    lf, _, _ = buf.low_latency_combine(recv, topk_idx, weights, handle, use_logfmt=True)
    assert torch.equal(lf.cpu(), combined.cpu())
    assert _calc_diff(combined.float(), reference) < 1e-5

    # The mask calls (stream-ordered): none masked, the next rank masked (a rank cannot mask itself), cleaned.
    status = torch.full((world,), 7, dtype=torch.int32, device="cuda")
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    other = (rank + 1) % world
    buf.low_latency_update_mask_buffer(other, True)
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [int(r == other) for r in range(world)]
    buf.low_latency_clean_mask_buffer()
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    with pytest.raises(gdx.InvalidArgumentError, match="outside"):
        buf.low_latency_update_mask_buffer(world, True)
    import torch.distributed as dist
    dist.barrier()
    _ll_profiler_names(torch, buf, x, topk_idx, weights, torch.zeros_like(recv))


def _ll_row_order(handle, j, n, world):
    """The rows [0, n) of local expert j sorted by (source rank, source token, top-k slot)."""
    import torch
    layout, tokens, slots = handle.layout_range[j].cpu(), handle.src_info[j, :n].cpu(), handle.src_slot[j, :n].cpu()
    source = torch.empty(n, dtype=torch.int64)
    for s in range(world):
        begin, rows = int(layout[s]) >> 32, int(layout[s]) & 0xFFFFFFFF
        source[begin:begin + rows] = s
    key = (source * LL_TOKENS + tokens.long()) * LL_TOPK + slots.long()
    return torch.argsort(key).cuda()


def _ll_profiler_names(torch, buf, x, topk_idx, weights, expert_out):
    """What DeepEP's bench_kineto needs: one profiler-table line whose name contains 'dispatch' and one 'combine',
    and the trace's '::dispatch' / '::combine' kernels one per call (two with a receive hook)."""
    from torch.profiler import ProfilerActivity, profile

    def calls(with_hook):
        recv, _, handle, _, hook = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=True,
                                                            return_recv_hook=with_hook)
        if with_hook:
            hook()
        _, _, chook = buf.low_latency_combine(expert_out, topk_idx, weights, handle, return_recv_hook=with_hook)
        if with_hook:
            chook()

    for with_hook in (False, True):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                calls(with_hook)
            torch.cuda.synchronize()
        lines = prof.key_averages().table(sort_by="cuda_time_total", max_name_column_width=100).split("\n")
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        for name in ("dispatch", "combine"):
            assert sum(name in line for line in lines) == 1, (name, [ln for ln in lines if name in ln])
            launches = [e for e in kernels if f"::{name}" in e.name]
            assert len(launches) == 3 * (2 if with_hook else 1), (name, with_hook, [e.name for e in launches])


def _ep_low_latency(rank, world, store_port, path):
    torch = _set_device(rank)
    import torch.distributed as dist
    from gdx.ep import Buffer
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{store_port}", rank=rank, world_size=world)
    try:
        hint = Buffer.get_low_latency_rdma_size_hint(LL_TOKENS, LL_HIDDEN, world, LL_EXPERTS)
        assert hint > 0
        buf = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=LL_EXPERTS // world)
        assert buf._low_latency.path.startswith(path), (buf._low_latency.path, path)
        with pytest.raises(gdx.InvalidArgumentError, match="low-latency mode only"):
            buf.dispatch(torch.zeros((1, LL_HIDDEN), dtype=torch.bfloat16, device="cuda"))
        x, topk_idx, weights = _ll_inputs(torch, rank)
        gathered = [None] * world
        dist.all_gather_object(gathered, topk_idx.cpu())
        all_idx = gathered
        reference = _ll_combine_reference(torch, x, topk_idx, weights)
        stats = torch.zeros(LL_EXPERTS // world, dtype=torch.int32, device="cuda")
        calls = 0
        for use_fp8 in (False, True):
            for with_hook in (False, True):
                what = f"rank {rank}, {'fp8' if use_fp8 else 'bf16'}{', hook' if with_hook else ''}"
                recv, count, handle, event, hook = buf.low_latency_dispatch(
                    x, topk_idx, LL_TOKENS, LL_EXPERTS, cumulative_local_expert_recv_stats=stats,
                    use_fp8=use_fp8, return_recv_hook=with_hook)
                assert (hook is not None) == with_hook
                if with_hook:
                    hook()
                calls += 1
                values = _check_ll_dispatch(torch, rank, world, recv, count, handle, all_idx, use_fp8, what)
                # The experts' outputs: the received rows themselves (dequantised for FP8), as DeepEP's test.
                expert_out = values.to(torch.bfloat16).cuda()
                combined, _, chook = buf.low_latency_combine(expert_out, topk_idx, weights, handle,
                                                             return_recv_hook=with_hook)
                if with_hook:
                    chook()
                diff = _calc_diff(combined.float(), reference)
                assert diff < (9e-4 if use_fp8 else 1e-5), f"{what}: combine calc_diff {diff}"
                # Into a caller's tensor; one that is not contiguous is refused (it could not be written in place).
                out = torch.full_like(combined, 7)
                again, _, _ = buf.low_latency_combine(expert_out, topk_idx, weights, handle, out=out)
                assert again is out and torch.equal(out.cpu(), combined.cpu()), f"{what}: combine into out"
                strided = torch.empty((LL_HIDDEN, combined.shape[0]), dtype=torch.bfloat16, device="cuda").t()
                with pytest.raises(gdx.InvalidArgumentError, match="contiguous"):
                    buf.low_latency_combine(expert_out, topk_idx, weights, handle, out=strided)
        assert torch.equal(stats.cpu(), count.cpu() * calls), f"rank {rank}: cumulative stats"

        # Two dispatches in flight through hooks (two micro-batches), then both hooks in order.
        ra, ca, ha, _, hook_a = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=False,
                                                         return_recv_hook=True)
        rb, cb, hb, _, hook_b = buf.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=False,
                                                         return_recv_hook=True)
        hook_a()
        hook_b()
        for recv, count, handle in ((ra, ca, ha), (rb, cb, hb)):
            _check_ll_dispatch(torch, rank, world, recv, count, handle, all_idx, False, f"rank {rank}, in flight")

        # A CUDA graph of dispatch + combine (warmed up first, as graphs are), replayed: the right sums every time.
        del ra, rb, ha, hb, handle, recv, hook_a, hook_b
        static_x = x.clone()

        def step():
            recv_s, _, handle_s, _, _ = buf.low_latency_dispatch(static_x, topk_idx, LL_TOKENS, LL_EXPERTS,
                                                                 use_fp8=False)
            return buf.low_latency_combine(recv_s, topk_idx, weights, handle_s)[0]

        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            combined_g = step()
        for i in range(4):
            static_x.copy_(x * 2 ** i)  # powers of two: exact in BF16
            graph.replay()
            torch.cuda.synchronize()
            diff = _calc_diff(combined_g.float(), reference * 2 ** i)
            assert diff < 1e-5, f"rank {rank}: graph replay {i}: combine calc_diff {diff}"
        _ll_deepep_extras(torch, buf, rank, world, x, topk_idx, weights, all_idx, reference)
        assert buf.low_latency_masked_ranks() == []
        dist.barrier()
        buf.destroy()
        # A recv hook run after its Buffer was destroyed is refused, not launched on freed memory.
        late = Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True)
        *_, late_hook = late.low_latency_dispatch(x, topk_idx, LL_TOKENS, LL_EXPERTS, use_fp8=False,
                                                  return_recv_hook=True)
        torch.cuda.synchronize()
        dist.barrier()
        late.destroy()
        with pytest.raises(gdx.InvalidArgumentError, match="after destroy"):
            late_hook()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("path", ["torch extension", "pointers"])
def test_ep_low_latency_like_deepep_test(path):
    _cuda_or_skip()
    if not gdx._gdx.ep_available():
        pytest.skip("gdx was built without CUDA")
    if path == "torch extension":
        pytest.importorskip("gdx._gdx_torch", reason="gdx was built without its torch extension")
    run_ranks(2, _ep_low_latency, free_port(), path, env={"GDX_EP_TORCH_EXTENSION": "1" if path != "pointers" else "0"})
