"""gdx.p2p between two real processes over TCP on loopback, with numpy host arrays: connect/accept, send/recv of random
bytes from 1 B to 16 MiB into poisoned buffers (every byte compared), receives into larger buffers in both forms (seed
002's ok, seed 000's (ok, recv_size)), vectors, async + poll, advertise + read/write,
the URL transport's notified writes, errors as gdx exceptions (unknown connection, a range outside its region, a dead
peer), Ctrl-C; and with GPUs (label gpu) torch CUDA tensors and the IPC forms."""

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import gdx
from conftest import run_ranks
from gdx import p2p

POISON = 0xEE
SIZES = [1, 7, 4096, 65537, 1 << 20, 16 << 20]
ENV = {"GDX_TIMEOUT_MS": "20000"}


def _random(seed, n):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _assert_same(got, expected, what):
    mismatch = np.flatnonzero(got != expected)
    assert mismatch.size == 0, f"{what}: {mismatch.size} of {expected.size} bytes differ, first at {mismatch[:8]}"


def _queues():
    ctx = multiprocessing.get_context("spawn")
    return ctx.Queue(), ctx.Queue()  # server -> client, client -> server


def _flush(*queues):
    """Waits until what this process put into the queues reached the pipe: the ranks end with os._exit, which would
    drop what the queues' feeder threads had not written yet."""
    for q in queues:
        q.close()
        q.join_thread()


def _pair(rank, world, server, client, to_client, to_server, endpoint_kwargs=None):
    """Rank 0 runs server(endpoint, conn_id, send, recv), rank 1 client(...); the endpoints are connected first
    (the server's metadata travels through the queue; the client connects by ip/port or by metadata). Both endpoints
    are made with `endpoint_kwargs` besides."""
    send = to_client.put if rank == 0 else to_server.put

    def recv():
        return (to_server if rank == 0 else to_client).get(timeout=60)

    with p2p.Endpoint(-1, 2, port=0, **(endpoint_kwargs or {})) as ep:
        if rank == 0:
            send((ep.ip, ep.port, ep.get_metadata()))
            ok, ip, gpu, conn = ep.accept()
            assert ok and gpu == -1 and ip
            server(ep, conn, send, recv)
        else:
            ip, port, metadata = recv()
            ok, conn = ep.connect(ip, -1, port)
            assert ok
            assert ep.connection_transport(conn).startswith("tcp")
            client(ep, conn, send, recv)
        send("done")
        assert recv() == "done"  # neither side closes while the other still transfers
    _flush(to_client, to_server)


def _run_pair(server, client, **endpoint_kwargs):
    run_ranks(2, _pair, server, client, *_queues(), endpoint_kwargs, env=ENV)


# ---- two-sided -------------------------------------------------------------------------------------------------

def _send_sizes_server(ep, conn, send, recv):
    for i, n in enumerate(SIZES):
        buf = np.full(n, POISON, dtype=np.uint8)
        ok, mr = ep.reg(buf)
        assert ok
        assert ep.recv(conn, mr, buf.ctypes.data, n)  # the seed's pointer form
        _assert_same(buf, _random(i, n), f"recv of {n} bytes")
        ep.dereg(mr)


def _send_sizes_client(ep, conn, send, recv):
    for i, n in enumerate(SIZES):
        data = _random(i, n)
        _, mr = ep.reg(data)
        assert ep.send(conn, mr, data)  # the array form


def test_send_recv_1_byte_to_16_mib():
    _run_pair(_send_sizes_server, _send_sizes_client)


PIECES = [3, 1 << 16, 999_999]


def _vectors_server(ep, conn, send, recv):
    bufs = [np.full(n, POISON, dtype=np.uint8) for n in PIECES]
    mrs = [ep.reg(b)[1] for b in bufs]
    assert ep.recvv(conn, mrs, [b.ctypes.data for b in bufs], PIECES, len(PIECES))
    for i, b in enumerate(bufs):
        _assert_same(b, _random(100 + i, PIECES[i]), f"recvv piece {i}")
    # Async vectors, polled.
    bufs2 = [np.full(n, POISON, dtype=np.uint8) for n in PIECES]
    ok, t = ep.recvv_async(conn, [ep.reg(b)[1] for b in bufs2], bufs2)
    while not ep.poll_async(t)[1]:
        time.sleep(0.001)
    for i, b in enumerate(bufs2):
        _assert_same(b, _random(200 + i, PIECES[i]), f"recvv_async piece {i}")


