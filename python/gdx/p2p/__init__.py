"""gdx.p2p: point-to-point transfers between any two processes that know each other's address, without a job.

- :class:`Endpoint` — gdx::p2p::Endpoint with the P2P engines' Python names (seed 002): ``Endpoint(local_gpu_idx,
  num_cpus)``, ``connect`` / ``accept`` / ``get_metadata`` / ``add_remote_endpoint`` / ``start_passive_accept``,
  ``reg``, ``send`` / ``recv``, ``sendv`` / ``recvv``, ``send_async`` / ``recv_async`` + ``poll_async``,
  ``advertise`` + ``read`` / ``write`` (v and async forms), the IPC forms.
- :class:`RdmaTransport`, :class:`RegisteredMemory`, :class:`RemoteBuffer`, :class:`WriteFuture` — the URL
  transport (gdx::p2p::UrlTransport; seed 004): bind / connect URLs, notified writes, wait_for_write.

Pointers with sizes, or arrays (torch tensors, numpy arrays, anything gdx.Context takes). Errors raise gdx.Error
subclasses; blocking calls release the GIL.
"""

from .endpoint import DESCRIPTOR_BYTES, Endpoint
from .url_transport import RdmaTransport, RegisteredMemory, RemoteBuffer, WriteFuture

__all__ = ["Endpoint", "DESCRIPTOR_BYTES", "RdmaTransport", "RegisteredMemory", "RemoteBuffer", "WriteFuture"]
