"""gdx.p2p.RdmaTransport: the URL transport (gdx::p2p::UrlTransport) under the names of torchcomms' RdmaTransport
(gdx::p2p::RdmaTransport in C++, seed 004). One transport is one peer: ``bind()`` gives this side's URL,
``connect(url)`` starts connecting to the peer's and returns at once (both sides call it, from one thread or two, in
either order), ``RdmaMemory(array)`` registers memory whose ``remote_key()`` the peer puts in an
``RdmaRemoteBuffer``, ``write(mem.create_view(...), remote, notify)`` returns a :class:`WriteFuture` (writes made
before the connection is up wait for it), ``wait_for_write()`` one that resolves when the peer's next notified write
arrived. ``future.get()`` gives a :class:`CommResult` (``CommResult.commSuccess``, ...). Every future resolves
within GDX_TIMEOUT_MS. The earlier names (``RegisteredMemory``, ``view()``, ``RemoteBuffer``, ``result()``) still
work."""

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

from .. import _args, _gdx
from .._arrays import raw_view
from ..errors import _BY_CODE, Error, InvalidArgumentError
from ..errors import TimeoutError as GdxTimeoutError


class CommResult(enum.IntEnum):
    """How an operation ended: commResult_t of gdx/p2p/rdma_transport.hpp (NCCL's ncclResult_t values)."""
    commSuccess = 0
    commUnhandledCudaError = 1
    commSystemError = 2
    commInternalError = 3
    commInvalidArgument = 4
    commInvalidUsage = 5
    commRemoteError = 6
    commInProgress = 7
    commTimeout = 8


# The status names of the native futures, as commResultOf() maps gdx::Status.
_COMM_RESULT = {"ok": CommResult.commSuccess, "timeout": CommResult.commTimeout,
                "peer failed": CommResult.commRemoteError, "invalid argument": CommResult.commInvalidArgument,
                "proxy error": CommResult.commInternalError, "shutdown": CommResult.commInternalError}


class _CallableBool:
    """A bool that may also be called: ``t.connected`` and the seed's ``t.connected()`` both read it."""
    __slots__ = ("_value",)

    def __init__(self, value: bool):
        self._value = bool(value)

    def __bool__(self) -> bool:
        return self._value

    def __call__(self) -> bool:
        return self._value

    def __eq__(self, other: Any) -> bool:
        return self._value == other

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return repr(self._value)


class RdmaMemoryView(NamedTuple):
    """A piece of an RdmaMemory for write(): a tuple (memory, ptr, nbytes) with the seed's ``data()`` / ``size()``."""
    memory: "RdmaMemory"
    ptr: int
    nbytes: int

    def data(self) -> int:
        return self.ptr

    def size(self) -> int:
        return self.nbytes


