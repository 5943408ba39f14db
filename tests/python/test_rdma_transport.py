"""gdx.p2p.RdmaTransport under the seed's names (torchcomms' RdmaTransport, seed 004): the ping-pong from one thread
(server.connect(client_url) before client.connect(server_url), which the earlier blocking connect() deadlocked on),
random bytes into a poisoned destination compared byte for byte, and bad input: views outside the memory, forged and
stale keys, malformed URLs, a peer that never connects (GDX_TIMEOUT_MS small: the futures resolve with commTimeout
within it), destroyed memory. Real sockets; the timeout cases in processes of their own (conftest.run_ranks)."""

import time

import numpy as np
import pytest

import gdx
from gdx import p2p
from gdx.p2p import CommResult, RdmaMemory, RdmaRemoteBuffer, RdmaTransport
from conftest import free_port, run_ranks

POISON = 0xA5


def _random(seed, n):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _pair():
    server, client = RdmaTransport(0), RdmaTransport(1)  # the seed's devices; host memory here
    server_url, client_url = server.bind(), client.bind()
    assert server.connect(client_url) == CommResult.commSuccess  # returns at once: the peer has not connected yet
    assert client.connect(server_url) == CommResult.commSuccess
    return server, client


@pytest.mark.parametrize("nbytes", [8192, 2, (3 << 20) + 7])
def test_seed_ping_pong_from_one_thread_every_byte_checked(nbytes):
    server, client = _pair()
    server_buf, client_buf = _random(nbytes, nbytes), np.full(nbytes, POISON, dtype=np.uint8)
    server_mem, client_mem = RdmaMemory(server_buf, nbytes, 0), RdmaMemory(client_buf, nbytes, 1)
    assert server_mem.get_device() == 0 and server_mem.local_key() != 0
    # Ping: server -> client, the view made from the buffer's address as the seed does.
    client_remote = RdmaRemoteBuffer(ptr=client_buf.ctypes.data, access_key=client_mem.remote_key())
    write_future = server.write(server_mem.create_view(ptr=server_buf.ctypes.data, length=nbytes), client_remote, True)
    wait_future = client.wait_for_write()
    assert write_future.get() == CommResult.commSuccess
    assert wait_future.get() == CommResult.commSuccess
    assert server.connected and client.connected()  # a property that may also be called, as the seed does
    assert np.array_equal(client_buf, server_buf), "the ping's bytes differ"
    # Pong: the second half of the client's buffer (new bytes) into the first half of the server's.
    half = nbytes // 2
    client_buf[half:] = _random(nbytes + 1, nbytes - half)
    server_remote = RdmaRemoteBuffer(server_buf.ctypes.data, server_mem.remote_key())
    pong = client.write(client_mem.create_view(half, nbytes - half), server_remote, notify=True)
    assert server.wait_for_write().get() == CommResult.commSuccess
    assert pong.get() == CommResult.commSuccess
    assert np.array_equal(server_buf[:nbytes - half], client_buf[half:]), "the pong's bytes differ"
    assert np.array_equal(server_buf[nbytes - half:], _random(nbytes, nbytes)[nbytes - half:]), "written past the pong"


def test_views_outside_the_memory_are_refused():
    buf = np.zeros(1000, dtype=np.uint8)
    mem = RdmaMemory(buf)
    for bad in [lambda: mem.create_view(999, 2), lambda: mem.create_view(1001, 0), lambda: mem.create_view(-1, 1),
                lambda: mem.create_view(ptr=buf.ctypes.data + 990, length=11),
                lambda: mem.create_view(ptr=buf.ctypes.data - 1, length=1),
                lambda: mem.create_view(np.zeros(8, dtype=np.uint8))]:  # an array outside the memory
        with pytest.raises(gdx.InvalidArgumentError, match="outside"):
            bad()
    view = mem.create_view(buf[900:])  # an array inside it
    assert (view.data(), view.size(), view.memory) == (buf.ctypes.data + 900, 100, mem)
    assert mem.view(10) == mem.create_view(10, 990)  # the earlier name
    assert mem.contains(buf.ctypes.data + 500, 500) and not mem.contains(buf.ctypes.data + 500, 501)
    assert p2p.RegisteredMemory is RdmaMemory and p2p.RemoteBuffer is RdmaRemoteBuffer


