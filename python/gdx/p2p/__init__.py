"""gdx.p2p: the point-to-point Endpoint (seed 002's API: Endpoint(local_gpu_idx, num_cpus), connect, accept, reg,
send/recv, read/write, advertise, the IPC forms) and the URL transport of seed 004 (RdmaTransport).

Not bound yet: the C++ endpoint (p2p/, include/gdx/p2p/) is being built. When it lands, this package becomes a thin
layer like gdx.ep: the extension binds gdx::p2p::Endpoint in python/src/p2p_api.cpp (raw pointers and sizes), and
this file turns tensors into them with gdx._arrays.raw_view and returns the seed's tuples. Until then, using it
raises NotImplementedError naming what is missing.
"""

_MISSING = ("gdx.p2p.{name} is not available yet: the P2P endpoint (the C++ gdx::p2p layer) is not part of this "
            "build; gdx.Context offers one-sided put/signal between ranks meanwhile")


def __getattr__(name: str):
    if name in ("Endpoint", "RdmaTransport"):
        raise NotImplementedError(_MISSING.format(name=name))
    raise AttributeError(f"module 'gdx.p2p' has no attribute {name!r}")
