"""gdx.ep.Buffer: DeepEP's Buffer names, argument order and return tuples over gdx::ep::Buffer (include/gdx/ep/).

What differs from DeepEP, each on purpose:
- The routing is computed by gdx from ``topk_idx`` inside dispatch: ``num_tokens_per_rank``, ``is_token_in_rank``
  and ``num_tokens_per_expert`` (from get_dispatch_layout) are accepted and not needed.
- Kernels run on the current stream (``torch.cuda.current_stream()``); ``previous_event`` is waited for first,
  ``async_finish`` returns an event recorded after them; ``allocate_on_comm_stream`` is accepted and has no effect.
- The kernel shape is the Buffer's (``Buffer.set_num_sms`` before constructing, or ``config=`` of the
  constructor); a per-call ``config`` is accepted for compatibility and not applied.
- The handle is a :class:`DispatchHandle` object; indexed like DeepEP's tuple it gives ``handle[0]``
  (rank_prefix_matrix), ``handle[3]`` (recv_src_idx) and ``handle[4]`` (is_token_in_rank, when given).
- dispatch routes by expert, so it needs ``topk_idx`` (or a handle): DeepEP's form that routes by
  ``is_token_in_rank`` alone raises gdx.InvalidArgumentError.
"""

import weakref
from typing import Any, List, Optional, Tuple, Union

from .. import _gdx
from .._arrays import DeviceArray
from ..context import Context
from ..errors import InvalidArgumentError
from ._torch import current_stream_handle
from ._torch import torch as _torch
from .low_latency import LowLatencyHandle, LowLatencyState

_ep_module = None  # _gdx.ep once a call found it available: looked up once, not on every dispatch


def _native_ep():
    global _ep_module
    if _ep_module is None:
        if not _gdx.ep_available():
            raise NotImplementedError("gdx.ep needs a build of gdx with CUDA (nvcc was not found when it was built)")
        _ep_module = _gdx.ep
    return _ep_module


_DTYPES = None  # (bfloat16, float8_e4m3) of _gdx.ep.DType, looked up once
_FP8: Any = False  # torch.float8_e4m3fn (None where this torch has none); False until looked up


def _native_dtype(fp8: bool):
    """The native DType of a dispatch's x: float8_e4m3 with scales, else bfloat16."""
    global _DTYPES
    if _DTYPES is None:
        ep = _native_ep()
        _DTYPES = (ep.DType.bfloat16, ep.DType.float8_e4m3)
    return _DTYPES[fp8]


def _fp8_dtype():
    """torch.float8_e4m3fn, or None where this torch has no FP8 dtype."""
    global _FP8
    if _FP8 is False:
        _FP8 = getattr(_torch(), "float8_e4m3fn", None)
    return _FP8


def _address(t) -> int:
    """The device address of an optional tensor, 0 for None (the native structs' null)."""
    return t.data_ptr() if t is not None else 0


_NOT_OFFERED = "gdx.ep: {what} is not offered by gdx's low-latency mode ({why})"


class Config:
    """DeepEP's Config(num_sms, nvl send/recv chunks, rdma send/recv chunks). gdx uses ``num_sms`` (blocks of the
    dispatch and combine kernels) and ``num_threads`` (threads per block, a multiple of 32); the chunk sizes are
    kept for compatibility and not used (gdx's kernels size their chunks from the buffer)."""

    def __init__(self, num_sms: int = 24, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256, *, num_threads: Optional[int] = None):
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens
        self.num_threads = num_threads

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """NVLink buffer bytes for up to 4096 tokens per rank of `hidden_bytes` each (top-k up to 16, FP8 scales
        included), every rank able to send all of them to one rank."""
        row = hidden_bytes + hidden_bytes // 64 + 16 * 12 + 64
        return ((row * 4096 * num_ranks + (1 << 20)) + 127) // 128 * 128

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0: gdx's normal mode does not use an RDMA buffer within one host."""
        return 0

    def _native(self, num_ranks: int):
        c = _native_ep().Config.for_ranks(num_ranks)
        c.num_sms = self.num_sms
        if self.num_threads is not None:
            c.num_threads = self.num_threads
        return c

    def __repr__(self) -> str:
        return f"gdx.ep.Config(num_sms={self.num_sms}, num_threads={self.num_threads})"


