"""The low-latency mode of gdx.ep.Buffer (DeepEP's low_latency_dispatch / low_latency_combine) over
gdx::ep::LowLatencyBuffer (include/gdx/ep/low_latency.hpp): the kernels issue the puts (a token once per rank its
experts live on in dispatch, the weighted sum of its rows there back in combine), no host synchronisation, so both
calls can be captured in a CUDA graph.

What differs from DeepEP, each on purpose:
- The native buffer's shapes are fixed when it is made: gdx makes one per (num_max_dispatch_tokens_per_rank, hidden,
  num_experts, top-k) at the first call with them (collective: every rank makes the same calls in the same order),
  checked against the num_rdma_bytes the Buffer was given. Warm up outside a graph capture first.
- FP8 scales are float32 [L, T * R, hidden / 128], contiguous (DeepEP gives a transposed view); round_scale rounds
  them up to powers of two; use_ue8m0's packed scales, use_logfmt and zero_copy are not offered.
- clean_low_latency_buffer is not needed (calls are sequence-numbered) and does nothing.
"""

import weakref
from typing import Any, Dict, List, Optional, Tuple

from .. import _gdx
from .._arrays import DeviceArray
from ..errors import InvalidArgumentError
from ._torch import torch as _torch


class _PooledHandle:
    """A native LowLatencyHandle taken from its buffer's pool; back in the pool once nothing refers to this (the
    LowLatencyHandle and the tensors viewing its memory), unless a CUDA graph captured it: the graph's replays
    write it, so it is never handed out again."""

    def __init__(self, native: Any, pool: Optional[List[Any]]):
        self.native = native
        if pool is not None:
            weakref.finalize(self, pool.append, native)


class LowLatencyHandle:
    """What low_latency_dispatch returns for its combine. Indexed or unpacked like DeepEP's tuple: (src_info
    [L, T * R] int32 (source token of each row), layout_range [L, R] int64 ((first row << 32) | rows per source rank),
    num_max_dispatch_tokens_per_rank, hidden, num_experts). ``src_slot`` says which top-k slot of its token each row
    fills (a token naming one expert in two slots arrives as two rows)."""

    def __init__(self, pooled: _PooledHandle, key: Tuple, device: Any, ranks: int, num_tokens: int):
        self._pooled = pooled
        self._key = key  # the native buffer's: (tokens per rank, hidden, experts, top-k)
        self._device = device
        self._ranks = ranks
        self.num_tokens = num_tokens
        self.tokens_per_rank, self.hidden, self.num_experts, self.num_topk = key
        self._shape = (self.num_experts // ranks, self.tokens_per_rank * ranks)

    # The tensors are made on first use, not in the dispatch: a dispatch inside a CUDA graph capture then makes no
    # call but its kernel launches.
    def _view(self, ptr: int, shape: Tuple[int, ...], typestr: str):
        return _torch().as_tensor(DeviceArray(ptr, shape, typestr, self._pooled), device=self._device)

    @property
    def src_info(self):
        return self._view(self.native.src_info, self._shape, "<i4")

    @property
    def src_slot(self):
        return self._view(self.native.src_slot, self._shape, "<i4")

    @property
    def layout_range(self):
        return self._view(self.native.layout_range, (self._shape[0], self._ranks), "<i8")

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


class LowLatencyState:
    """The native low-latency buffers of one gdx.ep.Buffer, by shape, with their pools of handles."""

    def __init__(self, context: Any, num_rdma_bytes: int):
        self._context = context
        self._num_rdma_bytes = num_rdma_bytes
        self._buffers: Dict[Tuple, Any] = {}
        self._pools: Dict[Tuple, List[Any]] = {}
        self._captured: List[Any] = []  # handles a CUDA graph captured

    @staticmethod
    def native_config(tokens_per_rank: int, hidden: int, num_experts: int, max_topk: int):
        c = _gdx.ep.LowLatencyConfig()
        c.max_tokens_per_rank = tokens_per_rank
        c.hidden = hidden
        c.num_experts = num_experts
        c.max_topk = max_topk
        return c

    def buffer(self, tokens_per_rank: int, hidden: int, num_experts: int, topk: int):
        key = (tokens_per_rank, hidden, num_experts, topk)
        native = self._buffers.get(key)
        if native is None:
            cfg = self.native_config(*key)
            ranks = self._context.world_size
            gpu, host = _gdx.ep.low_latency_bytes_hint(cfg, ranks, ranks - 1)
            if self._num_rdma_bytes and gpu + host > self._num_rdma_bytes:
                raise InvalidArgumentError(
                    f"low_latency_dispatch: {tokens_per_rank} tokens per rank of hidden {hidden}, {num_experts} "
                    f"experts, top-{topk} need up to {gpu + host} bytes, more than num_rdma_bytes "
                    f"{self._num_rdma_bytes} (Buffer.get_low_latency_rdma_size_hint)")
            native = _gdx.ep.LowLatencyBuffer(self._context._native, cfg)
            self._buffers[key] = native
            # Two handles at once (two calls may be in flight), made now: a graph capture cannot allocate them.
            self._pools[key] = [native.new_handle(), native.new_handle()]
        return key, native

    def take_handle(self, key: Tuple) -> _PooledHandle:
        pool = self._pools[key]
        if _torch().cuda.is_current_stream_capturing():
            if not pool:  # making one allocates and synchronises, which a capture does not allow
                raise InvalidArgumentError(
                    "low_latency_dispatch in a CUDA graph capture: no free handle (each capture keeps the ones it "
                    "takes; the calls outside a capture keep two ready): make an eager call before this capture")
            # The graph's replays write this handle's memory: kept for good (dropping it would free the memory
            # during the capture, which invalidates it, and under the graph afterwards).
            native = pool.pop()
            self._captured.append(native)
            return _PooledHandle(native, None)
        native = pool.pop() if pool else self._buffers[key].new_handle()
        while len(pool) < 2:  # two ready for a capture that may follow (two calls may be in flight there)
            pool.append(self._buffers[key].new_handle())
        return _PooledHandle(native, pool)

    def native(self, key: Tuple):
        return self._buffers[key]

    def close(self) -> None:
        self._buffers.clear()
        self._pools.clear()
        self._captured.clear()