def _vectors_client(ep, conn, send, recv):
    data = [_random(100 + i, n) for i, n in enumerate(PIECES)]
    assert ep.sendv(conn, [ep.reg(d)[1] for d in data], data)
    data2 = [_random(200 + i, n) for i, n in enumerate(PIECES)]
    ok, t = ep.sendv_async(conn, [ep.reg(d)[1] for d in data2], data2)
    assert ep.wait(t)


def test_sendv_recvv_and_their_async_forms():
    _run_pair(_vectors_server, _vectors_client)


def _async_server(ep, conn, send, recv):
    bufs = [np.full(n, POISON, dtype=np.uint8) for n in SIZES]
    ids = [ep.recv_async(conn, ep.reg(b)[1], b)[1] for b in bufs]  # all posted before any arrives
    pending = set(ids)
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for t in list(pending):
            ok, done = ep.poll_async(t)
            assert ok
            if done:
                pending.discard(t)
    assert not pending, f"transfers {sorted(pending)} not done after 60 s"
    for i, b in enumerate(bufs):
        _assert_same(b, _random(300 + i, SIZES[i]), f"recv_async of {SIZES[i]} bytes")
    with pytest.raises(gdx.InvalidArgumentError, match="unknown"):
        ep.poll_async(ids[0])  # reported done once, then forgotten


def _async_client(ep, conn, send, recv):
    data = [_random(300 + i, n) for i, n in enumerate(SIZES)]
    ids = [ep.send_async(conn, ep.reg(d)[1], d)[1] for d in data]
    for t in ids:
        assert ep.wait(t, timeout=60)


def test_send_async_recv_async_poll():
    _run_pair(_async_server, _async_client)


# ---- receives into larger buffers: seed 002's form (ok) and, with return_recv_size, seed 000's (ok, size) ---------

# (message, buffer) sizes: 1 byte up to exactly the buffer, on both sides of the eager threshold (4096 bytes).
RECV_CASES = [(1, 1), (1, 4096), (4095, 4096), (4096, 4097), (4097, 4097), (1, 1 << 20), (65537, 1 << 20),
              ((1 << 20) - 1, 1 << 20)]
RECVV_PIECES, RECVV_BUFFERS = [3, 5000, 70000], [10, 8192, 1 << 20]
ASYNC_PIECES, ASYNC_BUFFERS = [1, 4097], [4096, 65536]
GUARD = 64  # bytes past each buffer, inside its registered region, that nothing may write either


def _landing(ep, n):
    """A poisoned buffer of n bytes and a guard, registered: (array, mr_id, the buffer's view)."""
    mem = np.full(n + GUARD, POISON, dtype=np.uint8)
    _, mr = ep.reg(mem)
    return mem, mr, mem[:n]


def _check_landed(mem, n, seed, what):
    _assert_same(mem[:n], _random(seed, n), what)
    written = np.flatnonzero(mem[n:] != POISON)
    assert written.size == 0, f"{what}: {written.size} bytes past the {n}-byte message were written, first at " \
        f"{n + written[0]}"


def _recv_forms_server(ep, conn, send, recv, with_size):
    def result(size):  # what a call that completes a receive returns in this form
        return (True, size) if with_size else True

    for i, (n, b) in enumerate(RECV_CASES):
        mem, mr, buf = _landing(ep, b)
        assert ep.recv(conn, mr, buf.ctypes.data, b) == result(n), f"recv of {n} bytes into {b}"
        _check_landed(mem, n, 600 + i, f"recv of {n} bytes into {b}")
    landings = [_landing(ep, b) for b in RECVV_BUFFERS]
    got = ep.recvv(conn, [m for _, m, _ in landings], [v for _, _, v in landings], RECVV_BUFFERS)
    assert got == result(RECVV_PIECES)
    for i, (mem, _, _) in enumerate(landings):
        _check_landed(mem, RECVV_PIECES[i], 700 + i, f"recvv buffer {i}")
    # Async: a recv_async waited for, a recvv_async polled (posted before the client sends).
    mem, mr, buf = _landing(ep, 8192)
    ok, t = ep.recv_async(conn, mr, buf)
    landings = [_landing(ep, b) for b in ASYNC_BUFFERS]
    ok, tv = ep.recvv_async(conn, [m for _, m, _ in landings], [v for _, _, v in landings])
    assert ep.poll_async(tv) == ((True, False, None) if with_size else (True, False))
    send("posted")
    assert ep.wait(t, timeout=60) == result(100)
    _check_landed(mem, 100, 800, "recv_async")
    deadline = time.monotonic() + 60
    while True:
        polled = ep.poll_async(tv)
        if polled[1]:
            break
        assert time.monotonic() < deadline, "recvv_async not done after 60 s"
    assert polled == ((True, True, ASYNC_PIECES) if with_size else (True, True))
    for i, (mem, _, _) in enumerate(landings):
        _check_landed(mem, ASYNC_PIECES[i], 900 + i, f"recvv_async buffer {i}")
    # Too large: both sides fail naming both sizes, nothing is written, and the next message pairs with the next
    # receive.
    mem, mr, buf = _landing(ep, 100)
    with pytest.raises(gdx.InvalidArgumentError,
                       match="the peer's send is 200 bytes, larger than this receive's buffer of 100 bytes"):
        ep.recv(conn, mr, buf)
    _check_landed(mem, 0, 0, "a refused receive")
    assert ep.recv(conn, mr, buf) == result(50)
    _check_landed(mem, 50, 1000, "the receive after a refused one")