class EventOverlap:
    """DeepEP's EventOverlap: a CUDA event (None unless the call had async_finish) and the tensors to keep alive
    until it completed. ``current_stream_wait()`` makes the current stream wait for it; as a context manager
    (``with event:``) it does so on exit."""

    def __init__(self, event: Any = None, extra_tensors: Optional[Tuple] = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is None:
            raise InvalidArgumentError("EventOverlap.current_stream_wait: no event (the call had async_finish=False)")
        _torch().cuda.current_stream().wait_event(self.event)

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc) -> None:
        if self.event is not None:
            self.current_stream_wait()


_DEEPEP_HANDLE = ("rank_prefix_matrix", "channel_prefix_matrix", "recv_channel_prefix_matrix", "recv_src_idx",
                  "is_token_in_rank (not given to this dispatch)", "send_head")


class DispatchHandle:
    """The routing of one dispatch (which token went to which rank and row): pass it to combine, or to dispatch for
    the cached form. ``num_recv_tokens`` is None after a num_worst_tokens dispatch (the count is on the device).

    Indexing it as DeepEP's intranode handle tuple gives what gdx has of it: ``handle[0]`` the rank_prefix_matrix
    ([R, R] int32, [i][j]: tokens ranks 0..i send to rank j), ``handle[3]`` recv_src_idx, ``handle[4]``
    is_token_in_rank (when the dispatch was given it); DeepEP's channel matrices and send_head (1, 2, 5) do not
    exist in gdx's kernels and raise NotImplementedError.
    """

    def __init__(self, buffer: "Buffer", native: Any, num_tokens: int, hidden: int, num_recv_tokens: Optional[int],
                 recv_src_idx: Any, num_worst_tokens: int, is_token_in_rank: Any = None):
        self._buffer = buffer
        self._native = native
        self.num_tokens = num_tokens
        self.hidden = hidden
        self.num_recv_tokens = num_recv_tokens
        self.recv_src_idx = recv_src_idx  #: [rows] int32: each received row's token index on its source rank
        self.num_worst_tokens = num_worst_tokens
        self.is_token_in_rank = is_token_in_rank  #: [N, R] bool as given to dispatch, or None
        self._rank_prefix_matrix = None

    @property
    def rank_prefix_matrix(self):
        """[R, R] int32 on the GPU: [i][j] = tokens that ranks 0..i send to rank j (DeepEP's handle[0]); rows of
        source i at rank j start at [i - 1][j]. Stream-ordered after the dispatch, computed on first use."""
        if self._rank_prefix_matrix is None:
            torch = _torch()
            ranks = self._buffer.group_size
            counts = torch.as_tensor(DeviceArray(self._buffer.runtime.counts_matrix(self._native), (ranks, ranks),
                                                 "<i4", self._native),
                                     device=self.recv_src_idx.device)
            self._rank_prefix_matrix = counts.cumsum(0, dtype=torch.int32)  # a copy: the handle may be reused
        return self._rank_prefix_matrix

    def __getitem__(self, i: int):
        if i == 0:
            return self.rank_prefix_matrix
        if i == 3:
            return self.recv_src_idx
        if i == 4 and self.is_token_in_rank is not None:
            return self.is_token_in_rank
        if i in (1, 2, 4, 5):
            raise NotImplementedError(f"gdx.ep: handle[{i}] (DeepEP's "
                                      f"{_DEEPEP_HANDLE[i]}) is not kept by gdx's dispatch; handle[0] "
                                      "(rank_prefix_matrix) and handle[3] (recv_src_idx) are")
        raise IndexError(f"gdx.ep: handle index {i} out of range (DeepEP's intranode handle has 6 entries)")

    @property
    def rows(self) -> int:
        """Rows of the received tensors (the received count, or num_worst_tokens)."""
        return self.num_worst_tokens if self.num_worst_tokens else self.num_recv_tokens


