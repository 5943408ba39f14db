"""Checks of the scalar arguments the Python API passes on to the extension (ports, timeouts, pointers, sizes):
a wrong type raises TypeError, a value out of range gdx.InvalidArgumentError (a ValueError), each naming the
argument and the value, before anything reaches C++ (where -1 means "the default" and a bool is an int)."""

import math
import operator
from typing import Any, Optional

from .errors import InvalidArgumentError


def integer(value: Any, what: str) -> int:
    """`value` as an int; TypeError for a bool, a float, a string or None."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not a bool ({value!r})")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__} ({value!r})") from None


def non_negative(value: Any, what: str) -> int:
    n = integer(value, what)
    if n < 0:
        raise InvalidArgumentError(f"{what} must be >= 0, got {n}")
    return n


def port(value: Any, what: str = "port") -> int:
    """A TCP port, 0 (any free one) to 65535."""
    n = integer(value, what)
    if not 0 <= n <= 65535:
        raise InvalidArgumentError(f"{what} must be 0 (any free port) to 65535, or None for the default; got {n}")
    return n


def timeout_ms(timeout: Optional[float], what: str = "timeout") -> int:
    """Seconds -> milliseconds for the extension: None -> 0 (the default bound), else at least 1 ms."""
    if timeout is None:
        return 0
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, not {type(timeout).__name__} ({timeout!r})")
    if math.isnan(timeout) or timeout < 0:
        raise InvalidArgumentError(f"{what} must be >= 0 seconds (None: the default bound), got {timeout!r}")
    if math.isinf(timeout):
        raise InvalidArgumentError(f"{what} must be finite (None: the default bound), got {timeout!r}")
    return max(1, int(timeout * 1000))