class RdmaMemory:
    """Memory registered for writes for as long as this object lives: an array (torch tensor, numpy array, ...),
    or a pointer and a size (the seed's ``RdmaMemory(buf, len, cudaDev)``). ``cuda_dev``: the GPU of CUDA memory
    (None: taken from the array, else host)."""

    def __init__(self, array: Any, nbytes: Optional[int] = None, cuda_dev: Optional[int] = None):
        if isinstance(array, int) and not isinstance(array, bool):
            if nbytes is None:
                raise InvalidArgumentError("RdmaMemory: a pointer needs nbytes")
            ptr, n, device = _args.non_negative(array, "RdmaMemory: the pointer"), _args.non_negative(
                nbytes, "RdmaMemory: nbytes"), -1
        else:
            if array is None or isinstance(array, (bool, float, str)):
                raise TypeError(f"RdmaMemory: expected an array or a pointer (int), got "
                                f"{type(array).__name__} ({array!r})")
            view = raw_view(array, "RdmaMemory")  # the peer writes into it: writable memory only
            ptr = view.ptr
            n = view.nbytes if nbytes is None else _args.non_negative(nbytes, "RdmaMemory: nbytes")
            if n > view.nbytes:
                raise InvalidArgumentError(f"RdmaMemory: nbytes {n} exceeds the array's {view.nbytes}")
            device = view.device if view.kind == "cuda" else -1
        self.array = array  #: kept alive while registered
        self._native = _gdx._RegisteredMemory(ptr, n, device if cuda_dev is None else int(cuda_dev))

    ptr = property(lambda self: self._native.ptr, doc="address of the memory")
    nbytes = property(lambda self: self._native.nbytes, doc="its size in bytes")
    device = property(lambda self: self._native.device, doc="its GPU (-1: host memory)")

    def get_device(self) -> int:
        """The GPU given at registration (-1: host memory)."""
        return self._native.device

    def remote_key(self) -> bytes:
        """What the peer needs, beside an address inside this memory, to write into it."""
        return self._native.remote_key()

    def local_key(self) -> int:
        """A handle that names this registration in this process (never 0)."""
        return self._native.local_key()

    def contains(self, ptr: int, nbytes: int) -> bool:
        """Whether [ptr, ptr + nbytes) lies inside this memory."""
        return self._native.contains(int(ptr), int(nbytes))

    def create_view(self, offset: Any = 0, length: Optional[int] = None, *, ptr: Optional[int] = None) -> RdmaMemoryView:
        """A piece of this memory for write(): ``create_view(offset, length)``, ``create_view(ptr=address,
        length=n)`` (the seed's createView(buf, len)), or ``create_view(array)`` for an array inside this memory (a
        slice of the registered one). `length` None: up to the end (of the array). gdx.InvalidArgumentError when it
        does not lie inside this memory."""
        if ptr is None and not (isinstance(offset, int) and not isinstance(offset, bool)):
            inner = raw_view(offset, "RdmaMemory.create_view", writable=False)
            ptr, length = inner.ptr, inner.nbytes if length is None else length
        if ptr is not None:
            offset = int(ptr) - self.ptr
            if length is None:
                length = self.nbytes - offset
        length = self.nbytes - offset if length is None else int(length)
        if offset < 0 or length < 0 or offset + length > self.nbytes:
            raise InvalidArgumentError(f"RdmaMemory.create_view: {length} bytes at offset {offset} lie outside its "
                                       f"{self.nbytes} bytes")
        return RdmaMemoryView(self, self.ptr + offset, length)

    def view(self, offset: int = 0, length: Optional[int] = None) -> RdmaMemoryView:
        """create_view(offset, length), the earlier name."""
        return self.create_view(int(offset), length)

    def remote_buffer(self, offset: int = 0) -> "RdmaRemoteBuffer":
        """The RdmaRemoteBuffer a peer writes to at `offset` (hand its fields over out of band)."""
        return RdmaRemoteBuffer(self.ptr + offset, self.remote_key())


RegisteredMemory = RdmaMemory  # the earlier name


@dataclass(frozen=True)
class RdmaRemoteBuffer:
    """A peer's memory: an address inside its RdmaMemory and that memory's remote_key()."""
    ptr: int
    access_key: bytes


RemoteBuffer = RdmaRemoteBuffer  # the earlier name


def _status_error(status: str, what: str) -> Error:
    cls = _BY_CODE.get(status, Error)
    return cls(f"{what} ended with status '{status}' (the transport logged the reason at WARN)")


