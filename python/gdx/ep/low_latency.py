"""The low-latency mode of gdx.ep.Buffer (DeepEP's low_latency_dispatch / low_latency_combine, the mask calls,
zero-copy combine) over gdx::ep::LowLatencyBuffer (include/gdx/ep/low_latency.hpp): the kernels issue the puts (a
token once per rank its experts live on in dispatch, the weighted sum of its rows there back in combine), no host
synchronisation, so both calls can be captured in a CUDA graph. One kernel per call, named ``...::dispatch`` /
``...::combine`` as DeepEP's, launched twice (send half, then receive half from the hook) with return_recv_hook.

Two paths, the same results: with gdx._gdx_torch (built where torch's headers were found) each call is one crossing
into C++ that makes the output tensors and launches; otherwise (gdx._gdx alone) the tensors are made here and their
addresses passed. Which one runs: ``LowLatencyMode.path``.

What differs from DeepEP, each on purpose:
- The native buffer's shapes are fixed when it is made: gdx makes one per (num_max_dispatch_tokens_per_rank, hidden,
  num_experts, top-k) at the first call with them (collective: every rank makes the same calls in the same order),
  checked against the num_rdma_bytes the Buffer was given. Warm up outside a graph capture first.
- use_logfmt is accepted and the rows are sent in BF16 (exact, where DeepEP's 10-bit LogFMT rounds).
- clean_low_latency_buffer has nothing to zero (calls are sequence-numbered).
"""

from typing import Any, Dict, List, Optional, Tuple

from .. import _gdx
from .._arrays import DeviceArray
from ..errors import InvalidArgumentError
from ._native import address as _address
from ._native import native_ep as _native_ep
from ._native import torch_extension
from ._torch import check as _check
from ._torch import current_stream_handle, is_capturing
from ._torch import torch as _torch
from .events import end_event

_UE8M0_GROUP = 512  # elements of a row per packed int32 of UE8M0 scales (four 128-element blocks)


class _Pooled:
    """A native LowLatencyHandle taken from its buffer's pool; back in the pool once nothing refers to this (the
    LowLatencyHandle, the hook and the tensors viewing its memory), unless a CUDA graph captured it (pool None): the
    graph's replays write it, so it is never handed out again."""

    __slots__ = ("native", "pool")

    def __init__(self, native: Any, pool: Optional[List[Any]]):
        self.native = native
        self.pool = pool

    def __del__(self):
        if self.pool is not None:
            self.pool.append(self.native)


class LowLatencyHandle:
    """What low_latency_dispatch returns for its combine. Indexed or unpacked like DeepEP's tuple: (src_info
    [L, T * R] int32 (source token of each row), layout_range [L, R] int64 ((first row << 32) | rows per source rank),
    num_max_dispatch_tokens_per_rank, hidden, num_experts). ``src_slot`` says which top-k slot of its token each row
    fills (a token naming one expert in two slots arrives as two rows)."""

    __slots__ = ("_pooled", "_key", "_device", "_ranks", "tokens_per_rank", "hidden", "num_experts", "num_topk",
                 "__weakref__")

    def __init__(self, pooled: _Pooled, key: Tuple, device: Any, ranks: int):
        self._pooled = pooled
        self._key = key  # the native buffer's: (tokens per rank, hidden, experts, top-k)
        self._device = device
        self._ranks = ranks
        self.tokens_per_rank, self.hidden, self.num_experts, self.num_topk = key

    @property
    def num_tokens(self) -> int:
        """Tokens of the dispatch that filled this handle."""
        return self._pooled.native.num_tokens

    # The tensors are made on first use, not in the dispatch: a dispatch inside a CUDA graph capture then makes no
    # call but its kernel launches.
    def _view(self, ptr: int, shape: Tuple[int, ...], typestr: str):
        return _torch().as_tensor(DeviceArray(ptr, shape, typestr, self._pooled), device=self._device)

    @property
    def _rows_shape(self) -> Tuple[int, int]:
        return self.num_experts // self._ranks, self.tokens_per_rank * self._ranks

    @property
    def src_info(self):
        return self._view(self.native.src_info, self._rows_shape, "<i4")

    @property
    def src_slot(self):
        return self._view(self.native.src_slot, self._rows_shape, "<i4")

    @property
    def layout_range(self):
        return self._view(self.native.layout_range, (self._rows_shape[0], self._ranks), "<i8")

    @property
    def native(self) -> Any:
        return self._pooled.native

    def _as_tuple(self) -> Tuple:
        return (self.src_info, self.layout_range, self.tokens_per_rank, self.hidden, self.num_experts)

    def __getitem__(self, i):
        if isinstance(i, int) and i in (2, 3, 4, -1, -2, -3):
            return (self.tokens_per_rank, self.hidden, self.num_experts)[i - 2 if i >= 0 else i]
        return self._as_tuple()[i]

    def __len__(self) -> int:
        return 5

    def __iter__(self):
        return iter(self._as_tuple())


