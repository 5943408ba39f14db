"""gdx.Context, gdx.Window, gdx.Channel: the host API of gdx for Python.

A Context is this process's membership in a gdx job. ``gdx.Context()`` joins the job the launcher describes
(torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, mpirun's OMPI_*, Slurm's, or GDX_*);
``gdx.Context.from_process_group(group)`` joins one made of a torch.distributed group's ranks, with the group's
store carrying the rendezvous address. Windows are registered collectively (same order on every rank); a Channel
to a peer puts bytes of a local window into the peer's copy of a window and raises the peer's signals.
"""

import itertools
import os
import secrets
import weakref
from typing import Any, Optional, Union

from . import _args, _gdx
from ._arrays import RawView, raw_view
from .errors import InvalidArgumentError


class Window:
    """Memory registered with a Context under an id that is the same on every rank.

    The Context holds it (and the array it was made from) until ``close()`` (or the end of a ``with`` block), which
    deregisters it after the operations already queued on it completed; the Context's ``close()`` does it for every
    window. So ``ctx.register_window(a)`` alone is enough: later calls may name the array `a` itself.
    """

    def __init__(self, native: "_gdx._Window", array: Any, view: RawView, owner: Optional[dict] = None):
        self._native = native
        self._owner = owner
        self.array = array  #: the object whose memory this is (kept alive while the window lives)
        self._view = view

    id = property(lambda self: self._native.id, doc="window id, the same on every rank")
    ptr = property(lambda self: self._native.ptr, doc="address of the memory")
    nbytes = property(lambda self: self._native.nbytes, doc="size in bytes")
    kind = property(lambda self: self._native.kind, doc='"host" or "cuda"')
    name = property(lambda self: self._native.name, doc="the name given at registration ('' when none)")
    valid = property(lambda self: self._native.valid, doc="registered and its Context open")

    def remote_size(self, peer: int) -> int:
        """Bytes of this window on `peer` (sizes may differ between ranks)."""
        return self._native.remote_size(peer)

    def close(self) -> None:
        if self._owner is not None:
            self._owner.pop(id(self), None)
        self._native.close()

    def __enter__(self) -> "Window":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"gdx.Window(id={self.id}, nbytes={self.nbytes}, kind={self.kind!r}, name={self.name!r})"


WindowLike = Union[Window, Any]  # a Window, or an array inside a window registered with the same Context


def _op_name(op: str) -> str:
    if op not in ("add", "set"):
        raise InvalidArgumentError(f"signal op {op!r} is neither 'add' nor 'set'")
    return op


class Channel:
    """One-sided operations to one peer. Arguments are checked before anything is sent: a bad peer, window, range or
    signal id raises :class:`gdx.InvalidArgumentError` and nothing is sent.

    Where a window is expected, a registered array (or an array lying inside a registered window) may be given
    instead: its window is looked up and the array's position in it is added to the offset.
    """

    def __init__(self, context: "Context", native: "_gdx._Channel"):
        self._context = context
        self._native = native

    peer = property(lambda self: self._native.peer, doc="the rank the operations go to")

    def put(self, dst: WindowLike, dst_offset: int, src: WindowLike, src_offset: int = 0,
            nbytes: Optional[int] = None) -> None:
        """Copies `nbytes` (default: the rest of `src`) of `src` at `src_offset` into the peer's copy of `dst` at
        `dst_offset`. Returns once queued: modify `src` only after flush()."""
        d, doff, s, soff, n = self._context._resolve_pair(dst, dst_offset, src, src_offset, nbytes)
        self._native.put(d, doff, s, soff, n)

    def put_with_signal(self, dst: WindowLike, dst_offset: int, src: WindowLike, src_offset: int = 0,
                        nbytes: Optional[int] = None, signal: int = 0, value: int = 1, op: str = "add") -> None:
        """put(), then adds `value` to (op="set": sets) the peer's signal `signal`; the peer sees the update only
        after the data of this put and of every earlier operation of this channel is in place."""
        d, doff, s, soff, n = self._context._resolve_pair(dst, dst_offset, src, src_offset, nbytes)
        self._native.put_with_signal(d, doff, s, soff, n, signal, value, _op_name(op))

    def signal(self, signal: int, value: int = 1, op: str = "add") -> None:
        """Updates the peer's signal after every earlier operation of this channel is in place."""
        self._native.signal(signal, value, _op_name(op))

    def atomic_add(self, dst: WindowLike, dst_offset: int, value: int) -> None:
        """Adds `value` to the 64-bit word at `dst_offset` (8-byte aligned) of the peer's window `dst`."""
        d, doff = self._context._resolve(dst, dst_offset, "dst")
        self._native.atomic_add(d, doff, value)

    def flush(self) -> None:
        """Waits (bounded) until every operation of this channel completed at the source."""
        self._native.flush()

    def __repr__(self) -> str:
        return f"gdx.Channel(peer={self.peer})"


