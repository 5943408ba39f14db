"""gdx's exceptions: every error the C++ library reports arrives as a subclass of :class:`gdx.Error`.

The message is the C++ one unchanged (it names the rank, the peer, the operation and the values seen); ``code`` is
the gdx error code's name (``"timeout"``, ``"invalid argument"``, ...). Where a builtin exception means the same
thing, the class derives from it too, so ``except TimeoutError`` and ``except ValueError`` work as expected.
"""

from . import _gdx


class Error(RuntimeError):
    """Base of every gdx error. ``code``: the gdx error code's name."""

    code = "unknown error"


class InvalidArgumentError(Error, ValueError):
    """A bad peer, window, offset, size, signal id or dtype; refused before anything was sent."""

    code = "invalid argument"


class TimeoutError(Error, TimeoutError):  # noqa: A001 - deliberately also the builtin
    """A bounded wait (GDX_TIMEOUT_MS, or the call's timeout) ran out."""

    code = "timeout"


class PeerFailedError(Error, ConnectionError):
    """A peer died, closed its connections or sent something malformed."""

    code = "peer failed"


class ProtocolError(Error):
    """A malformed or unauthenticated message (a wrong job secret, another world size)."""

    code = "protocol error"


class SystemError(Error, OSError):  # noqa: A001
    """A C library call failed (errno in the message)."""

    code = "system error"


class CudaError(Error):
    """A CUDA runtime call failed."""

    code = "CUDA error"


class VerbsError(Error, OSError):
    """An ibverbs call failed."""

    code = "verbs error"


class InternalError(Error):
    """An invariant of gdx itself was violated (a bug: please report it with the message)."""

    code = "internal error"


class ShutdownError(Error):
    """The object's Context is closed (or was closed while the call waited)."""

    code = "shutdown"


_CLASSES = [InvalidArgumentError, TimeoutError, PeerFailedError, ProtocolError, SystemError, CudaError, VerbsError,
            InternalError, ShutdownError]
_BY_CODE = {cls.code: cls for cls in _CLASSES}
# The C++ side names its codes; a code without a class here would be a mismatch between the two halves.
assert set(_gdx.ERROR_CODE_NAMES) - {"ok"} == set(_BY_CODE), (_gdx.ERROR_CODE_NAMES, sorted(_BY_CODE))
_gdx._set_error_classes(dict(_BY_CODE))
