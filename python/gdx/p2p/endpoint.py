"""gdx.p2p.Endpoint: the point-to-point endpoint (gdx::p2p::Endpoint) with the names and return tuples of the P2P
engines' Python API (seed 002): ``Endpoint(local_gpu_idx, num_cpus)``, ``connect`` -> ``(ok, conn_id)``, ``accept``
-> ``(ok, ip, gpu, conn_id)``, ``reg`` -> ``(ok, mr_id)``, ``send``/``recv`` -> ``ok``, ``send_async`` ->
``(ok, transfer_id)``, ``poll_async`` -> ``(ok, done)``, ``advertise`` + ``read``/``write`` ...

Receives take a message of at most their buffer's size (the rest of the buffer is left untouched) and, as in seed
002, return ``ok``. ``Endpoint(..., return_recv_size=True)`` gives seed 000's form instead: ``recv`` ->
``(ok, recv_size)``, ``recvv`` -> ``(ok, recv_size_list)``, and for a ``recv_async`` / ``recvv_async`` transfer
``wait`` -> ``(ok, recv_size)`` (a list for recvv_async) and ``poll_async`` -> ``(ok, done, recv_size)`` (None until
done); the other calls are the same in both forms. A message larger than its buffer raises on both sides, naming
both sizes, and writes nothing.

Failures are not reported as ``ok == False``: they raise the gdx.Error subclass of the C++ error, whose message
names the connection, the operation and what was seen (so ``ok`` is always True when a call returns). Where the seed
takes a pointer and a size, any array gdx understands (torch tensor, numpy array, ``__cuda_array_interface__``,
``__array_interface__``, ``__dlpack__``, a writable buffer) may be given instead, the size then defaulting to its
bytes. Blocking calls release the GIL and end on Ctrl-C (KeyboardInterrupt) within about 50 ms; a transfer
interrupted that way goes on in the background, and the endpoint keeps its memory alive until it is closed.
"""

from typing import Any, List, Optional, Sequence, Tuple, Union

from .. import _args, _gdx
from .._arrays import raw_view
from ..errors import InvalidArgumentError
from ..errors import TimeoutError as GdxTimeoutError

#: Length of the descriptor advertise() produces (the seed passes 64-byte buffers: any buffer at least this long).
DESCRIPTOR_BYTES = _gdx.P2P_DESCRIPTOR_BYTES


