"""What gdx accepts as memory (gdx/_arrays.py): numpy, buffers, DLPack, the array interfaces; what it refuses."""

import numpy as np
import pytest

import gdx
from gdx._arrays import raw_view


def test_numpy_and_views():
    a = np.arange(100, dtype=np.int32)
    v = raw_view(a)
    assert (v.ptr, v.nbytes, v.kind) == (a.ctypes.data, 400, "host")
    assert raw_view(a[10:20]).ptr == a.ctypes.data + 40


def test_buffer_protocol_and_dlpack():
    b = bytearray(33)
    assert raw_view(b).nbytes == 33
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    if not hasattr(a, "__dlpack__"):
        pytest.skip("numpy without __dlpack__")

    class OnlyDlpack:  # an object that offers nothing but DLPack
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, stream=None):
            return self.arr.__dlpack__()

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    v = raw_view(OnlyDlpack(a))
    assert (v.ptr, v.nbytes, v.kind) == (a.ctypes.data, 96, "host")


def test_refusals_name_the_cause():
    with pytest.raises(gdx.InvalidArgumentError, match="not contiguous"):
        raw_view(np.zeros((4, 4))[:, 1])
    with pytest.raises(gdx.InvalidArgumentError, match="read-only"):
        raw_view(b"immutable")
    with pytest.raises(TypeError, match="a int is not memory gdx can use"):
        raw_view(5)
