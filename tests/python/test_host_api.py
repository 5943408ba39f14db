"""The host API between real processes over TCP, with numpy arrays: put, put_with_signal, signal, atomic_add, wait;
random data, poisoned receive buffers, every byte compared."""

import numpy as np

import gdx
from conftest import run_ranks

POISON = 0xEE


def _ring_exchange(rank, world, sizes):
    with gdx.Context() as ctx:
        assert (ctx.rank, ctx.world_size) == (rank, world)
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        total = sum(sizes)
        send = np.random.default_rng(1000 + rank).integers(0, 256, total, dtype=np.uint8)
        recv = np.full(total, POISON, dtype=np.uint8)
        ws = ctx.register_window(send, name="send")
        wr = ctx.register_window(recv, name="recv")
        ch = ctx.channel(nxt)
        # One put per size, at its own offset: windows and arrays (views inside the windows) both work.
        offset = 0
        for i, n in enumerate(sizes):
            if i % 2:
                ch.put_with_signal(wr, offset, ws, offset, n, signal=0, value=1)
            else:
                ch.put(recv[offset:offset + n], 0, send[offset:offset + n])
                ch.signal(0, 1)
            offset += n
        ctx.wait(0, len(sizes), timeout=60)
        ch.flush()
        expected = np.random.default_rng(1000 + prev).integers(0, 256, total, dtype=np.uint8)
        mismatch = np.flatnonzero(recv != expected)
        assert mismatch.size == 0, f"rank {rank}: {mismatch.size} bytes differ, first at {mismatch[:8]}"
        assert ctx.signal_value(0) == len(sizes)
        ctx.barrier()


def test_ring_exchange_two_ranks():
    run_ranks(2, _ring_exchange, [1, 7, 4096, 1 << 20, (3 << 20) + 5])


def test_ring_exchange_three_ranks():
    run_ranks(3, _ring_exchange, [13, 65536, 1 << 22])


def _signal_set_and_atomic_add(rank, world):
    with gdx.Context() as ctx:
        peer = 1 - rank
        counters = np.zeros(64, dtype=np.uint64)
        w = ctx.register_window(counters)
        rng = np.random.default_rng(7 + rank)
        adds = rng.integers(1, 1 << 40, size=(5, 64), dtype=np.uint64)
        ch = ctx.channel(peer)
        for row in adds:
            for i, v in enumerate(row):
                ch.atomic_add(w, 8 * i, int(v))
        ch.signal(3, 42, op="set")  # after every add of this channel is in place
        ctx.wait(3, 42, timeout=60)
        theirs = np.random.default_rng(7 + peer).integers(1, 1 << 40, size=(5, 64), dtype=np.uint64)
        assert np.array_equal(counters, theirs.sum(axis=0, dtype=np.uint64)), f"rank {rank}: sums differ"
        ch.flush()
        ctx.barrier()


def test_atomic_add_and_signal_set():
    run_ranks(2, _signal_set_and_atomic_add)


def _bytearray_windows(rank, world):
    with gdx.Context() as ctx:
        data = bytearray(np.random.default_rng(rank).integers(0, 256, 999, dtype=np.uint8).tobytes())
        inbox = bytearray([POISON]) * 999
        ws, wr = ctx.register_window(data), ctx.register_window(inbox)
        ch = ctx.channel(1 - rank)
        ch.put_with_signal(wr, 0, ws, signal=1)
        ctx.wait(1, 1, timeout=60)
        assert bytes(inbox) == np.random.default_rng(1 - rank).integers(0, 256, 999, dtype=np.uint8).tobytes()
        ch.flush()
        ctx.barrier()


def test_buffer_protocol_windows():
    run_ranks(2, _bytearray_windows)