def _memory(obj: Any, size: Optional[int], what: str, writable: bool = False) -> Tuple[int, int]:
    """(address, bytes) of a pointer + size, or of an array (size: at most its bytes; None: all of them).
    `writable`: the call writes into the memory (a receive, a read, a range a peer may write), so a read-only array
    is refused."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if size is None:
            raise InvalidArgumentError(f"{what}: a pointer needs a size")
        ptr = _args.non_negative(obj, f"{what}: the pointer")
        if ptr == 0:
            raise InvalidArgumentError(f"{what}: the pointer is 0 (null)")
        return ptr, _args.non_negative(size, f"{what}: size")
    if obj is None or isinstance(obj, (bool, float, str)):
        raise TypeError(f"{what}: expected a pointer (int) or an array, got {type(obj).__name__} ({obj!r})")
    view = raw_view(obj, what, writable=writable)
    if size is None:
        return view.ptr, view.nbytes
    n = _args.non_negative(size, f"{what}: size")
    if n > view.nbytes:
        raise InvalidArgumentError(f"{what}: size {n} does not fit the {view.nbytes}-byte array")
    return view.ptr, n


def _descriptor(item: Any, what: str) -> bytes:
    """The descriptor in what advertise() filled (a buffer at least DESCRIPTOR_BYTES long) or returned."""
    data = bytes(item)
    if len(data) < DESCRIPTOR_BYTES:
        raise InvalidArgumentError(f"{what}: a descriptor has {DESCRIPTOR_BYTES} bytes, this one {len(data)}")
    return data[:DESCRIPTOR_BYTES]


def _fill(out_buf: Any, descriptor: bytes, what: str) -> None:
    """Writes `descriptor` into the first bytes of `out_buf`: any writable buffer (bytearray, a numpy array of any
    dtype, a memoryview, mmap), C-contiguous."""
    try:
        view = memoryview(out_buf)
    except TypeError:
        raise InvalidArgumentError(f"{what}: out_buf must be a writable buffer (bytearray, numpy array, memoryview), "
                                   f"not {type(out_buf).__name__}; or leave it out and take the returned bytes") from None
    with view:
        if view.readonly:
            raise InvalidArgumentError(f"{what}: out_buf ({type(out_buf).__name__}) is read-only; pass a bytearray or "
                                       "a numpy array, or leave it out and take the returned bytes")
        if not view.c_contiguous:
            raise InvalidArgumentError(f"{what}: out_buf is not contiguous")
        with view.cast("B") as raw:
            if raw.nbytes < len(descriptor):
                raise InvalidArgumentError(
                    f"{what}: out_buf has {raw.nbytes} bytes; a descriptor needs {len(descriptor)}")
            raw[:len(descriptor)] = descriptor


def _iov_lists(mr_ids: Sequence[int], ptrs: Sequence[Any], sizes: Optional[Sequence[int]],
               num_iovs: Optional[int], what: str, writable: bool = False) -> Tuple[List[int], List[int], List[int]]:
    n = len(mr_ids)
    if num_iovs is not None and num_iovs != n:
        raise InvalidArgumentError(f"{what}: num_iovs is {num_iovs} but {n} mr ids were given")
    if sizes is None:
        sizes = [None] * len(ptrs)
    if len(ptrs) != n or len(sizes) != n:
        raise InvalidArgumentError(f"{what}: {n} mr ids, {len(ptrs)} buffers and {len(sizes)} sizes; the lists "
                                   "must be equally long")
    mem = [_memory(p, s, f"{what}[{i}]", writable) for i, (p, s) in enumerate(zip(ptrs, sizes))]
    return [int(m) for m in mr_ids], [p for p, _ in mem], [s for _, s in mem]


class Endpoint:
    """A point-to-point endpoint: connections to other endpoints, registered memory, two-sided and one-sided
    transfers. ``local_gpu_idx`` is the GPU it serves (-1: host memory only), ``num_cpus`` its progress threads.
    It listens on ``port`` (None: GDX_P2P_PORT + the GPU index; 0: any free port, see :attr:`port`). With a
    ``secret`` (shared by the endpoints that may connect, as a job secret), a client that does not present it is
    refused with the reason, on both sides. With ``return_recv_size=True`` the receives return the size of what they
    got (seed 000's ``(ok, recv_size)``, see the module's docstring); by default they return ``ok`` (seed 002)."""

    def __init__(self, local_gpu_idx: int = -1, num_cpus: int = 1, *, port: Optional[int] = None,
                 bind_address: str = "", transport: str = "", timeout: Optional[float] = None, secret: str = "",
                 return_recv_size: bool = False):
        gpu = _args.integer(local_gpu_idx, "local_gpu_idx")
        if gpu < -1:
            raise InvalidArgumentError(f"local_gpu_idx must be a GPU index or -1 (host memory only), got {gpu}")
        listen = -1 if port is None else _args.port(port)
        if not isinstance(return_recv_size, bool):
            raise TypeError(f"return_recv_size: expected a bool, got {type(return_recv_size).__name__}")
        self._native = _gdx._Endpoint(gpu, _args.integer(num_cpus, "num_cpus"), listen, bind_address, transport,
                                      _args.timeout_ms(timeout), secret)
        self._with_size = return_recv_size
        self._in_flight: dict = {}  # transfer id -> the arrays it uses, held until it is reported done
        self._sized: dict = {}  # with return_recv_size: transfer id of a receive -> "recv" or "recvv"
        self._interrupted: list = []  # arrays of blocking transfers ended by Ctrl-C, which go on in the background

    # ---- what it is --------------------------------------------------------------------------------------------
    port = property(lambda self: self._native.port, doc="the port it listens on")
    ip = property(lambda self: self._native.ip, doc="the address it advertises in its metadata")
    local_gpu_idx = property(lambda self: self._native.local_gpu, doc="the GPU it serves (-1: none)")
    transport = property(lambda self: self._native.transport, doc='"tcp" or "verbs"')

    def connection_transport(self, conn_id: int) -> str:
        """What carries connection `conn_id` ("tcp, 4 sockets, 1048576-byte chunks", "verbs, RC")."""
        return self._native.connection_transport(conn_id)

    # ---- connections -------------------------------------------------------------------------------------------
    def connect(self, remote_ip_addr: str, remote_gpu_idx: int = -1, remote_port: Optional[int] = None
                ) -> Tuple[bool, int]:
        """Connects to the endpoint of GPU `remote_gpu_idx` at `remote_ip_addr` (port: None = GDX_P2P_PORT + that
        GPU). Returns (True, conn_id); gdx.TimeoutError when nobody accepts within GDX_TIMEOUT_MS."""
        return True, self._native.connect(remote_ip_addr, _args.integer(remote_gpu_idx, "remote_gpu_idx"),
                                          -1 if remote_port is None else _args.port(remote_port, "remote_port"))

    def accept(self) -> Tuple[bool, str, int, int]:
        """Waits for the next client, without a bound: (True, its ip, its GPU, conn_id). Ctrl-C ends the wait
        (KeyboardInterrupt), and so does close() from another thread (gdx.ShutdownError). A client's handshake, once
        it connected, is bounded by GDX_TIMEOUT_MS."""
        ip, gpu, conn_id = self._native.accept()
        return True, ip, gpu, conn_id

    def start_passive_accept(self) -> bool:
        """Accepts every client in a background thread from now on; accept() hands them out in arrival order."""
        self._native.start_passive_accept()
        return True

    def get_metadata(self) -> bytes:
        """This endpoint's address (ip, port, GPU) for another endpoint's add_remote_endpoint()."""
        return self._native.metadata()

    def add_remote_endpoint(self, metadata: bytes) -> Tuple[bool, int]:
        """Connects to the endpoint `metadata` describes, once: later calls return the same conn_id."""
        return True, self._native.add_remote_endpoint(bytes(metadata))

    # ---- memory ------------------------------------------------------------------------------------------------
    def reg(self, ptr: Any, size: Optional[int] = None) -> Tuple[bool, int]:
        """Registers memory: a pointer and a size, or an array (all of it, or its first `size` bytes)."""
        p, n = _memory(ptr, size, "reg")
        return True, self._native.reg(p, n)

    def dereg(self, mr_id: int) -> bool:
        """Forgets a region. Returns once no transfer reads it any more (writes already on their way from it are waited
        for, bounded by GDX_TIMEOUT_MS); transfers that would still use it fail by name."""
        self._native.dereg(mr_id)
        return True

    # ---- two-sided ---------------------------------------------------------------------------------------------
    def _blocking(self, call, keep: Any, *args) -> Any:
        try:
            return call(*args)
        except KeyboardInterrupt:
            self._interrupted.append(keep)
            raise

    def send(self, conn_id: int, mr_id: int, ptr: Any, size: Optional[int] = None) -> bool:
        """Sends [ptr, ptr + size) of region `mr_id` as one message; returns once it was handed to the transport
        completely. The peer's matching recv needs a buffer of at least this size."""
        p, n = _memory(ptr, size, "send")
        self._blocking(self._native.send, ptr, conn_id, mr_id, p, n)
        return True

    def recv(self, conn_id: int, mr_id: int, ptr: Any, size: Optional[int] = None) -> Union[bool, Tuple[bool, int]]:
        """Receives the next message into [ptr, ptr + size) of region `mr_id` (`size`: the buffer's, the most it
        takes; the message lands at its start and the rest is left untouched). Returns True, or with
        ``return_recv_size=True`` (True, the message's size). A larger message raises gdx.InvalidArgumentError naming
        both sizes, on both sides, and writes nothing."""
        p, n = _memory(ptr, size, "recv", writable=True)
        got = self._blocking(self._native.recv, ptr, conn_id, mr_id, p, n)
        return (True, got) if self._with_size else True

    def sendv(self, conn_id: int, mr_id_list: Sequence[int], ptr_list: Sequence[Any],
              size_list: Optional[Sequence[int]] = None, num_iovs: Optional[int] = None) -> bool:
        """Sends several pieces, each a message of its own: piece i goes to buffer i of the peer's recvv (which must
        be at least as large)."""
        mrs, ptrs, sizes = _iov_lists(mr_id_list, ptr_list, size_list, num_iovs, "sendv")
        self._blocking(self._native.sendv, list(ptr_list), conn_id, mrs, ptrs, sizes)
        return True

    def recvv(self, conn_id: int, mr_id_list: Sequence[int], ptr_list: Sequence[Any],
              size_list: Optional[Sequence[int]] = None, num_iovs: Optional[int] = None
              ) -> Union[bool, Tuple[bool, List[int]]]:
        """Receives one message into each buffer (`size_list`: their sizes, the most each takes): buffer i takes piece
        i of the peer's sendv. Returns True, or with ``return_recv_size=True`` (True, the size each buffer got)."""
        mrs, ptrs, sizes = _iov_lists(mr_id_list, ptr_list, size_list, num_iovs, "recvv", writable=True)
        got = self._blocking(self._native.recvv, list(ptr_list), conn_id, mrs, ptrs, sizes)
        return (True, list(got)) if self._with_size else True

    def _started(self, transfer_id: int, keep: Any, receive: Optional[str] = None) -> Tuple[bool, int]:
        """`receive`: "recv" or "recvv" for a receive (whose size, or list of sizes, return_recv_size reports)."""
        self._in_flight[transfer_id] = keep
        if receive is not None and self._with_size:
            self._sized[transfer_id] = receive
        return True, transfer_id

    def _done(self, transfer_id: int) -> Optional[str]:
        """Forgets a transfer reported done or failed; what _started noted of it as a receive (None: nothing)."""
        self._in_flight.pop(transfer_id, None)
        return self._sized.pop(transfer_id, None)

    @staticmethod
    def _size_of(receive: str, received: List[int]) -> Union[int, List[int]]:
        """What a receive reports in the with-size form: its size (recv), or the list of its buffers' (recvv)."""
        return list(received) if receive == "recvv" else (received[0] if received else 0)

    def send_async(self, conn_id: int, mr_id: int, ptr: Any, size: Optional[int] = None) -> Tuple[bool, int]:
        """Starts a send: (True, transfer_id) for poll_async / wait."""
        p, n = _memory(ptr, size, "send_async")
        return self._started(self._native.send_async(conn_id, mr_id, p, n), ptr)

    def recv_async(self, conn_id: int, mr_id: int, ptr: Any, size: Optional[int] = None) -> Tuple[bool, int]:
        """Starts a receive of at most `size` bytes: (True, transfer_id). With ``return_recv_size=True``, wait()
        and poll_async() also give the size it got."""
        p, n = _memory(ptr, size, "recv_async", writable=True)
        return self._started(self._native.recv_async(conn_id, mr_id, p, n), ptr, receive="recv")

    def sendv_async(self, conn_id: int, mr_id_list: Sequence[int], ptr_list: Sequence[Any],
                    size_list: Optional[Sequence[int]] = None, num_iovs: Optional[int] = None) -> Tuple[bool, int]:
        mrs, ptrs, sizes = _iov_lists(mr_id_list, ptr_list, size_list, num_iovs, "sendv_async")
        return self._started(self._native.sendv_async(conn_id, mrs, ptrs, sizes), list(ptr_list))

    def recvv_async(self, conn_id: int, mr_id_list: Sequence[int], ptr_list: Sequence[Any],
                    size_list: Optional[Sequence[int]] = None, num_iovs: Optional[int] = None) -> Tuple[bool, int]:
        mrs, ptrs, sizes = _iov_lists(mr_id_list, ptr_list, size_list, num_iovs, "recvv_async", writable=True)
        return self._started(self._native.recvv_async(conn_id, mrs, ptrs, sizes), list(ptr_list), receive="recvv")

    def poll_async(self, transfer_id: int) -> Union[Tuple[bool, bool], Tuple[bool, bool, Any]]:
        """(True, done); once done, the id is forgotten. Raises the transfer's error when it failed. With
        ``return_recv_size=True``, a recv_async's or recvv_async's transfer gives (True, done, recv_size): the
        message's size (recvv_async: a list, one per buffer) once done, None before."""
        try:
            done, received = self._native.poll(transfer_id)
        except Exception:
            self._done(transfer_id)
            raise
        receive = self._done(transfer_id) if done else self._sized.get(transfer_id)
        if receive is None:
            return True, done
        return True, done, (self._size_of(receive, received) if done else None)

    def wait(self, transfer_id: int, timeout: Optional[float] = None) -> Union[bool, Tuple[bool, Any]]:
        """Waits until the transfer is done: at most `timeout` seconds (None: GDX_TIMEOUT_MS from its start), then
        gdx.TimeoutError. Releases the GIL; Ctrl-C interrupts it. Returns True, or with ``return_recv_size=True``
        for a recv_async / recvv_async transfer (True, recv_size) (a list for recvv_async)."""
        timeout_ms = _args.timeout_ms(timeout)
        try:
            received = self._native.wait(transfer_id, timeout_ms)
        except KeyboardInterrupt:
            raise  # still in flight: its arrays stay held
        except GdxTimeoutError:
            if timeout is None:  # the endpoint's own bound: the transfer was reported and forgotten
                self._done(transfer_id)
            raise  # else still in flight: wait or poll again
        except Exception:
            self._done(transfer_id)
            raise
        receive = self._done(transfer_id)
        return True if receive is None else (True, self._size_of(receive, received))

    # ---- one-sided ---------------------------------------------------------------------------------------------
    def advertise(self, conn_id: int, mr_id: int, addr: Any, len: Optional[int] = None,  # noqa: A002 (seed's name)
                  out_buf: Any = None):
        """Lets the peer of `conn_id` read and write [addr, addr + len) of region `mr_id`. With `out_buf` (a
        writable buffer of at least DESCRIPTOR_BYTES, the seed's form) the descriptor is written into it and True
        returned; without, the descriptor is returned (bytes). Hand it to the peer out of band."""
        p, n = _memory(addr, len, "advertise", writable=True)
        descriptor = self._native.advertise(conn_id, mr_id, p, n)
        if out_buf is None:
            return descriptor
        _fill(out_buf, descriptor, "advertise")
        return True

    def advertisev(self, conn_id: int, mr_id_list: Sequence[int], addr_list: Sequence[Any],
                   len_list: Optional[Sequence[int]], out_buf_list: List[Any], num_iovs: Optional[int] = None) -> bool:
        mrs, ptrs, sizes = _iov_lists(mr_id_list, addr_list, len_list, num_iovs, "advertisev", writable=True)
        for i, (mr, p, n) in enumerate(zip(mrs, ptrs, sizes)):
            _fill(out_buf_list[i], self._native.advertise(conn_id, mr, p, n), f"advertisev[{i}]")
        return True

    def write(self, conn_id: int, mr_id: int, src: Any, size: Optional[int], slot_item: Any,
              remote_offset: int = 0) -> bool:
        """Writes local [src, src + size) of region `mr_id` into the peer's advertised range `slot_item` (what its
        advertise() produced) at `remote_offset`; returns once the data is in place there."""
        p, n = _memory(src, size, "write")
        self._blocking(self._native.write, src, conn_id, mr_id, p, n, _descriptor(slot_item, "write"), remote_offset)
        return True

    def read(self, conn_id: int, mr_id: int, dst: Any, size: Optional[int], slot_item: Any,
             remote_offset: int = 0) -> bool:
        """Reads `size` bytes at `remote_offset` of the peer's advertised range into local [dst, ...)."""
        p, n = _memory(dst, size, "read", writable=True)
        self._blocking(self._native.read, dst, conn_id, mr_id, p, n, _descriptor(slot_item, "read"), remote_offset)
        return True

    def write_async(self, conn_id: int, mr_id: int, src: Any, size: Optional[int], slot_item: Any,
                    remote_offset: int = 0) -> Tuple[bool, int]:
        p, n = _memory(src, size, "write_async")
        return self._started(self._native.write_async(conn_id, mr_id, p, n, _descriptor(slot_item, "write_async"),
                                                      remote_offset), src)

    def read_async(self, conn_id: int, mr_id: int, dst: Any, size: Optional[int], slot_item: Any,
                   remote_offset: int = 0) -> Tuple[bool, int]:
        p, n = _memory(dst, size, "read_async", writable=True)
        return self._started(self._native.read_async(conn_id, mr_id, p, n, _descriptor(slot_item, "read_async"),
                                                     remote_offset), dst)

    def writev(self, conn_id: int, mr_id_list: Sequence[int], src_list: Sequence[Any],
               size_list: Optional[Sequence[int]], slot_item_list: Sequence[Any], num_iovs: Optional[int] = None
               ) -> bool:
        mrs, ptrs, sizes = _iov_lists(mr_id_list, src_list, size_list, num_iovs, "writev")
        self._native.writev(conn_id, mrs, ptrs, sizes, [_descriptor(d, "writev") for d in slot_item_list])
        return True

    def readv(self, conn_id: int, mr_id_list: Sequence[int], dst_list: Sequence[Any],
              size_list: Optional[Sequence[int]], slot_item_list: Sequence[Any], num_iovs: Optional[int] = None
              ) -> bool:
        mrs, ptrs, sizes = _iov_lists(mr_id_list, dst_list, size_list, num_iovs, "readv", writable=True)
        self._native.readv(conn_id, mrs, ptrs, sizes, [_descriptor(d, "readv") for d in slot_item_list])
        return True

    # ---- same host, GPU to GPU over NVLink (CUDA IPC; CUDA builds) ---------------------------------------------
    def advertise_ipc(self, mr_id: int, addr: Any, len: Optional[int] = None,  # noqa: A002
                      out_buf: Any = None):
        """A descriptor of GPU region `mr_id`'s [addr, addr + len) that a process on this host opens with CUDA
        IPC (returned, or written into `out_buf` as advertise() does)."""
        p, n = _memory(addr, len, "advertise_ipc", writable=True)
        descriptor = self._native.advertise_ipc(mr_id, p, n)
        if out_buf is None:
            return descriptor
        _fill(out_buf, descriptor, "advertise_ipc")
        return True

    def write_ipc(self, src: Any, size: Optional[int], slot_item: Any, remote_offset: int = 0) -> bool:
        """Copies local GPU (or pinned host) memory into the IPC-advertised range, peer to peer, and returns once it
        finished. The copy runs on a stream of its own, not after work queued on torch's streams: synchronise the
        kernels that write `src` (for read_ipc: that still use `dst`) first."""
        p, n = _memory(src, size, "write_ipc")
        self._native.write_ipc(p, n, bytes(slot_item), remote_offset)
        return True

    def read_ipc(self, dst: Any, size: Optional[int], slot_item: Any, remote_offset: int = 0) -> bool:
        """Copies the IPC-advertised range into local GPU (or pinned host) memory; ordering as write_ipc."""
        p, n = _memory(dst, size, "read_ipc", writable=True)
        self._native.read_ipc(p, n, bytes(slot_item), remote_offset)
        return True

    def writev_ipc(self, src_list: Sequence[Any], size_list: Optional[Sequence[int]],
                   slot_item_list: Sequence[Any]) -> bool:
        sizes = size_list if size_list is not None else [None] * len(src_list)
        for src, n, item in zip(src_list, sizes, slot_item_list):
            self.write_ipc(src, n, item)
        return True

    def readv_ipc(self, dst_list: Sequence[Any], size_list: Optional[Sequence[int]],
                  slot_item_list: Sequence[Any]) -> bool:
        sizes = size_list if size_list is not None else [None] * len(dst_list)
        for dst, n, item in zip(dst_list, sizes, slot_item_list):
            self.read_ipc(dst, n, item)
        return True

    # ---- lifetime ----------------------------------------------------------------------------------------------
    def close(self, conn_id: Optional[int] = None) -> bool:
        """close(conn_id): closes that connection. What still waits on it fails (gdx.ShutdownError naming the close),
        its sockets and threads are released, and the peer's transfers on it fail ("the peer closed the connection").
        Closing it again does nothing. Connections whose peer left are released by the endpoint itself (at the next
        connect/accept); using their ids then raises gdx.PeerFailedError with the cause.

        close(): closes every connection and stops the progress threads; later calls raise gdx.ShutdownError."""
        if conn_id is not None:
            self._native.close_connection(int(conn_id))
            return True
        self._native.close()
        self._in_flight.clear()
        self._sized.clear()
        self._interrupted.clear()
        return True

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"gdx.p2p.Endpoint(ip={self.ip!r}, port={self.port}, local_gpu_idx={self.local_gpu_idx})"
