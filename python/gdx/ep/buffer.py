"""gdx.ep.Buffer: DeepEP V1's Buffer (names, arguments, return tuples, semantics) over gdx::ep::Buffer (normal mode)
and gdx::ep::LowLatencyBuffer (low-latency mode, gdx/ep/low_latency.py), so that switching from DeepEP is an import
change. Differences, each on purpose (README, "Migrating from DeepEP"):
- Kernels run on the current stream (``torch.cuda.current_stream()``): ``previous_event`` is waited for first,
  ``async_finish`` returns an event recorded after them, ``allocate_on_comm_stream`` has nothing to move, and
  ``get_comm_stream()`` is a stream no gdx kernel uses (waiting for it is a no-op).
- The kernel shape is the Buffer's (``Buffer.set_num_sms`` before constructing, or ``config=`` of the constructor);
  a per-call ``config`` is accepted and not applied (gdx's kernels size their chunks from the buffer).
- The dispatch handle is a :class:`DispatchHandle`; indexed like DeepEP's tuple it gives ``handle[0]``
  (rank_prefix_matrix), ``handle[3]`` (recv_src_idx) and ``handle[4]`` (is_token_in_rank, when given).
- Arguments that select hardware gdx does not use here (``use_fabric``, ``allow_mnnvl``, ``num_qps_per_rank``,
  ``allow_nvlink_for_low_latency_mode``) are accepted and kept as attributes: ranks of one host always meet over
  NVLink through CUDA IPC, ranks of other hosts through gdx's proxy.
"""

import weakref
from typing import Any, List, Optional, Tuple, Union

