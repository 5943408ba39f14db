"""gdx.ep's per-call plumbing that runs without a GPU: the native argument structs made in one call (every field lands
where its name says; the GPU tests then run them through the kernels), and the current-stream lookup, which is
resolved once but read on every call."""

import types

import pytest

import gdx
from gdx.ep import _torch as ep_torch


def _native_ep_or_skip():
    if not gdx._gdx.ep_available():
        pytest.skip("gdx was built without CUDA (no MoE layer)")
    return gdx._gdx.ep


def _fields(obj, names):
    return {n: getattr(obj, n) for n in names}


def test_dispatch_structs_made_in_one_call():
    ep = _native_ep_or_skip()
    i = ep.DispatchInputs(0x1000, 0x2000, 7, 256, ep.DType.float8_e4m3, 0x3000, 0x4000, 8, 64)
    assert _fields(i, ["x", "x_scales", "num_tokens", "hidden", "dtype", "topk_idx", "topk_weights", "num_topk",
                       "num_experts"]) == {"x": 0x1000, "x_scales": 0x2000, "num_tokens": 7, "hidden": 256,
                                           "dtype": ep.DType.float8_e4m3, "topk_idx": 0x3000, "topk_weights": 0x4000,
                                           "num_topk": 8, "num_experts": 64}
    cached = ep.DispatchInputs(0x1000, 0, 7, 256, ep.DType.bfloat16)  # the cached form: no top-k
    assert (cached.topk_idx, cached.topk_weights, cached.num_topk, cached.num_experts) == (0, 0, 0, 0)
    o = ep.DispatchOutputs(9, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70)
    assert _fields(o, ["capacity", "recv_x", "recv_x_scales", "recv_topk_idx", "recv_topk_weights", "recv_src_idx",
                       "num_recv_tokens_per_expert", "num_recv_tokens"]) == {
                           "capacity": 9, "recv_x": 0x10, "recv_x_scales": 0x20, "recv_topk_idx": 0x30,
                           "recv_topk_weights": 0x40, "recv_src_idx": 0x50, "num_recv_tokens_per_expert": 0x60,
                           "num_recv_tokens": 0x70}
    assert (ep.DispatchOutputs(3, 0x10).recv_x_scales, ep.DispatchOutputs().capacity) == (0, 0)


def test_dispatch_inputs_by_rank():
    """The form without top-k (DeepEP's dispatch without topk_idx): routed by is_token_in_rank, counted by
    num_tokens_per_expert; both default to 0 so that the top-k callers stay as they are."""
    ep = _native_ep_or_skip()
    i = ep.DispatchInputs(0x1000, 0, 7, 256, ep.DType.bfloat16, num_experts=64, is_token_in_rank=0x5000,
                          num_tokens_per_expert=0x6000)
    assert _fields(i, ["topk_idx", "topk_weights", "num_topk", "num_experts", "is_token_in_rank",
                       "num_tokens_per_expert"]) == {"topk_idx": 0, "topk_weights": 0, "num_topk": 0, "num_experts": 64,
                                                     "is_token_in_rank": 0x5000, "num_tokens_per_expert": 0x6000}
    topk = ep.DispatchInputs(0x1000, 0x2000, 7, 256, ep.DType.bfloat16, 0x3000, 0x4000, 8, 64)
    assert (topk.is_token_in_rank, topk.num_tokens_per_expert) == (0, 0)
    topk.is_token_in_rank, topk.num_tokens_per_expert = 0x7000, 0x8000
    assert (topk.is_token_in_rank, topk.num_tokens_per_expert) == (0x7000, 0x8000)
    assert (ep.DispatchInputs().is_token_in_rank, ep.DispatchInputs().num_tokens_per_expert) == (0, 0)


def test_low_latency_structs_made_in_one_call():
    ep = _native_ep_or_skip()
    li = ep.LowLatencyDispatchInputs(0x10, 0x20, 5, 4, False, True)
    assert (li.x, li.topk_idx, li.num_tokens, li.num_topk, li.use_fp8, li.round_scale) == (0x10, 0x20, 5, 4, False,
                                                                                          True)
    lo = ep.LowLatencyDispatchOutputs(0x30, 0x40, 0x50)
    assert (lo.recv_x, lo.recv_x_scales, lo.recv_count) == (0x30, 0x40, 0x50)
    lc = ep.LowLatencyCombineInputs(0x60, 0x70, 0x80)
    assert (lc.x, lc.topk_idx, lc.topk_weights) == (0x60, 0x70, 0x80)
    # DeepEP's optional pieces: UE8M0 scales and the receive statistics (0: none).
    assert (li.use_ue8m0, ep.LowLatencyDispatchInputs(0x10, 0x20, 5, 4, True, True, True).use_ue8m0) == (False, True)
    assert (lo.cumulative_local_expert_recv_stats, lo.wait_recv_cost_stats, lc.wait_recv_cost_stats) == (0, 0, 0)
    so = ep.LowLatencyDispatchOutputs(0x30, 0x40, 0x50, 0x90, 0xa0)
    assert (so.cumulative_local_expert_recv_stats, so.wait_recv_cost_stats) == (0x90, 0xa0)
    sc = ep.LowLatencyCombineInputs(0x60, 0x70, 0x80, wait_recv_cost_stats=0xb0)
    assert sc.wait_recv_cost_stats == 0xb0
    assert all(hasattr(ep.LowLatencyBuffer, name) for name in ("update_mask", "query_mask", "clean_mask"))


