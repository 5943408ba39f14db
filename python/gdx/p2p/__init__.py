"""gdx.p2p: point-to-point transfers between any two processes that know each other's address, without a job.

- :class:`Endpoint` — gdx::p2p::Endpoint with the P2P engines' Python names (seed 002): ``Endpoint(local_gpu_idx,
  num_cpus)``, ``connect`` / ``accept`` / ``get_metadata`` / ``add_remote_endpoint`` / ``start_passive_accept``,
  ``reg``, ``send`` / ``recv``, ``sendv`` / ``recvv``, ``send_async`` / ``recv_async`` + ``poll_async``,
  ``advertise`` + ``read`` / ``write`` (v and async forms), the IPC forms.
- :class:`RdmaTransport`, :class:`RdmaMemory` (``create_view``, ``remote_key``, ``local_key``, ``get_device``,
  ``contains``), :class:`RdmaRemoteBuffer`, :class:`WriteFuture` (``get()`` -> :class:`CommResult`) — the URL
  transport under torchcomms' RdmaTransport names (gdx::p2p::RdmaTransport; seed 004): bind, connect() that returns
  at once, notified writes, wait_for_write. ``RegisteredMemory`` and ``RemoteBuffer`` are the earlier names.

Pointers with sizes, or arrays (torch tensors, numpy arrays, anything gdx.Context takes). Errors raise gdx.Error
subclasses; blocking calls release the GIL.
"""

from .endpoint import DESCRIPTOR_BYTES, Endpoint
from .url_transport import (CommResult, RdmaMemory, RdmaMemoryView, RdmaRemoteBuffer, RdmaTransport, RegisteredMemory,
                            RemoteBuffer, WriteFuture)

__all__ = ["Endpoint", "DESCRIPTOR_BYTES", "RdmaTransport", "RdmaMemory", "RdmaMemoryView", "RdmaRemoteBuffer",
           "CommResult", "RegisteredMemory", "RemoteBuffer", "WriteFuture"]