# Contexts made over one store (one group) get keys of their own; every rank makes them in the same order.
_store_sequence: "weakref.WeakKeyDictionary[Any, itertools.count]" = weakref.WeakKeyDictionary()
_plain_sequence: dict = {}


def _next_sequence(key: Any) -> int:
    try:
        return next(_store_sequence.setdefault(key, itertools.count()))
    except TypeError:  # not weak-referenceable
        return next(_plain_sequence.setdefault(id(key), itertools.count()))


def _store_of(group: Any) -> Any:
    """The torch.distributed store of `group` (None: the default group)."""
    import torch.distributed as dist  # lazily: gdx never needs torch otherwise
    c10d = dist.distributed_c10d
    if group is None:
        group = dist.group.WORLD
    getter = getattr(c10d, "_get_process_group_store", None)
    if getter is not None:
        return getter(group)
    world = getattr(c10d, "_world", None)  # torch >= 2.0
    pg_map = world.pg_map if world is not None else c10d._pg_map
    return pg_map[group][1]


def _group_tag(group: Any) -> str:
    """A name of `group` that every member computes alike, so that groups sharing one store (older torch hands every
    group the default store) get keys of their own."""
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    if group is None:
        group = dist.group.WORLD
    name = getattr(group, "group_name", None) or getattr(c10d, "_pg_names", {}).get(group)
    if name:
        return str(name)
    ranks = getattr(c10d, "_pg_group_ranks", {}).get(group)
    return "ranks-" + "-".join(str(r) for r in sorted(ranks)) if ranks else "world"


class _CommStore:
    """from_store's store over an mpi4py communicator: rank 0's set() is a broadcast that every other rank's get()
    of the same key receives (from_store sets and gets the same keys in the same order on every rank)."""

    def __init__(self, comm: Any):
        self._comm = comm

    def set(self, key: str, value: str) -> None:
        self._comm.bcast((key, value), root=0)

    def get(self, key: str) -> str:
        got, value = self._comm.bcast(None, root=0)
        if got != key:
            raise InvalidArgumentError(f"gdx.Context.from_mpi: rank 0 broadcast {got!r} where {key!r} was expected "
                                       "(every rank must make the same Contexts in the same order)")
        return value


def _master_address(explicit: Optional[str]) -> str:
    if explicit:
        return explicit
    for name in ("GDX_MASTER_ADDR", "MASTER_ADDR"):
        if os.environ.get(name):
            return os.environ[name]
    return "127.0.0.1"


