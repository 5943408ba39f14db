"""Turns what users hand gdx (torch tensors, numpy arrays, objects with ``__cuda_array_interface__``,
``__array_interface__`` or ``__dlpack__``, writable buffers) into the raw view the extension takes: an address, a
byte count and where the memory lives. Nothing here imports torch: a tensor is recognised by its type's module."""

import ctypes
from dataclasses import dataclass
from typing import Any, Tuple

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class RawView:
    ptr: int
    nbytes: int
    kind: str  # "host" or "cuda"
    device: int = -1  # the CUDA device of "cuda" memory, -1 when unknown or host
    readonly: bool = False  # the object says its memory must not be written (numpy's writeable flag, bytes, ...)


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda")


def _contiguous_bytes(shape, strides, itemsize: int, what: str) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    if strides is not None and n > 0:
        expected = itemsize
        for dim, stride in zip(reversed(shape), reversed(strides)):
            if int(dim) != 1 and int(stride) != expected:
                raise InvalidArgumentError(f"{what} is not contiguous (shape {tuple(shape)}, strides "
                                           f"{tuple(strides)} in bytes); pass a contiguous copy")
            expected *= int(dim)
    return n * itemsize


def _itemsize_of(typestr: str) -> int:
    return int(typestr[2:])


def _from_torch(t) -> RawView:
    if not t.is_contiguous():
        raise InvalidArgumentError(f"tensor of shape {tuple(t.shape)} is not contiguous; pass t.contiguous()")
    kind = "cuda" if t.is_cuda else "host"
    return RawView(int(t.data_ptr()), t.numel() * t.element_size(), kind, t.device.index if t.is_cuda else -1)


def _from_interface(iface: dict, kind: str, what: str) -> RawView:
    data = iface.get("data")
    ptr = int(data[0]) if data is not None else 0
    readonly = bool(data[1]) if data is not None else False  # (address, read-only flag) in both interfaces
    if iface.get("mask") is not None:
        raise InvalidArgumentError(f"{what}: masked arrays are not supported")
    strides = iface.get("strides")
    itemsize = _itemsize_of(iface["typestr"])
    return RawView(ptr, _contiguous_bytes(iface["shape"], strides, itemsize, what), kind, readonly=readonly)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


def _from_dlpack(obj, what: str) -> RawView:
    # The capsule is only read (not renamed to "used_dltensor"): dropping it calls the producer's deleter, and the
    # memory stays owned by `obj`, which the caller keeps alive.
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = [t.strides[i] * itemsize for i in range(t.ndim)] if t.strides else None
    nbytes = _contiguous_bytes(shape, strides, itemsize, what)
    if t.device.device_type == _DL_CUDA:
        kind, device = "cuda", t.device.device_id
    elif t.device.device_type in (_DL_CPU, _DL_CUDA_HOST):
        kind, device = "host", -1
    else:
        raise InvalidArgumentError(f"{what}: DLPack device type {t.device.device_type} is neither CPU nor CUDA")
    return RawView((t.data or 0) + t.byte_offset, nbytes, kind, device)


class _PyBuffer(ctypes.Structure):  # CPython's Py_buffer (Include/pybuffer.h), stable since 3.3
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _buffer_address(obj: Any) -> int:
    """Address of a (possibly read-only) buffer; ctypes' from_buffer takes writable ones only."""
    view = _PyBuffer()
    get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    get.restype, get.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    release.restype, release.argtypes = None, [ctypes.POINTER(_PyBuffer)]
    get(obj, ctypes.byref(view), 0)  # PyBUF_SIMPLE: read access to contiguous bytes; raises when refused
    try:
        return int(view.buf or 0)
    finally:
        release(ctypes.byref(view))


def _view_of(obj: Any, what: str) -> RawView:
    if _is_torch_tensor(obj):
        return _from_torch(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_interface(obj.__cuda_array_interface__, "cuda", what)
    if hasattr(obj, "__array_interface__"):
        return _from_interface(obj.__array_interface__, "host", what)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, what)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{what}: a {type(obj).__name__} is not memory gdx can use (a torch tensor, a numpy array, or an object "
            "with __cuda_array_interface__, __array_interface__, __dlpack__ or the buffer protocol)") from None
    if not mv.contiguous:
        raise InvalidArgumentError(f"{what}: the buffer is not contiguous")
    if mv.nbytes == 0:
        return RawView(0, 0, "host", readonly=mv.readonly)
    if mv.readonly:
        return RawView(_buffer_address(mv), mv.nbytes, "host", readonly=True)
    return RawView(ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes, "host")


def raw_view(obj: Any, what: str = "array", writable: bool = True) -> RawView:
    """The memory of `obj` (contiguous only): address, bytes, "host" or "cuda". With `writable` (memory gdx or a
    peer writes into: a window, a receive's or read's destination), read-only memory (a numpy array whose
    writeable flag is off, such as one over bytes or a read-only mmap; bytes themselves) is refused."""
    view = _view_of(obj, what)
    if writable and view.readonly:
        raise InvalidArgumentError(f"{what}: the {type(obj).__name__} is read-only, and gdx (or a peer) would write "
                                   "into it; pass writable memory")
    return view


class DeviceArray:
    """The other direction: device memory gdx owns (a handle's arrays), as an object torch.as_tensor and other
    __cuda_array_interface__ consumers take without copying. Holds `owner`, so the memory outlives every view."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], typestr: str, owner: Any):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": None}
        self._owner = owner