def _recv_forms_client(ep, conn, send, recv):
    for i, (n, _) in enumerate(RECV_CASES):
        data = _random(600 + i, n)
        assert ep.send(conn, ep.reg(data)[1], data)
    data = [_random(700 + i, n) for i, n in enumerate(RECVV_PIECES)]
    assert ep.sendv(conn, [ep.reg(d)[1] for d in data], data)
    assert recv() == "posted"
    one = _random(800, 100)
    assert ep.send(conn, ep.reg(one)[1], one)
    data = [_random(900 + i, n) for i, n in enumerate(ASYNC_PIECES)]
    ok, t = ep.sendv_async(conn, [ep.reg(d)[1] for d in data], data)
    assert ep.wait(t) is True  # not a receive: the same in both forms
    big = _random(1, 200)
    with pytest.raises(gdx.InvalidArgumentError, match="has a buffer of 100 bytes, smaller than this send"):
        ep.send(conn, ep.reg(big)[1], big)
    last = _random(1000, 50)
    assert ep.send(conn, ep.reg(last)[1], last)


def _size_form_server(ep, conn, send, recv):
    _recv_forms_server(ep, conn, send, recv, with_size=True)


def _ok_form_server(ep, conn, send, recv):
    _recv_forms_server(ep, conn, send, recv, with_size=False)


def test_recv_into_a_larger_buffer_returns_ok_by_default():
    _run_pair(_ok_form_server, _recv_forms_client)


def test_recv_into_a_larger_buffer_returns_its_size_with_return_recv_size():
    _run_pair(_size_form_server, _recv_forms_client, return_recv_size=True)


def test_return_recv_size_must_be_a_bool():
    with pytest.raises(TypeError, match="return_recv_size"):
        p2p.Endpoint(-1, 1, port=0, return_recv_size="yes")


# ---- one-sided -------------------------------------------------------------------------------------------------

N_ONE_SIDED = (4 << 20) + 3


def _one_sided_server(ep, conn, send, recv):
    region = np.full(2 * N_ONE_SIDED, POISON, dtype=np.uint8)
    _, mr = ep.reg(region)
    filled = np.zeros(16, dtype=np.float32)  # the seed's out_buf form: any writable buffer, here 64 bytes of floats
    assert ep.advertise(conn, mr, region.ctypes.data, N_ONE_SIDED, filled)
    first = filled.tobytes()
    for not_writable in (bytes(64), "x" * 64):
        with pytest.raises(gdx.InvalidArgumentError, match="out_buf"):
            ep.advertise(conn, mr, region.ctypes.data, N_ONE_SIDED, not_writable)
    with pytest.raises(gdx.InvalidArgumentError, match="out_buf has 8 bytes"):
        ep.advertise(conn, mr, region.ctypes.data, N_ONE_SIDED, bytearray(8))
    for out_buf in (bytearray(64), memoryview(bytearray(80)), np.zeros(64, dtype=np.uint8)):
        assert ep.advertise(conn, mr, region.ctypes.data, N_ONE_SIDED, out_buf)
        assert bytes(memoryview(out_buf).cast("B")[:p2p.DESCRIPTOR_BYTES]) != bytes(p2p.DESCRIPTOR_BYTES)
    second = ep.advertise(conn, mr, region[N_ONE_SIDED:])  # returned as bytes
    assert len(second) == p2p.DESCRIPTOR_BYTES
    region[N_ONE_SIDED:] = _random(401, N_ONE_SIDED)  # what the client reads
    send((first, second))
    assert recv() == "written"
    _assert_same(region[:N_ONE_SIDED], _random(400, N_ONE_SIDED), "written range")