def test_forged_stale_and_misplaced_keys_write_nothing():
    a, b = _pair()
    src, dst = _random(5, 64 << 10), np.full(64 << 10, POISON, dtype=np.uint8)
    src_mem, dst_mem = RdmaMemory(src), RdmaMemory(dst)
    key = dst_mem.remote_key()
    forged = key[:-1] + (b"1" if key[-1:] == b"0" else b"0")
    other = np.full(4096, POISON, dtype=np.uint8)
    gone = RdmaMemory(other)
    stale = gone.remote_key()
    del gone
    view = src_mem.create_view(0, 4096)
    for remote in [RdmaRemoteBuffer(dst.ctypes.data, b"not-a-key"), RdmaRemoteBuffer(dst.ctypes.data, forged),
                   RdmaRemoteBuffer(other.ctypes.data, stale),
                   RdmaRemoteBuffer(dst.ctypes.data + dst.nbytes - 100, key)]:
        assert a.write(view, remote, True).get() == CommResult.commInvalidArgument, remote
    assert (dst == POISON).all() and (other == POISON).all()
    assert a.write(view, RdmaRemoteBuffer(dst.ctypes.data, key), True).get() == CommResult.commSuccess
    assert b.wait_for_write().get() == CommResult.commSuccess
    assert np.array_equal(dst[:4096], src[:4096])


def test_malformed_urls_and_calls_out_of_order_are_refused_at_once():
    t = RdmaTransport(-1, "tcp")
    with pytest.raises(gdx.InvalidArgumentError, match="call bind"):
        t.connect("tcp://127.0.0.1:9")
    url = t.bind()
    for bad in ["no-url", "tcp://", "tcp://127.0.0.1:99999", "tcp://not-an-ip:80", "verbs://127.0.0.1:5", url]:
        start = time.monotonic()
        with pytest.raises(gdx.InvalidArgumentError):
            t.connect(bad)
        assert time.monotonic() - start < 0.5, bad
    assert not t.connected
    buf = np.zeros(64, dtype=np.uint8)
    mem = RdmaMemory(buf)
    assert t.write(mem, mem.remote_buffer(), False).get() == CommResult.commInvalidArgument  # not connected


def _never_connects(rank, world):
    silent = RdmaTransport()
    for peer in [silent.bind(), f"tcp://127.0.0.1:{free_port()}"]:
        t = RdmaTransport()
        t.bind()
        buf = np.zeros(4096, dtype=np.uint8)
        mem = RdmaMemory(buf)
        start = time.monotonic()
        assert t.connect(peer) == CommResult.commSuccess
        written, arrived = t.write(mem, mem.remote_buffer(), True), t.wait_for_write()
        assert written.get(timeout=3) == CommResult.commTimeout
        assert arrived.get(timeout=3) == CommResult.commTimeout
        took = time.monotonic() - start
        assert 0.4 <= took < 2.5, f"resolved after {took:.2f} s with GDX_TIMEOUT_MS=500"
        assert not t.connected


def test_a_peer_that_never_connects_fails_writes_and_waits_within_the_timeout():
    run_ranks(1, _never_connects, env={"GDX_TIMEOUT_MS": "500"})


def test_destroyed_memory_is_refused():
    a, b = _pair()
    src = _random(9, 4096)
    src_mem = RdmaMemory(src)
    remote = np.full(4096, POISON, dtype=np.uint8)
    peer_mem = RdmaMemory(remote)
    key = peer_mem.remote_key()
    del peer_mem  # before this side wrote there: refused, the connection lives on
    assert a.write(src_mem, RdmaRemoteBuffer(remote.ctypes.data, key), True).get() == CommResult.commInvalidArgument
    assert (remote == POISON).all() and a.connected and b.connected