@pytest.fixture
def fake_torch(monkeypatch):
    """gdx.ep's view of torch replaced by a stand-in whose current device and streams the test sets."""
    state = types.SimpleNamespace(device=0, streams={0: 0x100, 1: 0x200})
    fake = types.SimpleNamespace(_C=types.SimpleNamespace(), cuda=types.SimpleNamespace())
    monkeypatch.setattr(ep_torch, "_module", fake)
    monkeypatch.setattr(ep_torch, "_read_stream", None)
    return fake, state


def test_current_stream_read_through_the_raw_getters_on_every_call(fake_torch):
    fake, state = fake_torch
    fake._C._cuda_getDevice = lambda: state.device
    fake._C._cuda_getCurrentRawStream = lambda device: state.streams[device]
    assert ep_torch.current_stream_handle() == 0x100
    state.device = 1  # the reader is resolved once; the device and its stream are read each time
    assert ep_torch.current_stream_handle() == 0x200
    state.streams[1] = 0x300
    assert ep_torch.current_stream_handle() == 0x300


def test_current_stream_falls_back_to_the_public_call(fake_torch):
    fake, state = fake_torch  # a torch without the raw getters
    fake.cuda.current_stream = lambda: types.SimpleNamespace(cuda_stream=state.streams[state.device])
    assert ep_torch.current_stream_handle() == 0x100
    state.device = 1
    assert ep_torch.current_stream_handle() == 0x200


def test_deep_ep_names_are_exported_by_star_import():
    """DeepEP's module-level names (a one-line deep_ep module re-exports them) come with `from gdx.ep import *`; the
    constructor takes DeepEP's arguments by position and by name."""
    import inspect
    namespace = {}
    torch = pytest.importorskip("torch", reason="topk_idx_t is a torch dtype")
    exec("from gdx.ep import *", namespace)
    for name in ("Buffer", "Config", "EventOverlap", "topk_idx_t"):
        assert name in namespace, name
    assert namespace["topk_idx_t"] is torch.int64
    params = list(inspect.signature(namespace["Buffer"].__init__).parameters)
    assert params[1:13] == ["group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode", "num_qps_per_rank",
                            "allow_nvlink_for_low_latency_mode", "allow_mnnvl", "use_fabric", "explicitly_destroy",
                            "enable_shrink", "comm", "config"]
    for method in ("is_sm90_compiled", "get_comm_stream", "get_local_buffer_tensor", "get_dispatch_layout",
                   "dispatch", "combine", "low_latency_dispatch", "low_latency_combine", "clean_low_latency_buffer",
                   "get_next_low_latency_combine_buffer", "low_latency_update_mask_buffer",
                   "low_latency_query_mask_buffer", "low_latency_clean_mask_buffer", "destroy", "set_num_sms",
                   "capture", "get_low_latency_rdma_size_hint", "get_dispatch_config", "get_combine_config"):
        assert callable(getattr(namespace["Buffer"], method)), method
    ll = inspect.signature(namespace["Buffer"].low_latency_dispatch).parameters
    assert list(ll)[1:] == ["x", "topk_idx", "num_max_dispatch_tokens_per_rank", "num_experts",
                            "cumulative_local_expert_recv_stats", "dispatch_wait_recv_cost_stats", "use_fp8",
                            "round_scale", "use_ue8m0", "async_finish", "return_recv_hook"]
    lc = inspect.signature(namespace["Buffer"].low_latency_combine).parameters
    assert list(lc)[1:] == ["x", "topk_idx", "topk_weights", "handle", "use_logfmt", "zero_copy", "async_finish",
                            "return_recv_hook", "out", "combine_wait_recv_cost_stats"]


def test_a_buffer_needs_a_group_or_a_communicator():
    _native_ep_or_skip()
    from gdx.ep import Buffer
    with pytest.raises(gdx.InvalidArgumentError, match="group or comm"):
        Buffer(None)
