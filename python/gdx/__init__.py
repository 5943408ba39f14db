"""gdx: GPU-initiated one-sided communication (put / put_with_signal / signal / atomic_add) for Python.

    import gdx
    ctx = gdx.Context()                      # torchrun / mpirun variables; or gdx.Context.from_process_group(pg)
    w = ctx.register_window(tensor_or_array)
    ctx.channel(peer).put_with_signal(w, 0, w, 0, signal=0, value=1)
    ctx.wait(0, 1)

Subpackages: ``gdx.ep`` (MoE dispatch/combine with DeepEP's Buffer API), ``gdx.p2p`` (the P2P Endpoint with the
seed's names, and the URL transport RdmaTransport). ``python -m gdx.info`` prints what this build and machine offer.
The native part (gdx._gdx) takes raw pointers only; torch is imported lazily, never linked.
"""

from . import _gdx
from .context import Channel, Context, Window
from .errors import (CudaError, Error, InternalError, InvalidArgumentError, PeerFailedError, ProtocolError,
                     ShutdownError, SystemError, TimeoutError, VerbsError)

__version__ = _gdx.__version__

#: Size, alignment and field layout ({name: (offset, size)}) of the bytes Context.device_channel returns: a
#: ``gdx::ChannelDeviceHandle`` (include/gdx/device/channel.hpp), passed to kernels by value.
DEVICE_CHANNEL_SIZE = _gdx.DEVICE_CHANNEL_SIZE
DEVICE_CHANNEL_ALIGNMENT = _gdx.DEVICE_CHANNEL_ALIGNMENT
DEVICE_CHANNEL_LAYOUT = dict(_gdx.DEVICE_CHANNEL_LAYOUT)

__all__ = ["Context", "Window", "Channel", "Error", "InvalidArgumentError", "TimeoutError", "PeerFailedError",
           "ProtocolError", "SystemError", "CudaError", "VerbsError", "InternalError", "ShutdownError",
           "DEVICE_CHANNEL_SIZE", "DEVICE_CHANNEL_ALIGNMENT", "DEVICE_CHANNEL_LAYOUT", "__version__"]