def _one_sided_client(ep, conn, send, recv):
    first, second = recv()
    data = _random(400, N_ONE_SIDED)
    _, mr = ep.reg(data)
    half = N_ONE_SIDED // 2
    assert ep.write(conn, mr, data, half, first)  # the first half, then the rest at an offset, async
    ok, t = ep.write_async(conn, mr, data.ctypes.data + half, N_ONE_SIDED - half, first, remote_offset=half)
    assert ep.wait(t)
    got = np.full(N_ONE_SIDED, POISON, dtype=np.uint8)
    _, gmr = ep.reg(got)
    assert ep.read(conn, gmr, got, None, second)
    _assert_same(got, _random(401, N_ONE_SIDED), "read range")
    got[:] = POISON
    pieces = [got[:100], got[100:]]
    assert ep.readv(conn, [gmr, gmr], pieces, None, [second, second[:p2p.DESCRIPTOR_BYTES]], 2)
    expected = _random(401, N_ONE_SIDED)
    _assert_same(got[:100], expected[:100], "readv piece 0")
    _assert_same(got[100:], expected[:N_ONE_SIDED - 100], "readv piece 1")
    with pytest.raises(gdx.InvalidArgumentError):
        ep.write(conn, mr, data, None, first, remote_offset=1)  # one byte past the advertised range
    send("written")


def test_advertise_write_read():
    _run_pair(_one_sided_server, _one_sided_client)


# ---- errors ----------------------------------------------------------------------------------------------------

def _errors_server(ep, conn, send, recv):
    buf = np.zeros(4096, dtype=np.uint8)
    _, mr = ep.reg(buf)
    with pytest.raises(gdx.InvalidArgumentError, match="connection 12345"):
        ep.send(12345, mr, buf)
    with pytest.raises(gdx.InvalidArgumentError, match="outside"):
        ep.send(conn, mr, buf.ctypes.data + 1, 4096)  # one byte past the region
    with pytest.raises(gdx.InvalidArgumentError):
        ep.recv(conn, mr, buf, 8192)  # more than the array has (refused in Python, naming sizes)
    with pytest.raises(gdx.InvalidArgumentError, match="equally long"):
        ep.sendv(conn, [mr, mr], [buf], [1, 2])
    # The client dies; a receive from it fails as a failed peer, well within GDX_TIMEOUT_MS.
    send("die")
    start = time.monotonic()
    with pytest.raises(gdx.PeerFailedError) as e:
        ep.recv(conn, mr, buf)
    assert time.monotonic() - start < 15, f"the dead peer was found only after {time.monotonic() - start:.1f} s"
    assert "recv" in str(e.value) or "connection" in str(e.value), str(e.value)


def _errors_client(ep, conn, send, recv):
    assert recv() == "die"
    os._exit(0)  # no goodbye: the connection just breaks


def _dead_peer_target(rank, world, to_client, to_server):
    if rank == 1:
        _pair(rank, world, _errors_server, _errors_client, to_client, to_server)
        return
    with p2p.Endpoint(-1, 1, port=0) as ep:
        to_client.put((ep.ip, ep.port, ep.get_metadata()))
        _, _, _, conn = ep.accept()
        _errors_server(ep, conn, to_client.put, lambda: to_server.get(timeout=60))
    _flush(to_client, to_server)


def test_errors_unknown_connection_out_of_range_dead_peer():
    run_ranks(2, _dead_peer_target, *_queues(), env=ENV)


def test_bad_arguments_in_process():
    with p2p.Endpoint(-1, 1, port=0) as ep:
        with pytest.raises(gdx.InvalidArgumentError, match="needs a size"):
            ep.reg(1234)
        with pytest.raises(gdx.InvalidArgumentError, match="num_iovs"):
            ep.sendv(1, [1], [np.zeros(4, np.uint8)], None, 2)
        with pytest.raises(gdx.InvalidArgumentError, match="descriptor"):
            ep.write(1, 1, np.zeros(4, np.uint8), None, b"short")
        with pytest.raises(gdx.TimeoutError, match="127.0.0.1"):
            p2p.Endpoint(-1, 1, port=0, timeout=0.3).connect("127.0.0.1", -1, _closed_port())
    with pytest.raises(gdx.ShutdownError, match="closed"):
        ep.reg(np.zeros(4, np.uint8))


