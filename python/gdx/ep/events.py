"""gdx.ep.EventOverlap: DeepEP's event wrapper, and the event a call returns."""

from typing import Any, Optional, Tuple

from ..errors import InvalidArgumentError
from ._torch import torch as _torch


class EventOverlap:
    """DeepEP's EventOverlap: a CUDA event (None unless the call had async_finish) and the tensors to keep alive
    until it completed. ``current_stream_wait()`` makes the current stream wait for it; as a context manager
    (``with event:``) it does so on exit."""

    def __init__(self, event: Any = None, extra_tensors: Optional[Tuple] = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is None:
            raise InvalidArgumentError("EventOverlap.current_stream_wait: no event (the call had async_finish=False)")
        _torch().cuda.current_stream().wait_event(self.event)

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc) -> None:
        if self.event is not None:
            self.current_stream_wait()


def capture() -> EventOverlap:
    """An event recorded on the current stream."""
    torch = _torch()
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream())
    return EventOverlap(event)


def end_event(async_finish: bool, tensors: Tuple) -> EventOverlap:
    """The event a call returns: with async_finish one recorded on the current stream (where the call's kernels
    went), keeping `tensors` alive until it completed; otherwise an empty one."""
    if not async_finish:
        return EventOverlap()
    event = _torch().cuda.Event()
    event.record()
    return EventOverlap(event, tuple(t for t in tensors if t is not None))