class WriteFuture:
    """A write or a wait for one, in flight: ``done()``, ``wait(timeout)`` -> the status name ("ok", "timeout",
    "peer failed", ...), ``result(timeout)`` -> True or the gdx.Error of the status. Waits release the GIL and end
    on Ctrl-C. Dropping a future that has not resolved yet waits for it (at most GDX_TIMEOUT_MS): the transport's
    work for it must end before the memory and the transport it uses may go."""

    def __init__(self, native: "_gdx._Future", what: str, keep: Any = None):
        self._native = native
        self._what = what
        self._keep = keep  # the transport (and a write's local memory): alive as long as this future

    def done(self) -> bool:
        return self._native.done()

    def wait(self, timeout: Optional[float] = None) -> str:
        """The status once resolved; gdx.TimeoutError when `timeout` seconds (None: unbounded here, the transport
        resolves it within GDX_TIMEOUT_MS) passed first."""
        timeout_ms = _args.timeout_ms(timeout)
        status = self._native.wait(timeout_ms)
        if status is None:
            raise GdxTimeoutError(f"{self._what}: not resolved within {timeout} s")
        return status

    def result(self, timeout: Optional[float] = None) -> bool:
        status = self.wait(timeout)
        if status != "ok":
            raise _status_error(status, self._what)
        return True

    def get(self, timeout: Optional[float] = None) -> CommResult:
        """The seed's ``future.get()``: the CommResult once resolved (CommResult.commSuccess, commTimeout, ...)."""
        return _COMM_RESULT.get(self.wait(timeout), CommResult.commInternalError)


LocalPiece = Union[RdmaMemory, RdmaMemoryView]


class RdmaTransport:
    """One connection to one peer over gdx's transports (GDX_TRANSPORT or `transport`: "tcp" or "verbs")."""

    def __init__(self, cuda_dev: int = -1, transport: Optional[str] = ""):
        self._native = _gdx._UrlTransport(int(cuda_dev), transport or "")

    @staticmethod
    def supported(transport: str = "") -> bool:
        """Whether `transport` ("": GDX_TRANSPORT) can run here (verbs: an RDMA device is present)."""
        return _gdx._UrlTransport.supported(transport)

    def bind(self) -> str:
        """Starts listening; returns this side's URL for the peer. Once, before connect()."""
        return self._native.bind()

    def connect(self, peer_url: str) -> CommResult:
        """Starts connecting to the peer (which calls connect() with this side's URL) and returns at once:
        CommResult.commSuccess. The connection comes up in the background; writes and waits made before wait for
        it, and fail with commTimeout (the log naming the peer's URL) when it does not come within GDX_TIMEOUT_MS.
        Raises gdx.InvalidArgumentError for what it refuses at once: before bind(), twice, a malformed URL."""
        self._native.start_connect(peer_url)
        return CommResult.commSuccess

    connected = property(lambda self: _CallableBool(self._native.connected),
                         doc="True once the connection is up and while it is healthy (also callable: connected())")

    def write(self, local: LocalPiece, remote: RdmaRemoteBuffer, notify: bool = False) -> WriteFuture:
        """Writes `local` (an RdmaMemory, or one's create_view()) to `remote`; the future resolves once the data is
        in place at the peer. With `notify`, the peer's next wait_for_write() resolves when it arrived."""
        if isinstance(local, RdmaMemory):
            mem, ptr, n = local.create_view()
        elif isinstance(local, tuple) and len(local) == 3 and isinstance(local[0], RdmaMemory):
            mem, ptr, n = local
        else:
            raise TypeError(f"write: local must be an RdmaMemory or one's create_view(), not "
                            f"{type(local).__name__} ({local!r})")
        if not isinstance(remote, RdmaRemoteBuffer):
            raise TypeError(f"write: remote must be a RemoteBuffer (the peer's address and remote_key()), not "
                            f"{type(remote).__name__} ({remote!r})")
        native = self._native.write(mem._native, ptr, n, int(remote.ptr), bytes(remote.access_key), bool(notify))
        return WriteFuture(native, f"write of {n} bytes to {remote.ptr:#x}", keep=(mem, self))

    def wait_for_write(self) -> WriteFuture:
        """Resolves when the peer's next notified write (in arrival order) arrived; "timeout" after GDX_TIMEOUT_MS."""
        return WriteFuture(self._native.wait_for_write(), "wait_for_write", keep=self)