def test_a_secret_refuses_clients_without_it_on_both_sides():
    import threading
    with p2p.Endpoint(-1, 1, port=0, timeout=5, secret="the job's secret") as server:
        outcomes = []

        def accept_three():
            for _ in range(3):
                try:
                    outcomes.append(server.accept())
                except gdx.Error as e:
                    outcomes.append(e)

        t = threading.Thread(target=accept_three)
        t.start()
        for secret in ("", "a wrong one"):
            with p2p.Endpoint(-1, 1, port=0, timeout=5, secret=secret) as stranger:
                with pytest.raises(gdx.InvalidArgumentError, match="refused by the peer"):
                    stranger.connect("127.0.0.1", -1, server.port)
        with p2p.Endpoint(-1, 1, port=0, timeout=5, secret="the job's secret") as client:
            ok, conn = client.connect("127.0.0.1", -1, server.port)
            t.join(10)
            assert ok and not t.is_alive()
            assert isinstance(outcomes[0], gdx.ProtocolError) and "presented none" in str(outcomes[0])
            assert isinstance(outcomes[1], gdx.ProtocolError) and "wrong secret" in str(outcomes[1])
            assert outcomes[2][0] is True
            data = _random(7, 5000)
            got = np.full(5000, POISON, dtype=np.uint8)
            _, smr = client.reg(data)
            _, rmr = server.reg(got)
            sent = threading.Thread(target=lambda: client.send(conn, smr, data))
            sent.start()
            assert server.recv(outcomes[2][3], rmr, got.ctypes.data, got.size)
            sent.join(10)
            _assert_same(got, data, "recv after the secret was presented")


def _closed_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens there once this returns


def test_ctrl_c_interrupts_a_blocking_recv_and_wait_timeouts():
    with p2p.Endpoint(-1, 1, port=0) as a, p2p.Endpoint(-1, 1, port=0) as b:
        b.start_passive_accept()
        _, conn = a.add_remote_endpoint(b.get_metadata())
        assert a.add_remote_endpoint(b.get_metadata()) == (True, conn)  # connects once per remote endpoint
        b.accept()
        buf = np.zeros(1 << 20, dtype=np.uint8)
        _, mr = a.reg(buf)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        start = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            a.recv(conn, mr, buf)  # nobody sends
        elapsed = time.monotonic() - start
        timer.join()
        assert elapsed < 0.3 + 0.2, f"Ctrl-C took {elapsed - 0.3:.3f} s to end the recv"
        # A wait with its own timeout leaves the transfer in flight.
        ok, t = a.recv_async(conn, mr, buf)
        with pytest.raises(gdx.TimeoutError, match="not done after"):
            a.wait(t, timeout=0.2)
        assert a.poll_async(t) == (True, False)


# ---- the URL transport -----------------------------------------------------------------------------------------

URL_BYTES = (8 << 20) + 5


def _url_target(rank, world, to_client, to_server):
    mine, theirs = (to_client, to_server) if rank == 0 else (to_server, to_client)
    assert p2p.RdmaTransport.supported("tcp")
    t = p2p.RdmaTransport(-1, "tcp")
    inbox = np.full(URL_BYTES, POISON, dtype=np.uint8)
    data = _random(500 + rank, URL_BYTES)
    dst, src = p2p.RegisteredMemory(inbox), p2p.RegisteredMemory(data)
    mine.put((t.bind(), dst.ptr, dst.remote_key()))
    url, ptr, key = theirs.get(timeout=60)
    t.connect(url)  # returns at once; the writes below wait for the connection
    # Two notified writes: the first half, then the rest (a view at an offset) into the peer's inbox.
    half = URL_BYTES // 2
    f1 = t.write(src.view(0, half), p2p.RemoteBuffer(ptr, key), notify=True)
    f2 = t.write(src.view(half), p2p.RemoteBuffer(ptr + half, key), notify=True)
    assert f1.result(timeout=60) and f2.wait(timeout=60) == "ok"
    assert t.connected
    for _ in range(2):
        assert t.wait_for_write().result(timeout=60)
    _assert_same(inbox, _random(500 + 1 - rank, URL_BYTES), "URL transport inbox")
    with pytest.raises(gdx.InvalidArgumentError):
        src.view(1, URL_BYTES)  # past its end
    bad = t.write(src, p2p.RemoteBuffer(ptr, b"not a key"))
    with pytest.raises(gdx.Error):
        bad.result(timeout=60)
    mine.put("done")
    assert theirs.get(timeout=60) == "done"
    _flush(mine, theirs)


