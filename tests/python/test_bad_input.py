"""Bad input to the Python API ends in a clear exception, never in a crash or a silent default: read-only memory as a
receive's destination (a numpy array over a PROT_READ mapping, over bytes) or as a window, a bool or negative
pointer, a port out of range, negative or NaN timeouts, a RemoteBuffer that is None; and accept(), which waits without
a bound until Ctrl-C or close() ends it."""

import mmap
import os
import signal
import threading
import time

import numpy as np
import pytest

import gdx
from conftest import run_ranks
from gdx import p2p
from gdx.p2p.url_transport import WriteFuture

N = 4096
NEGATIVE_TIMEOUT = r"timeout must be >= 0 seconds \(None: the default bound\), got -1"


def _connected_pair():
    a, b = p2p.Endpoint(-1, 1, port=0), p2p.Endpoint(-1, 1, port=0)
    b.start_passive_accept()
    _, conn_a = a.add_remote_endpoint(b.get_metadata())
    _, _, _, conn_b = b.accept()
    return a, conn_a, b, conn_b


def test_recv_into_a_read_only_mapping_raises_and_the_connection_still_works(tmp_path):
    path = tmp_path / "read-only"
    path.write_bytes(b"\x11" * N)
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(fd, N, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    ro = np.frombuffer(mapping, dtype=np.uint8)
    assert not ro.flags.writeable
    a, conn_a, b, conn_b = _connected_pair()
    try:
        data = np.arange(N, dtype=np.uint32).astype(np.uint8)
        _, mr_b = b.reg(data)
        _, t = b.send_async(conn_b, mr_b, data)
        _, mr_ro = a.reg(ro)  # registering read-only memory to send from it is fine
        for call in (lambda: a.recv(conn_a, mr_ro, ro), lambda: a.recv_async(conn_a, mr_ro, ro),
                     lambda: a.recvv(conn_a, [mr_ro], [ro]), lambda: a.advertise(conn_a, mr_ro, ro)):
            with pytest.raises(gdx.InvalidArgumentError, match="ndarray is read-only"):
                call()
        out = np.zeros(N, dtype=np.uint8)
        _, mr_out = a.reg(out)
        a.recv(conn_a, mr_out, out)  # the message the refused recv did not take
        assert b.wait(t, timeout=30)
        assert (out == data).all()
        assert mapping[:] == b"\x11" * N
    finally:
        a.close()
        b.close()


def test_bytes_are_sent_from_but_never_received_into():
    a, conn_a, b, conn_b = _connected_pair()
    try:
        frozen = bytes(range(256)) * 16
        frozen_view = np.frombuffer(frozen, dtype=np.uint8)
        _, mr_src = b.reg(frozen)  # read-only memory is a valid source
        _, t = b.send_async(conn_b, mr_src, frozen)
        for dst in (frozen, frozen_view):
            _, mr = a.reg(dst)
            with pytest.raises(gdx.InvalidArgumentError, match="read-only"):
                a.recv(conn_a, mr, dst)
            with pytest.raises(gdx.InvalidArgumentError, match="read-only"):
                a.read(conn_a, mr, dst, None, b"\0" * p2p.DESCRIPTOR_BYTES)
        out = bytearray(len(frozen))
        _, mr_out = a.reg(out)
        a.recv(conn_a, mr_out, out)
        assert b.wait(t, timeout=30)
        assert bytes(out) == frozen == bytes(range(256)) * 16
    finally:
        a.close()
        b.close()


def test_pointer_size_port_and_timeout_are_checked():
    with p2p.Endpoint(-1, 1, port=0) as ep:
        with pytest.raises(TypeError, match="bool"):
            ep.reg(True, 64)
        with pytest.raises(TypeError, match="bool"):
            ep.reg(np.zeros(8, np.uint8), True)
        with pytest.raises(gdx.InvalidArgumentError, match="pointer must be >= 0, got -4096"):
            ep.reg(-4096, 64)
        with pytest.raises(gdx.InvalidArgumentError, match="size must be >= 0, got -1"):
            ep.reg(np.zeros(8, np.uint8), -1)
        with pytest.raises(TypeError, match="NoneType"):
            ep.send(0, 1, None, 8)
        with pytest.raises(TypeError, match="float"):
            ep.reg(np.zeros(8, np.uint8), 2.5)
        t = 12345
        for bad in (-1, -0.001, float("nan")):
            with pytest.raises(gdx.InvalidArgumentError, match=f"timeout must be >= 0 seconds.*{bad}"):
                ep.wait(t, timeout=bad)
        with pytest.raises(TypeError, match="timeout must be a number"):
            ep.wait(t, timeout="1")
    for port in (-7, -1, 65536):
        with pytest.raises(gdx.InvalidArgumentError, match=f"port must be 0 .* to 65535.*got {port}"):
            p2p.Endpoint(-1, 1, port=port)
    with pytest.raises(TypeError, match="port must be an integer"):
        p2p.Endpoint(-1, 1, port="19500")
    with pytest.raises(gdx.InvalidArgumentError, match="timeout must be >= 0 seconds"):
        p2p.Endpoint(-1, 1, port=0, timeout=-2)
    with pytest.raises(gdx.InvalidArgumentError, match=r"local_gpu_idx must be a GPU index or -1 \(host memory only\), got -2"):
        p2p.Endpoint(-2, 1, port=0)
    with pytest.raises(gdx.InvalidArgumentError, match="remote_port"):
        p2p.Endpoint(-1, 1, port=0).connect("127.0.0.1", -1, -3)


def test_url_transport_write_checks_its_arguments():
    t = p2p.RdmaTransport(-1, "tcp")
    mem = p2p.RegisteredMemory(np.zeros(64, np.uint8))
    with pytest.raises(TypeError, match="remote must be a RemoteBuffer.*NoneType"):
        t.write(mem, None)
    with pytest.raises(TypeError, match="local must be an RdmaMemory"):
        t.write(np.zeros(4, np.uint8), p2p.RemoteBuffer(mem.ptr, mem.remote_key()))
    with pytest.raises(TypeError, match="bool"):
        p2p.RegisteredMemory(True, 64)
    with pytest.raises(gdx.InvalidArgumentError, match="read-only"):
        p2p.RegisteredMemory(b"the peer would write here")
    future = WriteFuture(None, "a future the check stops before its native half")
    with pytest.raises(gdx.InvalidArgumentError, match=NEGATIVE_TIMEOUT):
        future.wait(-1)


def _read_only_window_and_negative_wait(rank, world):
    with gdx.Context() as ctx:
        with pytest.raises(gdx.InvalidArgumentError, match="register_window: the ndarray is read-only"):
            ctx.register_window(np.frombuffer(b"\0" * 64, dtype=np.uint8))
        with pytest.raises(gdx.InvalidArgumentError, match="register_window: the bytes is read-only"):
            ctx.register_window(b"\0" * 64)
        with pytest.raises(gdx.InvalidArgumentError, match=NEGATIVE_TIMEOUT):
            ctx.wait(0, 1, timeout=-1)


def test_context_refuses_read_only_windows_and_negative_timeouts():
    run_ranks(1, _read_only_window_and_negative_wait)


def _trace_to_a_missing_folder(rank, world, path):
    with pytest.raises(gdx.InvalidArgumentError, match=f"GDX_TRACE: cannot write {path}.*No such file or directory"):
        gdx.Context()


def test_an_unwritable_gdx_trace_is_refused_when_the_context_starts(tmp_path):
    path = str(tmp_path / "no-such-folder" / "trace.rank0.json")
    run_ranks(1, _trace_to_a_missing_folder, path, env={"GDX_TRACE": str(tmp_path / "no-such-folder" / "trace.json")})


def _unnamed_windows_in_opposite_order(rank, world):
    big, small = np.zeros(256 << 10, np.uint8), np.zeros(4 << 10, np.uint8)
    with gdx.Context() as ctx:
        first = big if rank == 0 else small
        with pytest.raises(gdx.InvalidArgumentError, match="different sizes where they must be equal.*rank 0 called "
                           "registerWindow of 262144 bytes but rank 1 called registerWindow of 4096 bytes"):
            ctx.register_window(first)
        w = ctx.register_window(first, sizes_may_differ=True)  # said so: allowed
        assert w.remote_size(1 - rank) == (4 << 10 if rank == 0 else 256 << 10)
        ctx.barrier()


def test_unnamed_windows_must_agree_in_size_unless_the_call_allows_it():
    run_ranks(2, _unnamed_windows_in_opposite_order)


# ---- accept() waits without a bound; Ctrl-C and close() end it --------------------------------------------------

def test_accept_outlasts_the_timeout_and_takes_a_late_client():
    with p2p.Endpoint(-1, 1, port=0, timeout=0.3) as server, p2p.Endpoint(-1, 1, port=0) as client:
        got = []
        late = threading.Timer(1.0, lambda: got.append(client.connect("127.0.0.1", -1, server.port)))
        late.start()
        start = time.monotonic()
        ok, ip, gpu, conn = server.accept()  # 0.3 s is the endpoint's timeout: accept() waits past it
        late.join()
        assert ok and gpu == -1 and time.monotonic() - start >= 0.9
        assert got and got[0][0]


def test_close_from_another_thread_ends_accept():
    server = p2p.Endpoint(-1, 1, port=0, timeout=0.3)
    closer = threading.Timer(0.8, server.close)
    start = time.monotonic()
    closer.start()
    with pytest.raises(gdx.ShutdownError, match="accept: this gdx.p2p.Endpoint was closed"):
        server.accept()
    elapsed = time.monotonic() - start
    closer.join()
    assert 0.8 <= elapsed < 0.8 + 0.5, f"accept ended after {elapsed:.3f} s"


@pytest.mark.parametrize("passive", [False, True])
def test_ctrl_c_ends_accept(passive):
    with p2p.Endpoint(-1, 1, port=0, timeout=10) as server:
        if passive:
            server.start_passive_accept()
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            server.accept()
        elapsed = time.monotonic() - start
        timer.join()
        assert elapsed < 0.3 + 0.2, f"Ctrl-C took {elapsed - 0.3:.3f} s to end accept()"
