"""gdx.ep: MoE expert-parallel dispatch and combine with DeepEP's ``Buffer`` API, so that switching from DeepEP is
an import change (``from gdx.ep import Buffer, Config, EventOverlap``). Normal (high-throughput) mode over the
ranks of one host (NVLink), ranks on other hosts through the proxy (num_rdma_bytes); the low-latency mode raises
NotImplementedError until gdx has it.
Needs torch (imported when a Buffer is made) and a build of gdx with CUDA.
"""

from .buffer import Buffer, Config, DispatchHandle, EventOverlap

__all__ = ["Buffer", "Config", "DispatchHandle", "EventOverlap"]
