"""gdx.p2p.RdmaTransport: the URL transport (gdx::p2p::UrlTransport; seed 004's shape). One transport is one peer:
``bind()`` gives this side's URL, ``connect(url)`` joins the peer's (both sides call it with the other's URL),
``RegisteredMemory(array)`` registers memory whose ``remote_key()`` the peer puts in a ``RemoteBuffer``,
``write(local, remote, notify)`` returns a :class:`WriteFuture`, ``wait_for_write()`` one that resolves when the
peer's next notified write arrived. Every future resolves within GDX_TIMEOUT_MS."""

from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from .. import _args, _gdx
from .._arrays import raw_view
from ..errors import _BY_CODE, Error, InvalidArgumentError
from ..errors import TimeoutError as GdxTimeoutError


class RegisteredMemory:
    """Memory registered for writes for as long as this object lives: an array (torch tensor, numpy array, ...),
    or a pointer and a size. ``cuda_dev``: the GPU of CUDA memory (None: taken from the array, else host)."""

    def __init__(self, array: Any, nbytes: Optional[int] = None, cuda_dev: Optional[int] = None):
        if isinstance(array, int) and not isinstance(array, bool):
            if nbytes is None:
                raise InvalidArgumentError("RegisteredMemory: a pointer needs nbytes")
            ptr, n, device = _args.non_negative(array, "RegisteredMemory: the pointer"), _args.non_negative(
                nbytes, "RegisteredMemory: nbytes"), -1
        else:
            if array is None or isinstance(array, (bool, float, str)):
                raise TypeError(f"RegisteredMemory: expected an array or a pointer (int), got "
                                f"{type(array).__name__} ({array!r})")
            view = raw_view(array, "RegisteredMemory")  # the peer writes into it: writable memory only
            ptr = view.ptr
            n = view.nbytes if nbytes is None else _args.non_negative(nbytes, "RegisteredMemory: nbytes")
            if n > view.nbytes:
                raise InvalidArgumentError(f"RegisteredMemory: nbytes {n} exceeds the array's {view.nbytes}")
            device = view.device if view.kind == "cuda" else -1
        self.array = array  #: kept alive while registered
        self._native = _gdx._RegisteredMemory(ptr, n, device if cuda_dev is None else int(cuda_dev))

    ptr = property(lambda self: self._native.ptr, doc="address of the memory")
    nbytes = property(lambda self: self._native.nbytes, doc="its size in bytes")
    device = property(lambda self: self._native.device, doc="its GPU (-1: host memory)")

    def remote_key(self) -> bytes:
        """What the peer needs, beside an address inside this memory, to write into it."""
        return self._native.remote_key()

    def view(self, offset: int = 0, length: Optional[int] = None) -> Tuple["RegisteredMemory", int, int]:
        """A piece of this memory for write(): (self, address, bytes)."""
        length = self.nbytes - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > self.nbytes:
            raise InvalidArgumentError(f"RegisteredMemory.view({offset}, {length}) lies outside its "
                                       f"{self.nbytes} bytes")
        return self, self.ptr + offset, length

    def remote_buffer(self, offset: int = 0) -> "RemoteBuffer":
        """The RemoteBuffer a peer writes to at `offset` (hand its fields over out of band)."""
        return RemoteBuffer(self.ptr + offset, self.remote_key())


@dataclass(frozen=True)
class RemoteBuffer:
    """A peer's memory: an address inside its RegisteredMemory and that memory's remote_key()."""
    ptr: int
    access_key: bytes


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


LocalPiece = Union[RegisteredMemory, Tuple[RegisteredMemory, int, int]]


class RdmaTransport:
    """One connection to one peer over gdx's transports (GDX_TRANSPORT or `transport`: "tcp" or "verbs")."""

    def __init__(self, cuda_dev: int = -1, transport: str = ""):
        self._native = _gdx._UrlTransport(int(cuda_dev), transport)

    @staticmethod
    def supported(transport: str = "") -> bool:
        """Whether `transport` ("": GDX_TRANSPORT) can run here (verbs: an RDMA device is present)."""
        return _gdx._UrlTransport.supported(transport)

    def bind(self) -> str:
        """Starts listening; returns this side's URL for the peer. Once, before connect()."""
        return self._native.bind()

    def connect(self, peer_url: str) -> None:
        """Connects to the peer, which calls connect() with this side's URL; bounded by GDX_TIMEOUT_MS."""
        self._native.connect(peer_url)

    connected = property(lambda self: self._native.connected)

    def write(self, local: LocalPiece, remote: RemoteBuffer, notify: bool = False) -> WriteFuture:
        """Writes `local` (a RegisteredMemory, or one's view()) to `remote`; the future resolves once the data is
        in place at the peer. With `notify`, the peer's next wait_for_write() resolves when it arrived."""
        if isinstance(local, RegisteredMemory):
            mem, ptr, n = local.view()
        elif isinstance(local, tuple) and len(local) == 3 and isinstance(local[0], RegisteredMemory):
            mem, ptr, n = local
        else:
            raise TypeError(f"write: local must be a RegisteredMemory or one's view(), not {type(local).__name__} "
                            f"({local!r})")
        if not isinstance(remote, RemoteBuffer):
            raise TypeError(f"write: remote must be a RemoteBuffer (the peer's address and remote_key()), not "
                            f"{type(remote).__name__} ({remote!r})")
        native = self._native.write(mem._native, ptr, n, int(remote.ptr), bytes(remote.access_key), bool(notify))
        return WriteFuture(native, f"write of {n} bytes to {remote.ptr:#x}", keep=(mem, self))

    def wait_for_write(self) -> WriteFuture:
        """Resolves when the peer's next notified write (in arrival order) arrived; "timeout" after GDX_TIMEOUT_MS."""
        return WriteFuture(self._native.wait_for_write(), "wait_for_write", keep=self)