from .._arrays import DeviceArray
from ..context import Context
from ..errors import InvalidArgumentError
from ._native import address as _address
from ._native import fp8_dtype as _fp8_dtype
from ._native import native_dtype as _native_dtype
from ._native import native_ep as _native_ep
from ._native import torch_extension
from ._torch import check as _check_tensor
from ._torch import current_stream_handle
from ._torch import torch as _torch
from .config import Config
from .events import EventOverlap, capture, end_event
from .low_latency import LowLatencyHandle, LowLatencyMode

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
    """MoE dispatch/combine buffers over the ranks of `group` (a torch.distributed group, or a gdx.Context; or, with
    group None, an mpi4py communicator `comm`): ranks of one host over NVLink (at most 8 per host), others through
    the proxy (num_rdma_bytes). Collective.

    num_nvl_bytes: GPU memory each rank lends its peers (Config.get_nvl_buffer_size_hint); num_rdma_bytes: the
    window space staging rows for ranks on other hosts (gdx::ep::Buffer's rdmaBytes; 0 when every rank is on this
    host), and with low_latency_mode the low-latency mode's bound (get_low_latency_rdma_size_hint).
    enable_shrink: DeepEP's masking of failed ranks; gdx's low-latency mode always masks a rank that stopped
    answering (its tokens count as not sent) and offers the mask calls either way.
    Call ``torch.cuda.set_device(local_rank)`` before making it: its GPU is the current one.
    """

    num_sms: int = 24

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, use_fabric: bool = False, explicitly_destroy: bool = False,
                 enable_shrink: bool = False, comm: Any = None, *, config: Optional[Config] = None):
        native_ep = _native_ep()
        if group is None and comm is None:
            raise InvalidArgumentError("gdx.ep.Buffer: either group or comm must be given")
        if isinstance(group, Context):
            self._context, self._owns_context = group, False
        elif group is not None:
            self._context, self._owns_context = Context.from_process_group(group), True
        else:
            self._context, self._owns_context = Context.from_mpi(comm), True
        self.group = group if group is not None else comm
        self.rank = self._context.rank
        self.group_size = self._context.world_size
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        # Accepted for DeepEP's signature; gdx picks its paths itself (module docstring).
        self.num_qps_per_rank = num_qps_per_rank
        self.allow_nvlink_for_low_latency_mode = allow_nvlink_for_low_latency_mode
        self.allow_mnnvl = allow_mnnvl
        self.use_fabric = use_fabric
        # The normal mode's buffer, unless the Buffer is for the low-latency mode only (DeepEP's num_nvl_bytes 0).
        self.runtime = None
        if not low_latency_mode or num_nvl_bytes > 0:
            cfg = (config or Config(Buffer.num_sms))._native(self.group_size)
            self.runtime = native_ep.Buffer(self._context._native, num_nvl_bytes,
                                            0 if low_latency_mode else num_rdma_bytes, cfg)
        self._ext = torch_extension()  # the per-call fast path, where it was built (gdx/ep/_native.py)
        self._address = self.runtime.address if self.runtime is not None else 0
        self._handles: dict = {}  # free native handles by capacity, reused in stream order
        self._low_latency = LowLatencyMode(self._context, num_rdma_bytes) if low_latency_mode else None
        self._comm_stream = None
        self._destroyed = False

    # ---- DeepEP's static helpers -------------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        """Whether gdx's kernels were built for SM90 (Hopper), which FP8 needs: every build with CUDA is."""
        from .. import _gdx
        return bool(_gdx.ep_available())

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
        return capture()

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """Bytes (GPU window plus pinned host memory) the low-latency mode takes for these shapes at most: every
        other rank on another host, top-k up to gdx.ep's MAX_TOPK. Pass it as num_rdma_bytes."""
        return LowLatencyMode.bytes_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def get_comm_stream(self):
        """DeepEP's communication stream. gdx's kernels run on the current stream, so no gdx work is ever queued on
        this one: making a stream wait for it is a no-op, as it should be (the calls were stream-ordered)."""
        if self._comm_stream is None:
            self._comm_stream = _torch().cuda.Stream()
        return self._comm_stream

    def get_local_buffer_tensor(self, dtype, size=None, offset: int = 0, use_rdma_buffer: bool = False):
        """This rank's buffer memory as a 1-d tensor of `dtype` from element `offset` (viewed as `size` when given),
        as DeepEP: the normal mode's NVLink buffer, or with use_rdma_buffer the low-latency mode's GPU window (of the
        shapes of its first call). The kernels own what they store there between calls."""
        torch = _torch()
        if use_rdma_buffer:
            ptr, nbytes = self._ll_state("get_local_buffer_tensor").local_buffer()
        else:
            self._begin(None)
            ptr, nbytes = self.runtime.local_buffer()
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = nbytes // itemsize - offset
        if offset < 0 or count <= 0:
            raise InvalidArgumentError(f"get_local_buffer_tensor: offset {offset} outside the buffer's "
                                       f"{nbytes // itemsize} elements of {dtype}")
        raw = torch.as_tensor(DeviceArray(ptr + offset * itemsize, (count * itemsize,), "|u1", self),
                              device=f"cuda:{torch.cuda.current_device()}")
        tensor = raw.view(dtype)
        if size is None:
            return tensor
        size = torch.Size(size)
        if size.numel() > tensor.numel():
            raise InvalidArgumentError(f"get_local_buffer_tensor: size {tuple(size)} is more than the "
                                       f"{tensor.numel()} elements from offset {offset}")
        return tensor[:size.numel()].view(size)

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
        topk_idx = _check_tensor(topk_idx, torch.int64, 2, "topk_idx")
        n, k = topk_idx.shape
        per_rank = topk_idx.new_empty(self.group_size, dtype=torch.int32)
        per_expert = topk_idx.new_empty(num_experts, dtype=torch.int32)
        in_rank = topk_idx.new_empty((n, self.group_size), dtype=torch.bool)
        self.runtime.get_dispatch_layout(topk_idx.data_ptr(), n, k, num_experts, per_rank.data_ptr(),
                                         per_expert.data_ptr(), in_rank.data_ptr(), stream)
        return per_rank, None, per_expert, in_rank, end_event(async_finish, (topk_idx,))

    # ---- dispatch ----------------------------------------------------------------------------------------------
    def dispatch(self, x: Union[Any, Tuple[Any, Any]], handle: Optional[DispatchHandle] = None,
                 num_tokens_per_rank=None, num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                 num_tokens_per_expert=None, topk_idx=None, topk_weights=None, expert_alignment: int = 1,
                 num_worst_tokens: int = 0, config: Optional[Config] = None,
                 previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                 allocate_on_comm_stream: bool = False):
        """Sends each token to the ranks of its top-k experts (`topk_idx`), or, without top-k, to the ranks
        `is_token_in_rank` names (then each local expert's count is the sum of the sources' `num_tokens_per_expert`
        and no top-k is received), as DeepEP. `x`: [N, hidden] bfloat16, or (float8_e4m3fn [N, hidden], float32
        scales [N, hidden / 128]). Returns (recv_x (a tuple for FP8), recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event); the cached form (`handle` given, no topk) returns (recv_x,
        None, None, None, None, event). recv_topk_idx holds local expert ids, -1 where the expert is on another
        rank. num_worst_tokens > 0: no host synchronisation, outputs of that many rows, the list is empty."""
        if handle is not None and self._ext is not None:  # the tensors go to C++ unexamined (it checks them)
            self._begin_in_extension(previous_event)
            return self._cached_dispatch_in_extension(x, handle, topk_idx, topk_weights, async_finish)
        stream = self._begin(previous_event)
        x, x_scales, n, hidden = self._check_x(*(x if isinstance(x, tuple) else (x, None)))
        if handle is not None:
            self._check_cached(handle, topk_idx, topk_weights)
            return self._cached_dispatch(x, x_scales, n, hidden, handle, stream, async_finish)

        torch = _torch()
        ep = _native_ep()
        num_experts = self._num_experts(num_tokens_per_expert)
        if topk_idx is not None:
            topk_idx = _check_tensor(topk_idx, torch.int64, 2, "topk_idx")
            k = topk_idx.shape[1]
            if topk_weights is not None:
                topk_weights = _check_tensor(topk_weights, torch.float32, 2, "topk_weights")
            by_rank = (0, 0)
        else:
            # DeepEP's dispatch without top-k: routed by is_token_in_rank, each local expert's count the sum of the
            # sources' num_tokens_per_expert; no top-k is received.
            if topk_weights is not None:
                raise InvalidArgumentError("dispatch: topk_weights without topk_idx")
            if is_token_in_rank is None:
                raise InvalidArgumentError("dispatch: topk_idx or is_token_in_rank (from get_dispatch_layout) is "
                                           "needed unless a handle is given")
            is_token_in_rank = _check_tensor(is_token_in_rank, torch.bool, 2, "is_token_in_rank")
            if tuple(is_token_in_rank.shape) != (n, self.group_size):
                raise InvalidArgumentError(f"dispatch: is_token_in_rank is {tuple(is_token_in_rank.shape)}, not "
                                           f"[{n}, {self.group_size}] (tokens, ranks)")
            num_tokens_per_expert = _check_tensor(num_tokens_per_expert, torch.int32, 1, "num_tokens_per_expert")
            k = 0
            by_rank = (is_token_in_rank.data_ptr(), num_tokens_per_expert.data_ptr())
        inputs = ep.DispatchInputs(x.data_ptr(), _address(x_scales), n, hidden, _native_dtype(x_scales is not None),
                                   _address(topk_idx), _address(topk_weights), k, num_experts,
                                   is_token_in_rank=by_rank[0], num_tokens_per_expert=by_rank[1])
        native_handle = self._take_handle(n)
        if num_worst_tokens > 0:
            rows, counts = num_worst_tokens, []
        else:
            rows, counts = self.runtime.dispatch_prepare(inputs, native_handle, expert_alignment, stream)
        recv_x, recv_scales = self._alloc_recv(x, x_scales, rows, hidden)
        # Rows past the received count (num_worst_tokens) select no expert, as DeepEP's do.
        recv_topk_idx = None
        if topk_idx is not None:
            recv_topk_idx = (x.new_full((rows, k), -1, dtype=torch.int64) if num_worst_tokens > 0 else
                             x.new_empty((rows, k), dtype=torch.int64))
        recv_topk_weights = x.new_empty((rows, k), dtype=torch.float32) if topk_weights is not None else None
        recv_src_idx = x.new_empty(rows, dtype=torch.int32)
        # The per-expert and received counts stay on the device after a num_worst_tokens dispatch and are returned
        # by neither form (DeepEP's list is empty then): their outputs are left null.
        out = ep.DispatchOutputs(rows, recv_x.data_ptr(), _address(recv_scales), _address(recv_topk_idx),
                                 _address(recv_topk_weights), recv_src_idx.data_ptr())
        if num_worst_tokens > 0:
            self.runtime.dispatch_worst(inputs, native_handle, out, num_worst_tokens, expert_alignment, stream)
        else:
            self.runtime.dispatch(inputs, native_handle, out, stream)
        handle = DispatchHandle(self, native_handle, n, hidden, None if num_worst_tokens else rows, recv_src_idx,
                                num_worst_tokens, is_token_in_rank)
        self._recycle_later(handle)
        event = end_event(async_finish, (x, x_scales, topk_idx, topk_weights, recv_x, recv_scales))
        return ((recv_x, recv_scales) if x_scales is not None else recv_x, recv_topk_idx, recv_topk_weights,
                list(counts), handle, event)

    @staticmethod
    def _check_cached(handle, topk_idx, topk_weights) -> None:
        if topk_idx is not None or topk_weights is not None:
            raise InvalidArgumentError("dispatch: the cached form (handle given) takes no topk_idx/topk_weights")
        if type(handle) is not DispatchHandle:
            raise InvalidArgumentError("dispatch: handle must be the DispatchHandle a dispatch returned")

    def _cached_dispatch_in_extension(self, x, handle: DispatchHandle, topk_idx, topk_weights, async_finish: bool):
        """The cached form through gdx._gdx_torch: one call that checks x, makes the outputs and launches on the
        current stream (at small token counts this call's host time is what the GPU waits for)."""
        self._check_cached(handle, topk_idx, topk_weights)
        x, x_scales = x if type(x) is tuple else (x, None)
        recv_x, recv_scales, x, x_scales = self._ext.cached_dispatch(self._address, handle._native.address, x,
                                                                     x_scales, handle.rows)
        event = end_event(async_finish, (x, x_scales, recv_x, recv_scales))
        return (recv_x, recv_scales) if x_scales is not None else recv_x, None, None, None, None, event

    def _cached_dispatch(self, x, x_scales, n: int, hidden: int, handle: DispatchHandle, stream: int,
                         async_finish: bool):
        """The cached form on the pointer path: one native call, with every field as an argument."""
        recv_x, recv_scales = self._alloc_recv(x, x_scales, handle.rows, hidden)
        self.runtime.dispatch_flat(handle._native, x.data_ptr(), _address(x_scales), n, hidden,
                                   _native_dtype(x_scales is not None), handle.rows, recv_x.data_ptr(),
                                   _address(recv_scales), stream)
        event = end_event(async_finish, (x, x_scales, recv_x, recv_scales))
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
        self._begin_in_extension(previous_event)
        x = _check_tensor(x, torch.bfloat16, 2, "x")
        if x.shape[0] < (handle.rows or 0) or x.shape[1] != handle.hidden:
            raise InvalidArgumentError(f"combine: x is {tuple(x.shape)}, the dispatch received "
                                       f"[{handle.rows}, {handle.hidden}]")
        if topk_weights is not None:
            topk_weights = _check_tensor(topk_weights, torch.float32, 2, "topk_weights")
        bias0, bias1 = self._check_biases(bias) if bias is not None else (None, None)
        if self._ext is not None:
            combined_x, combined_w = self._ext.combine(self._address, handle._native.address, x, topk_weights, bias0,
                                                       bias1, handle.num_tokens)
        else:
            combined_w = None
            if topk_weights is not None:
                combined_w = x.new_empty((handle.num_tokens, topk_weights.shape[1]), dtype=torch.float32)
            combined_x = x.new_empty((handle.num_tokens, handle.hidden))
            self.runtime.combine_flat(handle._native, x.data_ptr(), _address(topk_weights), _address(bias0),
                                      _address(bias1), combined_x.data_ptr(), _address(combined_w),
                                      current_stream_handle())
        return combined_x, combined_w, end_event(async_finish, (x, topk_weights, bias0, bias1, combined_x))

    # ---- low-latency mode (gdx/ep/low_latency.py) -------------------------------------------------------------
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False):
        """DeepEP's low_latency_dispatch: LowLatencyMode.dispatch says what it returns."""
        return self._ll_state("low_latency_dispatch").dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats, use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, use_logfmt: bool = False,
                            zero_copy: bool = False, async_finish: bool = False, return_recv_hook: bool = False,
                            out=None, combine_wait_recv_cost_stats=None):
        """DeepEP's low_latency_combine: LowLatencyMode.combine says what it returns."""
        return self._ll_state("low_latency_combine").combine(x, topk_idx, topk_weights, handle, use_logfmt, zero_copy,
                                                            async_finish, return_recv_hook, out,
                                                            combine_wait_recv_cost_stats)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int = 0, hidden: int = 0,
                                 num_experts: int = 0) -> None:
        """Nothing to zero: gdx's low-latency calls are sequence-numbered (DeepEP must clean its buffer after normal
        mode used it; gdx's two modes have buffers of their own)."""
        self._ll_state("clean_low_latency_buffer")

    def get_next_low_latency_combine_buffer(self, handle: LowLatencyHandle):
        """The [L, T * R, hidden] bfloat16 tensor a ``low_latency_combine(..., zero_copy=True)`` of this handle's shapes
        reads its rows from (fill it with the experts' outputs instead of passing them as x)."""
        return self._ll_state("get_next_low_latency_combine_buffer").zero_copy_buffer(handle)

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Masks (mask=True) or unmasks `rank_to_mask` for the low-latency calls: a masked rank's tokens count as not
        sent and nothing is sent to it. Stream-ordered on the current stream."""
        self._ll_state("low_latency_update_mask_buffer").update_mask(rank_to_mask, mask)

    def low_latency_query_mask_buffer(self, mask_status) -> None:
        """Writes each rank's mask into `mask_status` ([num_ranks] int32 CUDA tensor, 1: masked), on the current
        stream; ranks gdx masked because they stopped answering are included."""
        self._ll_state("low_latency_query_mask_buffer").query_mask(mask_status)

    def low_latency_clean_mask_buffer(self) -> None:
        """Unmasks every rank (on the current stream)."""
        self._ll_state("low_latency_clean_mask_buffer").clean_mask()

    def low_latency_masked_ranks(self) -> List[int]:
        """Ranks the low-latency calls masked so far (dead or unreachable: their tokens count as not sent); reads
        host memory, no synchronisation."""
        return self._ll_state("low_latency_masked_ranks").masked_ranks()

    def _ll_state(self, what: str) -> LowLatencyMode:
        if self._destroyed:
            raise InvalidArgumentError(f"gdx.ep.Buffer.{what}: used after destroy()")
        if self._low_latency is None:
            raise InvalidArgumentError(f"gdx.ep.Buffer.{what}: the Buffer was made without low_latency_mode=True")
        return self._low_latency

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _begin_in_extension(self, previous_event: Optional[EventOverlap]) -> None:
        """Checks that the Buffer can run the normal mode and waits for `previous_event`: the start of a call whose
        kernels gdx._gdx_torch launches on the current stream (it reads the stream itself)."""
        if self._destroyed:
            raise InvalidArgumentError("gdx.ep.Buffer: used after destroy()")
        if self.runtime is None:
            raise InvalidArgumentError("gdx.ep.Buffer: made for the low-latency mode only (num_nvl_bytes 0): "
                                       "give num_nvl_bytes for dispatch/combine")
        if previous_event is not None and previous_event.event is not None:
            previous_event.current_stream_wait()

    def _begin(self, previous_event: Optional[EventOverlap]) -> int:
        """_begin_in_extension, then the current stream's handle, where the kernels go."""
        self._begin_in_extension(previous_event)
        return current_stream_handle()

    def _check_x(self, x, x_scales):
        """dispatch's `x`: [N, hidden] bfloat16, or float8_e4m3fn with float32 scales [N, hidden / 128]. Returns
        (x, x_scales, N, hidden), each shape read once: at small token counts the host time is the call's."""
        torch = _torch()
        if x_scales is None:
            x = _check_tensor(x, torch.bfloat16, 2, "x")
            n, hidden = x.shape
            return x, None, n, hidden
        fp8 = _fp8_dtype()
        if fp8 is None or x.dtype != fp8:
            raise InvalidArgumentError(f"x: an FP8 dispatch takes (float8_e4m3fn, float32 scales), got {x.dtype}")
        x = _check_tensor(x, fp8, 2, "x")
        x_scales = _check_tensor(x_scales, torch.float32, 2, "x_scales")
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
        return tuple(_check_tensor(b, torch.bfloat16, 2, "bias") if b is not None else None for b in biases)

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
