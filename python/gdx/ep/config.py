"""gdx.ep.Config: DeepEP's Config (SMs and chunk sizes) and its buffer-size hints."""

from typing import Optional

from ._native import native_ep


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
        c = native_ep().Config.for_ranks(num_ranks)
        c.num_sms = self.num_sms
        if self.num_threads is not None:
            c.num_threads = self.num_threads
        return c

    def __repr__(self) -> str:
        return f"gdx.ep.Config(num_sms={self.num_sms}, num_threads={self.num_threads})"
