"""What gdx.ep asks torch on every call, kept cheap: dispatch and combine kernels last tens of microseconds at small
token counts, so the host work of each call is on the critical path once it exceeds them.

- ``torch()``: the module, imported on first use (importing gdx never imports torch) and looked up once after.
- ``current_stream_handle()``: the cudaStream_t of the current stream of the current device, the value of
  ``torch.cuda.current_stream().cuda_stream`` read without building a torch.cuda.Stream object (a few microseconds
  each time): through torch._C's raw getters where this torch has them (CUDA builds; Inductor's generated code
  calls the same), else through the public call.
"""

from typing import Any, Callable, Optional

_module: Any = None
_read_stream: Optional[Callable[[], int]] = None


def torch() -> Any:
    global _module
    if _module is None:
        import torch as module
        _module = module
    return _module


def _stream_reader() -> Callable[[], int]:
    c = torch()._C
    raw, device = getattr(c, "_cuda_getCurrentRawStream", None), getattr(c, "_cuda_getDevice", None)
    if raw is None or device is None:
        cuda = torch().cuda
        return lambda: cuda.current_stream().cuda_stream
    return lambda: raw(device())


def current_stream_handle() -> int:
    global _read_stream
    if _read_stream is None:
        _read_stream = _stream_reader()
    return _read_stream()


def check(t, dtype, ndim: int, what: str):
    """`t` as a contiguous CUDA tensor of `dtype` and `ndim` dimensions (a contiguous copy if it is not), or
    gdx.InvalidArgumentError naming `what`."""
    if t.dtype != dtype or t.dim() != ndim:
        raise _invalid(f"{what}: expected a {ndim}-d {dtype} tensor, got {t.dim()}-d {t.dtype}")
    if not t.is_cuda:
        raise _invalid(f"{what}: expected a CUDA tensor, got one on {t.device}")
    return t if t.is_contiguous() else t.contiguous()


def _invalid(message: str):
    from ..errors import InvalidArgumentError
    return InvalidArgumentError(message)


_capturing: Optional[Callable[[], bool]] = None


def is_capturing() -> bool:
    """torch.cuda.is_current_stream_capturing(), through torch._C's raw call where this torch has it (no Python
    wrapper on the way: a call's host time matters)."""
    global _capturing
    if _capturing is None:
        c = torch()._C
        _capturing = getattr(c, "_cuda_isCurrentStreamCapturing", None) or torch().cuda.is_current_stream_capturing
    return bool(_capturing())
