"""gdx errors arrive as gdx.Error subclasses carrying the C++ message (rank, peer, operation, values); bad input is
refused before anything is sent; a wait is bounded, interruptible by Ctrl-C, and ends when a peer dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gdx
from conftest import free_port, run_ranks


def _bad_input(rank, world):
    ctx = gdx.Context()
    peer = 1 - rank
    buf = np.zeros(4096, dtype=np.uint8)
    w = ctx.register_window(buf)
    ch = ctx.channel(peer)

    with pytest.raises(gdx.InvalidArgumentError, match=r"range \[4000, \+100\) is outside window") as e:
        ch.put(w, 4000, w, 0, 100)
    assert isinstance(e.value, ValueError) and e.value.code == "invalid argument"
    assert f"rank {rank}" in str(e.value) and f"peer {peer}" in str(e.value)

    stranger = np.zeros(16, dtype=np.uint8)
    with pytest.raises(gdx.InvalidArgumentError, match="lies in no window registered with this Context"):
        ch.put(stranger, 0, w, 0, 16)
    with pytest.raises(gdx.InvalidArgumentError, match="is not contiguous"):
        ctx.register_window(np.zeros((8, 8))[:, ::2])
    with pytest.raises(gdx.InvalidArgumentError, match="signal op 'mul'"):
        ch.signal(0, 1, op="mul")
    with pytest.raises(gdx.InvalidArgumentError):
        ctx.channel(world + 3)
    with pytest.raises(gdx.InvalidArgumentError):
        ctx.wait(ctx.num_signals, 1, timeout=1)

    start = time.monotonic()
    with pytest.raises(gdx.TimeoutError, match=rf"rank {rank}: wait for signal 5 >= 1 timed out after \d+ ms; "
                                               r"last value seen 0") as e:
        ctx.wait(5, 1, timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 5
    assert isinstance(e.value, TimeoutError) and e.value.code == "timeout"

    ctx.barrier()  # nothing bad was sent: the job goes on
    ctx.close()
    with pytest.raises(gdx.ShutdownError):
        ch.put(w, 0, w, 0, 1)
    with pytest.raises(gdx.ShutdownError):
        ctx.barrier()


def test_bad_input_raises_clear_errors():
    run_ranks(2, _bad_input)


def _peer_dies(rank, world):
    ctx = gdx.Context()
    ctx.barrier()
    if rank == 1:
        os._exit(0)  # gone without closing: rank 0's wait must end naming it
    with pytest.raises(gdx.PeerFailedError, match="rank 1") as e:
        ctx.wait(0, 1, timeout=60)
    assert isinstance(e.value, ConnectionError)


def test_dead_peer_ends_the_wait():
    run_ranks(2, _peer_dies, env={"GDX_LOG_LEVEL": "ERROR"})


CTRL_C_CHILD = textwrap.dedent("""
    import sys, time, gdx
    ctx = gdx.Context()
    print("waiting", flush=True)
    try:
        ctx.wait(0, 1, timeout=60)
    except KeyboardInterrupt:
        print(f"interrupted {time.monotonic():.6f}", flush=True)
        sys.exit(0)
    sys.exit(1)
""")


def test_ctrl_c_interrupts_a_wait_within_100_ms():
    env = dict(os.environ, GDX_RANK="0", GDX_WORLD_SIZE="1", GDX_TRANSPORT="loopback",
               GDX_MASTER_PORT=str(free_port()))
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # well inside the wait
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().split()
        assert p.wait(10) == 0 and line[0] == "interrupted", line
        assert float(line[1]) - sent < 0.1, f"KeyboardInterrupt {float(line[1]) - sent:.3f} s after SIGINT"
    finally:
        p.kill()


def test_error_classes_mirror_the_cpp_codes():
    assert issubclass(gdx.TimeoutError, gdx.Error) and issubclass(gdx.TimeoutError, TimeoutError)
    assert issubclass(gdx.InvalidArgumentError, ValueError)
    assert issubclass(gdx.PeerFailedError, ConnectionError)
    codes = {c.code for c in (gdx.InvalidArgumentError, gdx.TimeoutError, gdx.PeerFailedError, gdx.ProtocolError,
                              gdx.SystemError, gdx.CudaError, gdx.VerbsError, gdx.InternalError, gdx.ShutdownError)}
    assert codes == set(gdx._gdx.ERROR_CODE_NAMES) - {"ok"}


def test_p2p_errors_are_gdx_errors():
    from gdx import p2p
    with p2p.Endpoint(-1, 1, port=0) as ep:
        with pytest.raises(gdx.InvalidArgumentError, match="connection 7 does not exist") as e:
            ep.send(7, 1, bytearray(8))
        assert e.value.code == "invalid argument"