class Buffer:
    """MoE dispatch/combine buffers over the ranks of `group` (a torch.distributed group, or a gdx.Context): ranks
    of one host over NVLink (at most 8 per host), others through the proxy (num_rdma_bytes). Collective.

    num_nvl_bytes: GPU memory each rank lends its peers (Config.get_nvl_buffer_size_hint); num_rdma_bytes: the
    window space staging rows for ranks on other hosts (gdx::ep::Buffer's rdmaBytes; 0 when every rank is on this
    host).
    Call ``torch.cuda.set_device(local_rank)`` before making it: its GPU is the current one.
    """

    num_sms: int = 24

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, explicitly_destroy: bool = False, *, config: Optional[Config] = None):
        native_ep = _native_ep()
        self._owns_context = not isinstance(group, Context)  # made from a torch group: closed by destroy()
        self._context = group if isinstance(group, Context) else Context.from_process_group(group)
        self.group = group
        self.rank = self._context.rank
        self.group_size = self._context.world_size
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        # The normal mode's buffer, unless the Buffer is for the low-latency mode only (DeepEP's num_nvl_bytes 0).
        self.runtime = None
        if not low_latency_mode or num_nvl_bytes > 0:
            cfg = (config or Config(Buffer.num_sms))._native(self.group_size)
            self.runtime = native_ep.Buffer(self._context._native, num_nvl_bytes,
                                            0 if low_latency_mode else num_rdma_bytes, cfg)
        self._handles: dict = {}  # free native handles by capacity, reused in stream order
        self._low_latency = LowLatencyState(self._context, num_rdma_bytes) if low_latency_mode else None
        self._destroyed = False

    # ---- DeepEP's static helpers -------------------------------------------------------------------------------
    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Blocks of the dispatch and combine kernels of Buffers made afterwards."""
        if new_num_sms <= 0:
            raise InvalidArgumentError(f"set_num_sms: {new_num_sms} must be positive")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms)

    @staticmethod
    def capture() -> EventOverlap:
        """An event recorded on the current stream."""
        torch = _torch()
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return EventOverlap(event)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """Bytes (GPU window plus pinned host memory) the low-latency mode takes for these shapes at most: every
        other rank on another host, top-k up to gdx.ep's MAX_TOPK. Pass it as num_rdma_bytes."""
        cfg = LowLatencyState.native_config(num_max_dispatch_tokens_per_rank, hidden, num_experts,
                                            _native_ep().MAX_TOPK)
        gpu, host = _native_ep().low_latency_bytes_hint(cfg, num_ranks, num_ranks - 1)
        return gpu + host

    def destroy(self) -> None:
        """Frees the buffer now (DeepEP's explicitly_destroy), and the gdx.Context it made from the group (one it
        was given stays open); collective."""
        self.runtime = None
        self._destroyed = True
        self._handles.clear()
        if self._low_latency is not None:
            self._low_latency.close()
        if self._owns_context:
            self._context.close()

    # ---- layout ------------------------------------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts: int, previous_event: Optional[EventOverlap] = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False):
        """Returns (num_tokens_per_rank [R] int32, None (no RDMA ranks), num_tokens_per_expert [E] int32,
        is_token_in_rank [N, R] bool, event), as DeepEP."""
        torch = _torch()
        stream = self._begin(previous_event)
        topk_idx = self._check(topk_idx, torch.int64, 2, "topk_idx")
        n, k = topk_idx.shape
        per_rank = topk_idx.new_empty(self.group_size, dtype=torch.int32)
        per_expert = topk_idx.new_empty(num_experts, dtype=torch.int32)
        in_rank = topk_idx.new_empty((n, self.group_size), dtype=torch.bool)
        self.runtime.get_dispatch_layout(topk_idx.data_ptr(), n, k, num_experts, per_rank.data_ptr(),
                                         per_expert.data_ptr(), in_rank.data_ptr(), stream)
        return per_rank, None, per_expert, in_rank, self._end(async_finish, (topk_idx,))

    # ---- dispatch ----------------------------------------------------------------------------------------------
    def dispatch(self, x: Union[Any, Tuple[Any, Any]], handle: Optional[DispatchHandle] = None,
                 num_tokens_per_rank=None, num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                 num_tokens_per_expert=None, topk_idx=None, topk_weights=None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config: Optional[Config] = None,
                 previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """Sends each token to the ranks of its top-k experts. `x`: [N, hidden] bfloat16, or (float8_e4m3fn
        [N, hidden], float32 scales [N, hidden / 128]). Returns (recv_x (a tuple for FP8), recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event), as DeepEP; the cached form (`handle`
        given, no topk) returns (recv_x, None, None, None, None, event). recv_topk_idx holds local expert ids, -1
        where the expert is on another rank. num_worst_tokens > 0: no host synchronisation, outputs of that many
        rows, the list is empty."""
        stream = self._begin(previous_event)
        x, x_scales, n, hidden = self._check_x(*(x if isinstance(x, tuple) else (x, None)))
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise InvalidArgumentError("dispatch: the cached form (handle given) takes no topk_idx/topk_weights")
            return self._cached_dispatch(x, x_scales, n, hidden, handle, stream, async_finish)

        torch = _torch()
        ep = _native_ep()
        if topk_idx is None:
            raise InvalidArgumentError("dispatch: topk_idx is required unless a handle is given")
        topk_idx = self._check(topk_idx, torch.int64, 2, "topk_idx")
        k = topk_idx.shape[1]
        if topk_weights is not None:
            topk_weights = self._check(topk_weights, torch.float32, 2, "topk_weights")
        num_experts = self._num_experts(num_tokens_per_expert)
        inputs = ep.DispatchInputs(x.data_ptr(), _address(x_scales), n, hidden, _native_dtype(x_scales is not None),
                                   topk_idx.data_ptr(), _address(topk_weights), k, num_experts)
        native_handle = self._take_handle(n)
        if num_worst_tokens > 0:
            rows, counts = num_worst_tokens, []
        else:
            rows, counts = self.runtime.dispatch_prepare(inputs, native_handle, expert_alignment, stream)
        recv_x, recv_scales = self._alloc_recv(x, x_scales, rows, hidden)
        # Rows past the received count (num_worst_tokens) select no expert, as DeepEP's do.
        recv_topk_idx = (x.new_full((rows, k), -1, dtype=torch.int64) if num_worst_tokens > 0 else
                         x.new_empty((rows, k), dtype=torch.int64))
        recv_topk_weights = x.new_empty((rows, k), dtype=torch.float32) if topk_weights is not None else None
        recv_src_idx = x.new_empty(rows, dtype=torch.int32)
        # The per-expert and received counts stay on the device after a num_worst_tokens dispatch and are returned
        # by neither form (DeepEP's list is empty then): their outputs are left null.
        out = ep.DispatchOutputs(rows, recv_x.data_ptr(), _address(recv_scales), recv_topk_idx.data_ptr(),
                                 _address(recv_topk_weights), recv_src_idx.data_ptr())
        if num_worst_tokens > 0:
            self.runtime.dispatch_worst(inputs, native_handle, out, num_worst_tokens, expert_alignment, stream)
        else:
            self.runtime.dispatch(inputs, native_handle, out, stream)
        handle = DispatchHandle(self, native_handle, n, hidden, None if num_worst_tokens else rows, recv_src_idx,
                                num_worst_tokens, is_token_in_rank)
        self._recycle_later(handle)
        event = self._end(async_finish, (x, x_scales, topk_idx, topk_weights, recv_x, recv_scales))
        return ((recv_x, recv_scales) if x_scales is not None else recv_x, recv_topk_idx, recv_topk_weights,
                list(counts), handle, event)

    def _cached_dispatch(self, x, x_scales, n: int, hidden: int, handle: DispatchHandle, stream: int,
                         async_finish: bool):
        """The cached form: `handle`'s routing again, no top-k. Nothing waits on the host, so at small token counts
        this call's host time is what the GPU waits for: one native call, with every field as an argument."""
        rows = handle.rows
        recv_x, recv_scales = self._alloc_recv(x, x_scales, rows, hidden)
        self.runtime.dispatch_flat(handle._native, x.data_ptr(), _address(x_scales), n, hidden,
                                   _native_dtype(x_scales is not None), rows, recv_x.data_ptr(), _address(recv_scales),
                                   stream)
        event = self._end(async_finish, (x, x_scales, recv_x, recv_scales))
        return (recv_x, recv_scales) if x_scales is not None else recv_x, None, None, None, None, event

    # ---- combine -----------------------------------------------------------------------------------------------
    def combine(self, x, handle: DispatchHandle, topk_weights=None, bias=None, config: Optional[Config] = None,
                previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                allocate_on_comm_stream: bool = False):
        """Sends every received row back to its source token, where the rows are summed (plus `bias`: a tensor or
        a pair, [N, hidden] bfloat16). `x`: [rows, hidden] bfloat16 in the received order. Returns (combined_x
        [N, hidden], combined_topk_weights [N, k] or None, event), as DeepEP."""
        torch = _torch()
        if not isinstance(handle, DispatchHandle):
            raise InvalidArgumentError("combine: handle must be the DispatchHandle a dispatch returned")
        stream = self._begin(previous_event)
        x = self._check(x, torch.bfloat16, 2, "x")
        if x.shape[0] < (handle.rows or 0) or x.shape[1] != handle.hidden:
            raise InvalidArgumentError(f"combine: x is {tuple(x.shape)}, the dispatch received "
                                       f"[{handle.rows}, {handle.hidden}]")
        combined_w = None
        if topk_weights is not None:
            topk_weights = self._check(topk_weights, torch.float32, 2, "topk_weights")
            combined_w = x.new_empty((handle.num_tokens, topk_weights.shape[1]), dtype=torch.float32)
        bias0, bias1 = self._check_biases(bias) if bias is not None else (None, None)
        combined_x = x.new_empty((handle.num_tokens, handle.hidden))
        self.runtime.combine_flat(handle._native, x.data_ptr(), _address(topk_weights), _address(bias0),
                                  _address(bias1), combined_x.data_ptr(), _address(combined_w), stream)
        return combined_x, combined_w, self._end(async_finish, (x, topk_weights, bias0, bias1, combined_x))

    # ---- low-latency mode --------------------------------------------------------------------------------------
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int = 0, hidden: int = 0,
                                 num_experts: int = 0) -> None:
        """Nothing to do: gdx's low-latency calls are sequence-numbered, so no buffer needs zeroing between them."""
        self._ll_state("clean_low_latency_buffer")

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """Sends each (token, expert) pair of `topk_idx` ([N, K] int64, -1: none) to the expert's rank: the kernel
        sends a token once to each rank its experts live on, which fills a row per pair. `x`: [N, hidden] bfloat16,
        N <= num_max_dispatch_tokens_per_rank (T). Returns, as
        DeepEP, (recv_x, recv_count, handle, event, hook): recv_x [L, T * R, hidden] (float8_e4m3fn with float32
        scales [L, T * R, hidden / 128] as a tuple when use_fp8, else bfloat16), the rows of local expert j being
        [0, recv_count[j]) grouped by source rank (handle[1]); hook is None, or with return_recv_hook a callable
        that launches the receive half on the then-current stream (until then recv_x and recv_count are not
        written). No host synchronisation."""
        torch = _torch()
        ep = _native_ep()
        state = self._ll_state("low_latency_dispatch")
        if use_ue8m0:
            raise NotImplementedError(_NOT_OFFERED.format(
                what="use_ue8m0", why="scales are float32; round_scale=True rounds them up to powers of two"))
        if dispatch_wait_recv_cost_stats is not None:
            raise NotImplementedError(_NOT_OFFERED.format(what="dispatch_wait_recv_cost_stats",
                                                          why="the kernels keep no per-rank wait times"))
        if async_finish and return_recv_hook:
            raise InvalidArgumentError("low_latency_dispatch: async_finish and return_recv_hook exclude each other "
                                       "(the hook's receive half is what would be waited for), as in DeepEP")
        stream = current_stream_handle()
        x = self._check(x, torch.bfloat16, 2, "x")
        topk_idx = self._check(topk_idx, torch.int64, 2, "topk_idx")
        n, hidden = x.shape
        if topk_idx.shape[0] != n:
            raise InvalidArgumentError(f"low_latency_dispatch: topk_idx has {topk_idx.shape[0]} rows, x {n}")
        if num_experts % self.group_size:
            raise InvalidArgumentError(f"low_latency_dispatch: {num_experts} experts over {self.group_size} ranks")
        tokens_per_rank, k = num_max_dispatch_tokens_per_rank, topk_idx.shape[1]
        key, native = state.buffer(tokens_per_rank, hidden, num_experts, k)
        local, rows = num_experts // self.group_size, tokens_per_rank * self.group_size
        stats = cumulative_local_expert_recv_stats
        if stats is not None and (stats.dtype != torch.int32 or tuple(stats.shape) != (local,) or not stats.is_cuda):
            raise InvalidArgumentError(f"low_latency_dispatch: cumulative_local_expert_recv_stats must be a CUDA "
                                       f"int32 tensor of [{local}] (local experts), got {stats.dtype} "
                                       f"{tuple(stats.shape)} on {stats.device}")
        if use_fp8:
            recv_x = x.new_empty((local, rows, hidden), dtype=torch.float8_e4m3fn)
            recv_scales = x.new_empty((local, rows, hidden // 128), dtype=torch.float32)
        else:
            recv_x = x.new_empty((local, rows, hidden))
            recv_scales = None
        recv_count = x.new_empty(local, dtype=torch.int32)
        ins = ep.LowLatencyDispatchInputs(x.data_ptr(), topk_idx.data_ptr(), n, k, bool(use_fp8), bool(round_scale))
        outs = ep.LowLatencyDispatchOutputs(recv_x.data_ptr(), _address(recv_scales), recv_count.data_ptr())
        pooled = state.take_handle(key)
        native_hook = ep.LowLatencyHook() if return_recv_hook else None
        native.dispatch(ins, outs, pooled.native, stream, native_hook)
        handle = LowLatencyHandle(pooled, key, x.device, self.group_size, n)

        def received():
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(recv_count)

        hook = None
        if native_hook is None:
            received()
        else:
            hook = self._ll_hook(native_hook, (pooled, recv_x, recv_scales, recv_count), received)
        event = self._end(async_finish, (x, topk_idx, recv_x, recv_scales, recv_count))
        return (recv_x, recv_scales) if use_fp8 else recv_x, recv_count, handle, event, hook

    def low_latency_combine(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out=None, combine_wait_recv_cost_stats=None):
        """Returns the rows of `handle`'s dispatch to their source tokens, summed weighted by `topk_weights`
        ([N, K] float32; `topk_idx` the dispatch's): each rank sums a token's rows of its experts with the source's
        weights and sends one row back, which the source adds up. `x`: [L, T * R, hidden] bfloat16 (the experts'
        outputs in the rows the dispatch wrote). Returns (combined_x [N, hidden] bfloat16 (`out` when given),
        event, hook), as DeepEP; with return_recv_hook the last sum is done by hook()."""
        torch = _torch()
        ep = _native_ep()
        state = self._ll_state("low_latency_combine")
        if async_finish and return_recv_hook:
            raise InvalidArgumentError("low_latency_combine: async_finish and return_recv_hook exclude each other")
        for name, used in (("use_logfmt", use_logfmt), ("zero_copy", zero_copy),
                           ("combine_wait_recv_cost_stats", combine_wait_recv_cost_stats is not None)):
            if used:
                raise NotImplementedError(_NOT_OFFERED.format(what=name, why="BF16 rows are sent as given"))
        if not isinstance(handle, LowLatencyHandle):
            raise InvalidArgumentError("low_latency_combine: handle must be the one low_latency_dispatch returned")
        stream = current_stream_handle()
        x = self._check(x, torch.bfloat16, 3, "x")
        topk_idx = self._check(topk_idx, torch.int64, 2, "topk_idx")
        topk_weights = self._check(topk_weights, torch.float32, 2, "topk_weights")
        tokens_per_rank, hidden = handle.tokens_per_rank, handle.hidden
        want = (handle.num_experts // self.group_size, tokens_per_rank * self.group_size, hidden)
        if tuple(x.shape) != want:
            raise InvalidArgumentError(f"low_latency_combine: x is {tuple(x.shape)}, the dispatch received {want}")
        if tuple(topk_idx.shape) != (handle.num_tokens, handle.num_topk) or topk_weights.shape != topk_idx.shape:
            raise InvalidArgumentError(
                f"low_latency_combine: topk_idx {tuple(topk_idx.shape)} and topk_weights "
                f"{tuple(topk_weights.shape)} must both be the dispatch's [{handle.num_tokens}, {handle.num_topk}]")
        if out is None:
            out = x.new_empty((handle.num_tokens, hidden))
        else:
            if not out.is_contiguous():  # a contiguous copy would be filled instead of the caller's tensor
                raise InvalidArgumentError("low_latency_combine: out must be contiguous (it is written in place)")
            out = self._check(out, torch.bfloat16, 2, "out")
            if tuple(out.shape) != (handle.num_tokens, hidden):
                raise InvalidArgumentError(f"low_latency_combine: out is {tuple(out.shape)}, not "
                                           f"[{handle.num_tokens}, {hidden}]")
        cin = ep.LowLatencyCombineInputs(x.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr())
        native_hook = ep.LowLatencyHook() if return_recv_hook else None
        state.native(handle._key).combine(cin, handle.native, out.data_ptr(), stream, native_hook)
        hook = None
        if native_hook is not None:
            hook = self._ll_hook(native_hook, (handle, x, topk_idx, topk_weights, out), lambda: None)
        return out, self._end(async_finish, (x, topk_idx, topk_weights, out)), hook

    def low_latency_masked_ranks(self) -> List[int]:
        """Ranks the low-latency calls masked so far (dead or unreachable: their tokens count as not sent)."""
        state = self._ll_state("low_latency_masked_ranks")
        return sorted({r for key in state._buffers for r in state.native(key).masked_ranks()})

    def _ll_state(self, what: str) -> LowLatencyState:
        if self._destroyed:
            raise InvalidArgumentError(f"gdx.ep.Buffer.{what}: used after destroy()")
        if self._low_latency is None:
            raise InvalidArgumentError(f"gdx.ep.Buffer.{what}: the Buffer was made without low_latency_mode=True")
        return self._low_latency

    def _ll_hook(self, native_hook, keep: Tuple, after):
        """The callable DeepEP returns as its recv hook: runs the receive half on the current stream, once."""

        def hook():
            self._ll_state("recv hook")  # not after destroy(): the native buffer it would launch on is gone
            native_hook.run(current_stream_handle())
            after()

        hook.keep = keep  # the handle and tensors the receive half writes or reads stay alive until it ran
        return hook

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _begin(self, previous_event: Optional[EventOverlap]) -> int:
        """Checks that the Buffer can run the normal mode, waits for `previous_event`; the current stream's
        handle, where the kernels go."""
        if self._destroyed:
            raise InvalidArgumentError("gdx.ep.Buffer: used after destroy()")
        if self.runtime is None:
            raise InvalidArgumentError("gdx.ep.Buffer: made for the low-latency mode only (num_nvl_bytes 0): "
                                       "give num_nvl_bytes for dispatch/combine")
        if previous_event is not None and previous_event.event is not None:
            previous_event.current_stream_wait()
        return current_stream_handle()

    @staticmethod
    def _end(async_finish: bool, tensors: Tuple) -> EventOverlap:
        if not async_finish:
            return EventOverlap()
        event = _torch().cuda.Event()
        event.record()  # on the current stream: the one the call's kernels went to
        return EventOverlap(event, tuple(t for t in tensors if t is not None))

    @staticmethod
    def _check(t, dtype, ndim: int, what: str):
        if t.dtype != dtype or t.dim() != ndim:
            raise InvalidArgumentError(f"{what}: expected a {ndim}-d {dtype} tensor, got {t.dim()}-d {t.dtype}")
        if not t.is_cuda:
            raise InvalidArgumentError(f"{what}: expected a CUDA tensor, got one on {t.device}")
        return t if t.is_contiguous() else t.contiguous()

    def _check_x(self, x, x_scales):
        """dispatch's `x`: [N, hidden] bfloat16, or float8_e4m3fn with float32 scales [N, hidden / 128]. Returns
        (x, x_scales, N, hidden), each shape read once: at small token counts the host time is the call's."""
        torch = _torch()
        if x_scales is None:
            x = self._check(x, torch.bfloat16, 2, "x")
            n, hidden = x.shape
            return x, None, n, hidden
        fp8 = _fp8_dtype()
        if fp8 is None or x.dtype != fp8:
            raise InvalidArgumentError(f"x: an FP8 dispatch takes (float8_e4m3fn, float32 scales), got {x.dtype}")
        x = self._check(x, fp8, 2, "x")
        x_scales = self._check(x_scales, torch.float32, 2, "x_scales")
        n, hidden = x.shape
        scale_rows, scale_cols = x_scales.shape
        if scale_rows != n or scale_cols != hidden // 128:  # the kernels read and write that many
            raise InvalidArgumentError(f"x_scales: expected [{n}, {hidden // 128}] (one per 128 elements of x), "
                                       f"got {list(x_scales.shape)}")
        return x, x_scales, n, hidden

    def _check_biases(self, bias) -> Tuple[Any, Any]:
        """combine's `bias`, a tensor or a pair. Both are held by the caller until the launch (and by the event): a
        contiguous copy dropped before could be handed out again as combined_x, which the kernel writes while it
        reads the bias."""
        torch = _torch()
        biases = bias if isinstance(bias, tuple) else (bias, None)
        if len(biases) != 2:
            raise InvalidArgumentError(f"combine: bias is a tensor or a pair of tensors, got a tuple of {len(biases)}")
        return tuple(self._check(b, torch.bfloat16, 2, "bias") if b is not None else None for b in biases)

    def _num_experts(self, num_tokens_per_expert) -> int:
        if num_tokens_per_expert is None:
            raise InvalidArgumentError("dispatch: num_tokens_per_expert (from get_dispatch_layout) is required: "
                                       "its length is the number of experts")
        return int(num_tokens_per_expert.numel())

    @staticmethod
    def _alloc_recv(x, x_scales, rows: int, hidden: int):
        """recv_x (and its scales) of `rows` rows, new tensors each call (the caller keeps them, as DeepEP's);
        new_empty takes the dtype and device from its source, which spares torch.empty's argument parsing."""
        recv_x = x.new_empty((rows, hidden))
        recv_scales = x_scales.new_empty((rows, hidden // 128)) if x_scales is not None else None
        return recv_x, recv_scales

    def _take_handle(self, num_tokens: int):
        capacity = 1 << max(num_tokens - 1, 0).bit_length()  # powers of two, so handles are reused across sizes
        free = self._handles.get(capacity)
        return free.pop() if free else self.runtime.new_handle(capacity)

    def _recycle_later(self, handle: DispatchHandle) -> None:
        native, pool = handle._native, self._handles

        def give_back(native=native, pool=pool):
            pool.setdefault(native.max_tokens, []).append(native)

        weakref.finalize(handle, give_back)
