# Stubs of the extension module gdx._gdx (python/src/). Users call the gdx package, which wraps these.
from typing import Callable, Dict, List, Optional, Tuple

__version__: str
ERROR_CODE_NAMES: List[str]
DEVICE_CHANNEL_SIZE: int
DEVICE_CHANNEL_ALIGNMENT: int
DEVICE_CHANNEL_LAYOUT: Dict[str, Tuple[int, int]]

def default_timeout_ms() -> int: ...
def ep_available() -> bool: ...
def _set_error_classes(classes: Dict[str, type]) -> None: ...

class _Window:
    id: int
    ptr: int
    nbytes: int
    kind: str
    name: str
    valid: bool
    def remote_size(self, peer: int) -> int: ...
    def close(self) -> None: ...

class _Channel:
    peer: int
    ring: int
    def put(self, dst: _Window, dst_offset: int, src: _Window, src_offset: int, nbytes: int) -> None: ...
    def put_with_signal(self, dst: _Window, dst_offset: int, src: _Window, src_offset: int, nbytes: int,
                        signal: int, value: int, op: str) -> None: ...
    def signal(self, signal: int, value: int, op: str) -> None: ...
    def atomic_add(self, dst: _Window, dst_offset: int, value: int) -> None: ...
    def flush(self) -> None: ...

class _Context:
    rank: int
    world_size: int
    local_rank: int
    num_signals: int
    timeout_ms: int
    transport: str
    has_gpu: bool
    closed: bool
    def __init__(self) -> None: ...
    @staticmethod
    def from_config(rank: int, world_size: int, local_rank: int, master_addr: str, master_port: int, secret: str,
                    timeout_ms: int, publish_port: Optional[Callable[[int], None]]) -> "_Context": ...
    def register_window(self, ptr: int, nbytes: int, kind: str, name: str) -> _Window: ...
    def channel(self, peer: int, ring: int = ...) -> _Channel: ...
    def device_channel(self, peer: int, ring: int = ...) -> bytes: ...
    def wait(self, signal: int, value: int, timeout_ms: int) -> None: ...
    def signal_value(self, signal: int) -> int: ...
    def set_signal(self, signal: int, value: int) -> None: ...
    def is_direct(self, peer: int) -> bool: ...
    def failure(self) -> str: ...
    def barrier(self) -> None: ...
    def close(self) -> None: ...

# The submodule gdx._gdx.ep (builds with CUDA only; ep_available() says), written as a namespace class.
class ep:
    MAX_RANKS: int
    MAX_EXPERTS: int
    MAX_TOPK: int
    FP8_SCALE_BLOCK: int

    class DType:
        bfloat16: "ep.DType"
        float8_e4m3: "ep.DType"

    class Config:
        num_sms: int
        num_threads: int
        @staticmethod
        def for_ranks(num_ranks: int) -> "ep.Config": ...

    class DispatchInputs:
        num_tokens: int
        hidden: int
        num_topk: int
        num_experts: int
        dtype: "ep.DType"
        x: int
        x_scales: int
        topk_idx: int
        topk_weights: int

    class DispatchOutputs:
        capacity: int
        recv_x: int
        recv_x_scales: int
        recv_topk_idx: int
        recv_topk_weights: int
        recv_src_idx: int
        num_recv_tokens_per_expert: int
        num_recv_tokens: int

    class CombineInputs:
        x: int
        topk_weights: int
        bias0: int
        bias1: int

    class CombineOutputs:
        combined_x: int
        combined_topk_weights: int

    class DispatchHandle:
        max_tokens: int
        num_tokens: int
        hidden: int
        num_topk: int
        num_recv_tokens: int

    class Buffer:
        rank: int
        num_ranks: int
        config: "ep.Config"
        def __init__(self, context: _Context, nvl_bytes: int, rdma_bytes: int, config: "ep.Config") -> None: ...
        def max_tokens_per_rank(self, hidden: int, num_topk: int, dtype: "ep.DType") -> int: ...
        def new_handle(self, max_tokens: int) -> "ep.DispatchHandle": ...
        def get_dispatch_layout(self, topk_idx: int, num_tokens: int, num_topk: int, num_experts: int,
                                per_rank: int, per_expert: int, in_rank: int, stream: int) -> None: ...
        def dispatch_prepare(self, inputs: "ep.DispatchInputs", handle: "ep.DispatchHandle", expert_alignment: int,
                             stream: int, num_recv_tokens_per_expert: int = ...) -> Tuple[int, List[int]]: ...
        def dispatch(self, inputs: "ep.DispatchInputs", handle: "ep.DispatchHandle", out: "ep.DispatchOutputs",
                     stream: int) -> None: ...
        def dispatch_worst(self, inputs: "ep.DispatchInputs", handle: "ep.DispatchHandle",
                           out: "ep.DispatchOutputs", num_worst_tokens: int, expert_alignment: int,
                           stream: int) -> None: ...
        def combine(self, inputs: "ep.CombineInputs", handle: "ep.DispatchHandle", out: "ep.CombineOutputs",
                    stream: int) -> None: ...
        def counts_matrix(self, handle: "ep.DispatchHandle") -> int: ...
        def check_errors(self) -> None: ...