class _Shape:
    """One native LowLatencyBuffer (one set of shapes) with its pool of handles and its zero-copy combine buffer."""

    __slots__ = ("key", "native", "pool", "zero_copy", "local", "rows", "address")

    def __init__(self, key: Tuple, native: Any, ranks: int):
        self.key = key
        self.native = native
        # Two handles at once (two calls may be in flight), made now: a graph capture cannot allocate them.
        self.pool = [native.new_handle(), native.new_handle()]
        self.zero_copy = None
        self.local = key[2] // ranks
        self.rows = key[0] * ranks
        self.address = native.address  # the C++ object, for the torch extension


class LowLatencyMode:
    """The low-latency calls of one gdx.ep.Buffer: its native buffers by shape."""

    def __init__(self, context: Any, num_rdma_bytes: int):
        self._context = context
        self._ranks = context.world_size
        self._num_rdma_bytes = num_rdma_bytes
        self._shapes: Dict[Tuple, _Shape] = {}
        self._recent: Dict[Tuple, _Shape] = {}  # (T, experts) -> the shape of the last dispatch with them
        self._device = _torch().device("cuda", _torch().cuda.current_device())
        self._captured: List[Any] = []  # handles a CUDA graph captured
        self._closed = False
        self._ext = torch_extension()
        self.path = "torch extension (gdx._gdx_torch)" if self._ext is not None else "pointers (gdx._gdx)"

    @staticmethod
    def native_config(tokens_per_rank: int, hidden: int, num_experts: int, max_topk: int):
        c = _gdx.ep.LowLatencyConfig()
        c.max_tokens_per_rank = tokens_per_rank
        c.hidden = hidden
        c.num_experts = num_experts
        c.max_topk = max_topk
        return c

    @staticmethod
    def bytes_hint(tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
        ep = _native_ep()
        cfg = LowLatencyMode.native_config(tokens_per_rank, hidden, num_experts, ep.MAX_TOPK)
        gpu, host = ep.low_latency_bytes_hint(cfg, num_ranks, num_ranks - 1)
        return gpu + host

    def _shape(self, tokens_per_rank: int, hidden: int, num_experts: int, topk: int) -> _Shape:
        key = (tokens_per_rank, hidden, num_experts, topk)
        shape = self._shapes.get(key)
        if shape is None:
            if num_experts % self._ranks:
                raise InvalidArgumentError(f"low_latency_dispatch: {num_experts} experts over {self._ranks} ranks")
            cfg = self.native_config(*key)
            gpu, host = _native_ep().low_latency_bytes_hint(cfg, self._ranks, self._ranks - 1)
            if self._num_rdma_bytes and gpu + host > self._num_rdma_bytes:
                raise InvalidArgumentError(
                    f"low_latency_dispatch: {tokens_per_rank} tokens per rank of hidden {hidden}, {num_experts} "
                    f"experts, top-{topk} need up to {gpu + host} bytes, more than num_rdma_bytes "
                    f"{self._num_rdma_bytes} (Buffer.get_low_latency_rdma_size_hint)")
            shape = _Shape(key, _native_ep().LowLatencyBuffer(self._context._native, cfg), self._ranks)
            self._shapes[key] = shape
        return shape

    def _take_handle(self, shape: _Shape) -> _Pooled:
        pool = shape.pool
        if is_capturing():
            if not pool:  # making one allocates and synchronises, which a capture does not allow
                raise InvalidArgumentError(
                    "low_latency_dispatch in a CUDA graph capture: no free handle (each capture keeps the ones it "
                    "takes; the calls outside a capture keep two ready): make an eager call before this capture")
            # The graph's replays write this handle's memory: kept for good (dropping it would free the memory
            # during the capture, which invalidates it, and under the graph afterwards).
            native = pool.pop()
            self._captured.append(native)
            return _Pooled(native, None)
        native = pool.pop() if pool else shape.native.new_handle()
        while len(pool) < 2:  # two ready for a capture that may follow (two calls may be in flight there)
            pool.append(shape.native.new_handle())
        return _Pooled(native, pool)

    # ---- dispatch ----------------------------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                 cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None, use_fp8: bool = True,
                 round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                 return_recv_hook: bool = False):
        """Sends each (token, expert) pair of `topk_idx` ([N, K] int64, -1: none) to the expert's rank: the kernel
        sends a token once to each rank its experts live on, which fills a row per pair. `x`: [N, hidden] bfloat16,
        N <= num_max_dispatch_tokens_per_rank (T). Returns, as DeepEP, (recv_x, recv_count, handle, event, hook):
        recv_x [L, T * R, hidden] (with use_fp8 a tuple of float8_e4m3fn and its scales: float32
        [L, T * R, hidden / 128], or with use_ue8m0 (needs round_scale) int32 [L, T * R, hidden / 512] of four UE8M0
        exponents each; both column-major in their last two dimensions, as DeepEP lays them out), the rows of local
        expert j being [0, recv_count[j]) grouped by source rank (handle[1]); hook is None, or with return_recv_hook
        a callable that launches the receive half on the then-current stream (until then recv_x and recv_count are
        not written). cumulative_local_expert_recv_stats ([L] int32) gets each local expert's received rows added,
        dispatch_wait_recv_cost_stats ([R] int64) the GPU cycles the receive waited for each source rank. No host
        synchronisation."""
        if async_finish and return_recv_hook:
            raise InvalidArgumentError("low_latency_dispatch: async_finish and return_recv_hook exclude each other "
                                       "(the hook's receive half is what would be waited for), as in DeepEP")
        if use_ue8m0 and not (use_fp8 and round_scale):
            raise InvalidArgumentError("low_latency_dispatch: use_ue8m0 needs use_fp8 and round_scale (UE8M0 holds "
                                       "powers of two only), as in DeepEP")
        args = (num_max_dispatch_tokens_per_rank, num_experts, cumulative_local_expert_recv_stats,
                dispatch_wait_recv_cost_stats, use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook)
        if self._ext is not None:  # the fast path: the tensors go to C++ unexamined (it checks them)
            shape = self._recent.get((num_max_dispatch_tokens_per_rank, num_experts))
            if shape is not None:
                done = self._dispatch_in_extension(shape, x, topk_idx, *args)
                if done is not None:
                    return done
        torch = _torch()
        x = _check(x, torch.bfloat16, 2, "x")
        topk_idx = _check(topk_idx, torch.int64, 2, "topk_idx")
        n, hidden = x.shape
        if topk_idx.shape[0] != n:
            raise InvalidArgumentError(f"low_latency_dispatch: topk_idx has {topk_idx.shape[0]} rows, x {n}")
        shape = self._shape(num_max_dispatch_tokens_per_rank, hidden, num_experts, topk_idx.shape[1])
        self._recent[(num_max_dispatch_tokens_per_rank, num_experts)] = shape
        if self._ext is not None:
            return self._dispatch_in_extension(shape, x, topk_idx, *args)
        stats = self._stats(cumulative_local_expert_recv_stats, torch.int32, shape.local,
                            "cumulative_local_expert_recv_stats")
        wait_stats = self._stats(dispatch_wait_recv_cost_stats, torch.int64, self._ranks,
                                 "dispatch_wait_recv_cost_stats")
        stream = current_stream_handle()
        pooled = self._take_handle(shape)
        native_hook = _native_ep().LowLatencyHook() if return_recv_hook else None
        recv_x, recv_scales, recv_count = self._dispatch_by_pointers(shape, pooled, x, topk_idx, stats, wait_stats,
                                                                      use_fp8, round_scale, use_ue8m0, stream,
                                                                      native_hook)
        return self._dispatched(shape, pooled, native_hook, x, topk_idx, recv_x, recv_scales, recv_count, stats,
                                wait_stats, use_fp8, async_finish)

    def _dispatch_in_extension(self, shape: _Shape, x, topk_idx, tokens_per_rank: int, num_experts: int, stats,
                               wait_stats, use_fp8: bool, round_scale: bool, use_ue8m0: bool, async_finish: bool,
                               return_recv_hook: bool):
        """The call through gdx._gdx_torch, or None when x / topk_idx are not `shape`'s (another buffer's shapes)."""
        pooled = self._take_handle(shape)
        native_hook = _native_ep().LowLatencyHook() if return_recv_hook else None
        got = self._ext.ll_dispatch(shape.address, pooled.native.address, x, topk_idx, tokens_per_rank, num_experts,
                                    stats, wait_stats, use_fp8, round_scale, use_ue8m0,
                                    native_hook.address if native_hook is not None else 0)
        if got is None:
            return None
        recv_x, recv_scales, recv_count, x, topk_idx = got
        return self._dispatched(shape, pooled, native_hook, x, topk_idx, recv_x, recv_scales, recv_count, stats,
                                wait_stats, use_fp8, async_finish)

    def _dispatched(self, shape: _Shape, pooled: _Pooled, native_hook, x, topk_idx, recv_x, recv_scales, recv_count,
                    stats, wait_stats, use_fp8: bool, async_finish: bool):
        """DeepEP's return tuple of a dispatch that was launched."""
        handle = LowLatencyHandle(pooled, shape.key, self._device, self._ranks)
        hook = None
        if native_hook is not None:
            hook = self._hook(native_hook, (pooled, recv_x, recv_scales, recv_count, stats, wait_stats))
        event = end_event(async_finish, (x, topk_idx, recv_x, recv_scales, recv_count, stats, wait_stats))
        return (recv_x, recv_scales) if use_fp8 else recv_x, recv_count, handle, event, hook

    @staticmethod
    def _scales(x, shape: _Shape, hidden: int, use_fp8: bool, use_ue8m0: bool):
        """The received scales, DeepEP's layout: memory [L, groups, T * R], handed out as [L, T * R, groups]."""
        torch = _torch()
        if not use_fp8:
            return None
        if use_ue8m0:
            return x.new_empty((shape.local, hidden // _UE8M0_GROUP, shape.rows), dtype=torch.int32).transpose(1, 2)
        return x.new_empty((shape.local, hidden // 128, shape.rows), dtype=torch.float32).transpose(1, 2)

    def _dispatch_by_pointers(self, shape: _Shape, pooled: _Pooled, x, topk_idx, stats, wait_stats, use_fp8: bool,
                              round_scale: bool, use_ue8m0: bool, stream: int, native_hook):
        torch = _torch()
        hidden = x.shape[1]
        dims = (shape.local, shape.rows, hidden)
        recv_x = x.new_empty(dims, dtype=torch.float8_e4m3fn) if use_fp8 else x.new_empty(dims)
        recv_scales = self._scales(x, shape, hidden, use_fp8, use_ue8m0)
        recv_count = x.new_empty(shape.local, dtype=torch.int32)
        shape.native.dispatch_flat(x.data_ptr(), topk_idx.data_ptr(), x.shape[0], topk_idx.shape[1], use_fp8,
                                   round_scale, use_ue8m0, recv_x.data_ptr(), _address(recv_scales),
                                   recv_count.data_ptr(), _address(stats), _address(wait_stats), pooled.native,
                                   stream, native_hook)
        return recv_x, recv_scales, recv_count

    # ---- combine -----------------------------------------------------------------------------------------------
    def combine(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, use_logfmt: bool = False,
                zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False, out=None,
                combine_wait_recv_cost_stats=None):
        """Returns the rows of `handle`'s dispatch to their source tokens, summed weighted by `topk_weights`
        ([N, K] float32; `topk_idx` the dispatch's): each rank sums a token's rows of its experts with the source's
        weights and sends one row back, which the source adds up. `x`: [L, T * R, hidden] bfloat16 (the experts'
        outputs in the rows the dispatch wrote; with zero_copy the rows are read from
        get_next_low_latency_combine_buffer's tensor instead). Returns (combined_x [N, hidden] bfloat16 (`out`
        when given), event, hook), as DeepEP; with return_recv_hook the last sum is done by hook().
        combine_wait_recv_cost_stats ([R] int64) gets the GPU cycles the receive waited for each rank."""
        if async_finish and return_recv_hook:
            raise InvalidArgumentError("low_latency_combine: async_finish and return_recv_hook exclude each other")
        if type(handle) is not LowLatencyHandle:
            raise InvalidArgumentError("low_latency_combine: handle must be the one low_latency_dispatch returned")
        shape = self._shapes.get(handle._key)
        if shape is None:
            raise InvalidArgumentError("low_latency_combine: the handle is not one of this Buffer's")
        if zero_copy:
            if shape.zero_copy is None:
                raise InvalidArgumentError("low_latency_combine: zero_copy without get_next_low_latency_combine_buffer "
                                           "(fill that tensor with the rows first)")
            x = shape.zero_copy
        native_hook = _native_ep().LowLatencyHook() if return_recv_hook else None
        if self._ext is not None:  # the tensors go to C++ unexamined (it checks them)
            out, x, topk_idx, topk_weights = self._ext.ll_combine(
                shape.address, handle.native.address, x, topk_idx, topk_weights, out, combine_wait_recv_cost_stats,
                native_hook.address if native_hook is not None else 0)
        else:
            out, x, topk_idx, topk_weights = self._combine_by_pointers(shape, handle, x, topk_idx, topk_weights, out,
                                                                       combine_wait_recv_cost_stats, native_hook)
        hook = None
        if native_hook is not None:
            hook = self._hook(native_hook, (handle, x, topk_idx, topk_weights, out, combine_wait_recv_cost_stats))
        return out, end_event(async_finish, (x, topk_idx, topk_weights, out, combine_wait_recv_cost_stats)), hook

    def _combine_by_pointers(self, shape: _Shape, handle: LowLatencyHandle, x, topk_idx, topk_weights, out,
                             wait_stats, native_hook):
        torch = _torch()
        x = _check(x, torch.bfloat16, 3, "x")
        topk_idx = _check(topk_idx, torch.int64, 2, "topk_idx")
        topk_weights = _check(topk_weights, torch.float32, 2, "topk_weights")
        want = (shape.local, shape.rows, handle.hidden)
        if tuple(x.shape) != want:
            raise InvalidArgumentError(f"low_latency_combine: x is {tuple(x.shape)}, the dispatch received {want}")
        num_tokens = handle.num_tokens
        if tuple(topk_idx.shape) != (num_tokens, handle.num_topk) or topk_weights.shape != topk_idx.shape:
            raise InvalidArgumentError(
                f"low_latency_combine: topk_idx {tuple(topk_idx.shape)} and topk_weights "
                f"{tuple(topk_weights.shape)} must both be the dispatch's [{num_tokens}, {handle.num_topk}]")
        if out is not None:
            if not out.is_contiguous():  # a contiguous copy would be filled instead of the caller's tensor
                raise InvalidArgumentError("low_latency_combine: out must be contiguous (it is written in place)")
            out = _check(out, torch.bfloat16, 2, "out")
            if tuple(out.shape) != (num_tokens, handle.hidden):
                raise InvalidArgumentError(f"low_latency_combine: out is {tuple(out.shape)}, not "
                                           f"[{num_tokens}, {handle.hidden}]")
        else:
            out = x.new_empty((num_tokens, handle.hidden))
        wait_stats = self._stats(wait_stats, torch.int64, self._ranks, "combine_wait_recv_cost_stats")
        shape.native.combine_flat(x.data_ptr(), topk_idx.data_ptr(), topk_weights.data_ptr(), out.data_ptr(),
                                  _address(wait_stats), handle.native, current_stream_handle(), native_hook)
        return out, x, topk_idx, topk_weights

    def zero_copy_buffer(self, handle: LowLatencyHandle):
        shape = self._shapes.get(handle._key) if isinstance(handle, LowLatencyHandle) else None
        if shape is None:
            raise InvalidArgumentError("get_next_low_latency_combine_buffer: pass a handle of this Buffer's "
                                       "low_latency_dispatch")
        if shape.zero_copy is None:
            torch = _torch()
            shape.zero_copy = torch.empty((shape.local, shape.rows, handle.hidden), dtype=torch.bfloat16,
                                          device=handle._device)
        return shape.zero_copy

    # ---- masks -------------------------------------------------------------------------------------------------
    def _check_rank(self, rank: int, what: str) -> int:
        if not 0 <= rank < self._ranks:
            raise InvalidArgumentError(f"{what}: rank {rank} outside [0, {self._ranks})")
        return rank

    def _each_shape(self, what: str) -> List[_Shape]:
        if not self._shapes:
            raise InvalidArgumentError(f"{what}: no low-latency call was made yet (the masks belong to the buffers "
                                       "the first call of each shape makes)")
        return list(self._shapes.values())

    def update_mask(self, rank: int, masked: bool) -> None:
        rank = self._check_rank(rank, "low_latency_update_mask_buffer")
        stream = current_stream_handle()
        for shape in self._each_shape("low_latency_update_mask_buffer"):
            shape.native.update_mask(rank, bool(masked), stream)

    def query_mask(self, mask_status) -> None:
        torch = _torch()
        if (mask_status.dtype != torch.int32 or tuple(mask_status.shape) != (self._ranks,) or not mask_status.is_cuda
                or not mask_status.is_contiguous()):
            raise InvalidArgumentError(f"low_latency_query_mask_buffer: mask_status must be a contiguous CUDA int32 "
                                       f"tensor of [{self._ranks}], got {mask_status.dtype} "
                                       f"{tuple(mask_status.shape)} on {mask_status.device}")
        stream = current_stream_handle()
        shapes = self._each_shape("low_latency_query_mask_buffer")
        shapes[0].native.query_mask(mask_status.data_ptr(), stream)
        if len(shapes) > 1:  # a rank masked by the buffer of any shape is masked
            other = torch.empty_like(mask_status)
            for shape in shapes[1:]:
                shape.native.query_mask(other.data_ptr(), stream)
                mask_status.bitwise_or_(other)

    def clean_mask(self) -> None:
        stream = current_stream_handle()
        for shape in self._each_shape("low_latency_clean_mask_buffer"):
            shape.native.clean_mask(stream)

    def masked_ranks(self) -> List[int]:
        return sorted({r for shape in self._shapes.values() for r in shape.native.masked_ranks()})

    def local_buffer(self) -> Tuple[int, int]:
        shapes = self._each_shape("get_local_buffer_tensor(use_rdma_buffer=True)")
        return shapes[0].native.local_buffer()

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _stats(self, t, dtype, length: int, what: str):
        if t is None:
            return None
        if t.dtype != dtype or tuple(t.shape) != (length,) or not t.is_cuda or not t.is_contiguous():
            raise InvalidArgumentError(f"{what} must be a contiguous CUDA {dtype} tensor of [{length}], got {t.dtype} "
                                       f"{tuple(t.shape)} on {t.device}")
        return t

    def _hook(self, native_hook, keep: Tuple):
        """The callable DeepEP returns as its recv hook: runs the receive half on the current stream, once."""

        def hook():
            if self._closed:  # not after destroy(): the native buffer it would launch on is gone
                raise InvalidArgumentError("gdx.ep.Buffer.recv hook: used after destroy()")
            native_hook.run(current_stream_handle())

        hook.keep = keep  # the handle and tensors the receive half writes or reads stay alive until it ran
        return hook

    def close(self) -> None:
        """Drops every native buffer (each meets the other ranks as it goes), before the Buffer closes its Context."""
        self._closed = True
        self._recent.clear()
        self._shapes.clear()
        self._captured.clear()
