"""The native MoE layer (gdx._gdx.ep) and the torch extension (gdx._gdx_torch), each looked up once: at small token
counts the host time of a call is on the critical path, so nothing here is recomputed per call."""

import os
from typing import Any

from .. import _gdx
from ._torch import torch as _torch

_ep_module = None
_DTYPES = None  # (bfloat16, float8_e4m3) of _gdx.ep.DType
_FP8: Any = False  # torch.float8_e4m3fn (None where this torch has none); False until looked up
_EXT: Any = False  # gdx._gdx_torch, or None where it was not built / does not load; False until looked up


def native_ep():
    """_gdx.ep, or NotImplementedError for a build without CUDA."""
    global _ep_module
    if _ep_module is None:
        if not _gdx.ep_available():
            raise NotImplementedError("gdx.ep needs a build of gdx with CUDA (nvcc was not found when it was built)")
        _ep_module = _gdx.ep
    return _ep_module


def native_dtype(fp8: bool):
    """The native DType of a dispatch's x: float8_e4m3 with scales, else bfloat16."""
    global _DTYPES
    if _DTYPES is None:
        ep = native_ep()
        _DTYPES = (ep.DType.bfloat16, ep.DType.float8_e4m3)
    return _DTYPES[fp8]


def fp8_dtype():
    """torch.float8_e4m3fn, or None where this torch has no FP8 dtype."""
    global _FP8
    if _FP8 is False:
        _FP8 = getattr(_torch(), "float8_e4m3fn", None)
    return _FP8


def torch_extension():
    """gdx._gdx_torch (the calls' fast path: tensors in, tensors out, one crossing into C++), or None: gdx was built
    without it (torch's headers were not found), this process's torch is not the one it was built against, or
    GDX_EP_TORCH_EXTENSION=0 asks for the pointer path (gdx._gdx with tensors made in Python)."""
    global _EXT
    if _EXT is False:
        _EXT = None
        if os.environ.get("GDX_EP_TORCH_EXTENSION", "1") == "0":  # the pointer path alone (comparisons, tests)
            return None
        try:
            _torch()  # the extension needs torch's libraries loaded first
            from .. import _gdx_torch
        except ImportError:
            pass
        else:
            if _gdx_torch.torch_version() == _torch().__version__.split("+")[0]:
                _EXT = _gdx_torch
    return _EXT


def address(t) -> int:
    """The device address of an optional tensor, 0 for None (the native structs' null)."""
    return t.data_ptr() if t is not None else 0