class Context:
    """This process's membership in a gdx job; hands out windows and channels.

    ``Context()`` joins the job described by the environment (GDX_RANK / RANK, GDX_WORLD_SIZE / WORLD_SIZE,
    GDX_MASTER_ADDR / MASTER_ADDR, GDX_MASTER_PORT / MASTER_PORT, or Open MPI's and Slurm's variables); every rank
    of the job must make one. Blocks until all ranks joined, at most GDX_BOOTSTRAP_TIMEOUT_MS (else
    GDX_TIMEOUT_MS); the GIL is released meanwhile. Use ``close()`` or a ``with`` block to leave the job.
    """

    def __init__(self, *, _native: Optional["_gdx._Context"] = None):
        self._native = _native if _native is not None else _gdx._Context()
        self._windows: dict = {}  # id(Window) -> Window, held until closed

    # ---- joining -----------------------------------------------------------------------------------------------
    @classmethod
    def from_process_group(cls, group: Any = None, *, master_addr: Optional[str] = None,
                           timeout: Optional[float] = None) -> "Context":
        """A Context of the ranks of torch.distributed `group` (None: the default group), ranked as in the group.

        Collective over the group. The group's store (its TCPStore) carries the rendezvous: rank 0 of the group
        listens on a free port of `master_addr` (default GDX_MASTER_ADDR, MASTER_ADDR, else 127.0.0.1) and puts
        the address and a fresh job secret into the store, where the others read them. `timeout` in seconds
        bounds joining (default GDX_BOOTSTRAP_TIMEOUT_MS, else GDX_TIMEOUT_MS).
        """
        import torch.distributed as dist
        return cls.from_store(_store_of(group), dist.get_rank(group), dist.get_world_size(group),
                              master_addr=master_addr, timeout=timeout, prefix=f"gdx/{_group_tag(group)}", key=group)

    @classmethod
    def from_mpi(cls, comm: Any, *, master_addr: Optional[str] = None, timeout: Optional[float] = None) -> "Context":
        """A Context of the ranks of an mpi4py communicator (``MPI.COMM_WORLD`` or a split of it), ranked as in it.
        Collective over `comm`: its broadcasts carry the rendezvous address and the job secret from its rank 0."""
        return cls.from_store(_CommStore(comm), comm.Get_rank(), comm.Get_size(), master_addr=master_addr,
                              timeout=timeout, prefix="gdx/mpi", key=comm)

    @classmethod
    def from_store(cls, store: Any, rank: int, world_size: int, *, master_addr: Optional[str] = None,
                   timeout: Optional[float] = None, prefix: str = "gdx", key: Any = None) -> "Context":
        """Like from_process_group, with any store that has ``set(key, value)`` and a blocking ``get(key)``
        (torch.distributed.TCPStore, FileStore, ...). Every rank calls it with the same store and prefix."""
        seq = _next_sequence(key if key is not None else store)
        base = f"{prefix}/context{seq}"
        timeout_ms = _args.timeout_ms(timeout) if timeout is not None else _bootstrap_timeout_ms()
        local_rank = int(os.environ.get("GDX_LOCAL_RANK", os.environ.get("LOCAL_RANK", "-1")))
        if rank == 0:
            host = _master_address(master_addr)
            secret = secrets.token_hex(32)
            store.set(f"{base}/secret", secret)

            def publish(port: int) -> None:
                store.set(f"{base}/address", f"{host}:{port}")

            native = _gdx._Context.from_config(rank, world_size, local_rank, host, 0, secret, timeout_ms, publish)
        else:
            secret = _text(store.get(f"{base}/secret"))
            host, _, port = _text(store.get(f"{base}/address")).rpartition(":")
            native = _gdx._Context.from_config(rank, world_size, local_rank, host, int(port), secret, timeout_ms,
                                               None)
        return cls(_native=native)

    # ---- what it is --------------------------------------------------------------------------------------------
    rank = property(lambda self: self._native.rank, doc="this process's rank")
    world_size = property(lambda self: self._native.world_size, doc="number of ranks")
    local_rank = property(lambda self: self._native.local_rank, doc="rank among the processes of this host")
    num_signals = property(lambda self: self._native.num_signals, doc="signals per rank (GDX_NUM_SIGNALS)")
    timeout = property(lambda self: self._native.timeout_ms / 1000.0, doc="bound of every wait, in seconds")
    closed = property(lambda self: self._native.closed)

    # ---- windows and channels ----------------------------------------------------------------------------------
    def register_window(self, array: Any, name: Optional[str] = None, *, sizes_may_differ: bool = False) -> Window:
        """Registers the memory of `array` (a torch tensor, numpy array, anything with __cuda_array_interface__,
        __array_interface__ or __dlpack__, or a writable buffer; contiguous, not empty). Collective: every rank
        registers its windows in the same order; named windows are checked by name too. A window without a name must
        have the same size on every rank (else gdx.InvalidArgumentError on every rank, naming both sizes) unless
        `sizes_may_differ`; named windows may differ."""
        view = raw_view(array, "register_window")
        w = Window(self._native.register_window(view.ptr, view.nbytes, view.kind, name or "", bool(sizes_may_differ)),
                   array, view, self._windows)
        self._windows[id(w)] = w
        return w

    def channel(self, peer: int, ring: int = -1) -> Channel:
        """A channel to `peer` (on command ring `ring`; -1 spreads channels over the rings by peer)."""
        return Channel(self, self._native.channel(peer, ring))

    def device_channel(self, peer: int, ring: int = -1) -> bytes:
        """The bytes of the ``gdx::ChannelDeviceHandle`` to `peer`, for a kernel that takes the handle by value (a
        CUDA C++ kernel built with gdx's headers, launched from CuPy, numba or Triton). Layout:
        ``gdx.DEVICE_CHANNEL_LAYOUT`` (field -> (offset, size)), ``gdx.DEVICE_CHANNEL_SIZE`` bytes, aligned to
        ``gdx.DEVICE_CHANNEL_ALIGNMENT``. Needs a GPU (else gdx.InvalidArgumentError)."""
        return self._native.device_channel(peer, ring)

    # ---- signals -----------------------------------------------------------------------------------------------
    def wait(self, signal: int, value: int, timeout: Optional[float] = None) -> None:
        """Waits until local signal `signal` >= `value`: at most `timeout` seconds (None: GDX_TIMEOUT_MS), then
        raises gdx.TimeoutError naming the rank, signal and last value seen; gdx.PeerFailedError as soon as a peer
        failed. Releases the GIL; Ctrl-C interrupts it (KeyboardInterrupt) within 100 ms."""
        self._native.wait(signal, value, _args.timeout_ms(timeout))

    def signal_value(self, signal: int) -> int:
        """Current value of local signal `signal`."""
        return self._native.signal_value(signal)

    def set_signal(self, signal: int, value: int) -> None:
        """Sets local signal `signal` (to re-arm it; only while no peer updates it)."""
        self._native.set_signal(signal, value)

    def is_direct(self, peer: int) -> bool:
        """True when kernels reach `peer` on the direct path (NVLink, CUDA IPC) rather than the proxy."""
        return self._native.is_direct(peer)

    def failure(self) -> str:
        """Why the job is broken (a failed peer); '' while healthy."""
        return self._native.failure()

    def barrier(self) -> None:
        """Collective: returns when every rank called it."""
        self._native.barrier()

    def close(self) -> None:
        """Leaves the job: deregisters the windows and closes the connections, after the puts already queued
        completed (bounded). Later calls on it, its windows and channels raise gdx.ShutdownError."""
        self._native.close()
        self._windows.clear()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "gdx.Context(closed)"
        return f"gdx.Context(rank={self.rank}, world_size={self.world_size})"

    # ---- arrays -> (window, offset) ----------------------------------------------------------------------------
    def _resolve(self, obj: WindowLike, offset: int, what: str):
        if isinstance(obj, Window):
            return obj._native, offset
        view = raw_view(obj, what, writable=what == "dst")
        for w in list(self._windows.values()):
            if w.valid and w.ptr <= view.ptr and view.ptr + view.nbytes <= w.ptr + w.nbytes:
                return w._native, offset + (view.ptr - w.ptr)
        raise InvalidArgumentError(
            f"{what}: the array at {view.ptr:#x} ({view.nbytes} bytes) lies in no window registered with this "
            f"Context (rank {self.rank}); register it with register_window first")

    def _resolve_pair(self, dst, dst_offset, src, src_offset, nbytes):
        d, doff = self._resolve(dst, dst_offset, "dst")
        s, soff = self._resolve(src, src_offset, "src")
        if nbytes is None:
            src_size = src.nbytes if isinstance(src, Window) else raw_view(src, "src", writable=False).nbytes
            if src_offset > src_size:
                raise InvalidArgumentError(f"src_offset {src_offset} is past the end of src ({src_size} bytes)")
            nbytes = src_size - src_offset
        return d, doff, s, soff, nbytes


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _bootstrap_timeout_ms() -> int:
    for name in ("GDX_BOOTSTRAP_TIMEOUT_MS", "GDX_TIMEOUT_MS"):
        v = os.environ.get(name)
        if v:
            return int(v, 0)
    return _gdx.default_timeout_ms()
