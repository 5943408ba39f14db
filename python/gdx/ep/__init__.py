"""gdx.ep: MoE expert-parallel dispatch and combine with DeepEP V1's ``Buffer`` API, so that switching from DeepEP
is an import change: a ``deep_ep`` module of one line, ``from gdx.ep import *``, runs DeepEP's own tests. Normal
(high-throughput) mode over the ranks of one host (NVLink), ranks on other hosts through the proxy
(num_rdma_bytes); the low-latency mode (``Buffer(group, 0, num_rdma_bytes, low_latency_mode=True)``,
low_latency_dispatch / low_latency_combine, recv hooks, CUDA graphs) with the puts issued by the kernels.
Needs torch (imported when a Buffer is made, or topk_idx_t read) and a build of gdx with CUDA.
"""

from .buffer import Buffer, DispatchHandle
from .config import Config
from .events import EventOverlap
from .low_latency import LowLatencyHandle

__all__ = ["Buffer", "Config", "DispatchHandle", "EventOverlap", "LowLatencyHandle", "topk_idx_t"]


def __getattr__(name: str):
    # topk_idx_t is torch.int64 (DeepEP's default build); read lazily so that importing gdx.ep does not import torch.
    if name == "topk_idx_t":
        from ._torch import torch
        return torch().int64
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
