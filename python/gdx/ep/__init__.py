"""gdx.ep: MoE expert-parallel dispatch and combine with DeepEP's ``Buffer`` API, so that switching from DeepEP is
an import change (``from gdx.ep import Buffer, Config, EventOverlap``). Normal (high-throughput) mode over the
ranks of one host (NVLink), ranks on other hosts through the proxy (num_rdma_bytes); the low-latency mode
(``Buffer(group, 0, num_rdma_bytes, low_latency_mode=True)``, low_latency_dispatch / low_latency_combine, recv
hooks, CUDA graphs) with the puts issued by the kernels, one per (token, rank) in dispatch.
Needs torch (imported when a Buffer is made) and a build of gdx with CUDA.
"""

from .buffer import Buffer, Config, DispatchHandle, EventOverlap
from .low_latency import LowLatencyHandle

__all__ = ["Buffer", "Config", "DispatchHandle", "EventOverlap", "LowLatencyHandle"]
