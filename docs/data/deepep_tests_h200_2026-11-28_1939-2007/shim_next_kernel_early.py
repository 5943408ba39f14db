# gdx.ep with each low-latency kernel letting the next one start from its start (LowLatencyConfig.next_kernel_early)
from gdx.ep import *  # noqa: F401,F403
import gdx.ep.low_latency as _ll

_orig = _ll.LowLatencyMode.native_config


def _early(*args):
    c = _orig(*args)
    c.next_kernel_early = True
    return c


_ll.LowLatencyMode.native_config = staticmethod(_early)