def test_url_transport_notified_writes():
    run_ranks(2, _url_target, *_queues(), env=ENV)


# ---- GPUs: torch CUDA tensors, the IPC forms --------------------------------------------------------------------

def _cuda_or_skip():
    torch = pytest.importorskip("torch", reason="torch is not installed for this interpreter")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    return torch


def _gpu_pair(rank, world, to_client, to_server):
    import torch
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    mine, theirs = (to_client, to_server) if rank == 0 else (to_server, to_client)
    n = 32 << 20
    with p2p.Endpoint(gpu, 2, port=0) as ep:
        g = torch.Generator(device="cuda").manual_seed(600 + rank)
        send = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
        recv = torch.full((n,), POISON, dtype=torch.uint8, device="cuda")
        _, smr = ep.reg(send)
        _, rmr = ep.reg(recv.data_ptr(), n)  # the seed's pointer form
        torch.cuda.synchronize()
        if rank == 0:
            mine.put(ep.get_metadata())
            _, _, peer_gpu, conn = ep.accept()
            assert peer_gpu == (1 % torch.cuda.device_count())
        else:
            _, conn = ep.add_remote_endpoint(theirs.get(timeout=60))
        _, t = ep.recv_async(conn, rmr, recv)
        ep.send(conn, smr, send)
        ep.wait(t)
        g = torch.Generator(device="cuda").manual_seed(600 + 1 - rank)
        expected = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)
        assert torch.equal(recv, expected), f"rank {rank}: received CUDA bytes differ"
        # IPC: each advertises its recv tensor; the other writes its send there and reads it back.
        recv.fill_(POISON)
        torch.cuda.synchronize()
        mine.put(ep.advertise_ipc(rmr, recv))
        descriptor = theirs.get(timeout=60)
        assert ep.write_ipc(send, None, descriptor)
        back = torch.full((n,), POISON, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()  # the poison is in place before the IPC copy (its own stream) writes over it
        assert ep.read_ipc(back, None, descriptor)
        assert torch.equal(back, send), f"rank {rank}: read_ipc differs from what write_ipc wrote"
        mine.put("written")
        assert theirs.get(timeout=60) == "written"
        torch.cuda.synchronize()
        assert torch.equal(recv, expected), f"rank {rank}: bytes written by write_ipc differ"
        mine.put("done")
        assert theirs.get(timeout=60) == "done"
    _flush(mine, theirs)


@pytest.mark.gpu
def test_cuda_tensors_send_recv_and_ipc():
    _cuda_or_skip()
    run_ranks(2, _gpu_pair, *_queues(), env=ENV)


# ---- close(conn_id) --------------------------------------------------------------------------------------------

def _close_server(ep, conn, send, recv):
    assert recv() == "posted"
    buf = np.full(100, POISON, dtype=np.uint8)
    _, mr = ep.reg(buf)
    ok, t = ep.recv_async(conn, mr, buf)
    assert ep.close(conn)
    with pytest.raises(gdx.ShutdownError, match=f"closed by close\\({conn}\\) on this side"):
        ep.wait(t)
    assert ep.close(conn)  # again: nothing happens
    with pytest.raises(gdx.PeerFailedError, match=f"connection {conn} was released"):
        ep.send(conn, mr, buf)
    assert (buf == POISON).all()


def _close_client(ep, conn, send, recv):
    buf = np.full(100, POISON, dtype=np.uint8)
    _, mr = ep.reg(buf)
    ok, t = ep.recv_async(conn, mr, buf)
    send("posted")
    start = time.monotonic()
    with pytest.raises(gdx.PeerFailedError, match="the peer closed the connection"):
        ep.wait(t)
    assert time.monotonic() - start < 3, "the close was seen only after the timeout"
    assert (buf == POISON).all()


def test_close_a_connection_fails_what_waits_on_both_sides():
    _run_pair(_close_server, _close_client)
