"""CPU torch tensors and torch.distributed: a Context made from a process group (gloo), its store carrying the
rendezvous; tensors as windows, every byte compared. Skipped where torch is not installed."""

import os

import pytest

import gdx
from conftest import free_port, run_ranks, torch_or_skip


def _from_process_group(rank, world, store_port):
    import torch
    import torch.distributed as dist
    # The GDX_* rendezvous variables run_ranks sets must not be what the Context uses: point them nowhere.
    os.environ["GDX_MASTER_PORT"] = "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{store_port}", rank=rank, world_size=world)
    try:
        for _ in range(2):  # two Contexts over one group get keys of their own
            with gdx.Context.from_process_group() as ctx:
                assert (ctx.rank, ctx.world_size) == (rank, world)
                g = torch.Generator().manual_seed(100 + rank)
                send = torch.randint(0, 256, (3, 1000), dtype=torch.uint8, generator=g).to(torch.int16)
                recv = torch.full((3, 1000), -1, dtype=torch.int16)
                ws, wr = ctx.register_window(send), ctx.register_window(recv, name="recv")
                ch = ctx.channel((rank + 1) % world)
                ch.put_with_signal(wr, 0, ws, 0, signal=2)
                ctx.wait(2, 1, timeout=60)
                ch.flush()
                prev = (rank - 1) % world
                g = torch.Generator().manual_seed(100 + prev)
                expected = torch.randint(0, 256, (3, 1000), dtype=torch.uint8, generator=g).to(torch.int16)
                assert torch.equal(recv, expected), f"rank {rank}: received tensor differs"
                ctx.barrier()
        # A subgroup: its ranks are the group's, not the job's.
        sub = dist.new_group([1, 2])
        if rank in (1, 2):
            with gdx.Context.from_process_group(sub) as ctx:
                assert (ctx.rank, ctx.world_size) == (rank - 1, 2)
                ctx.barrier()
        # Rank 0 hosts the TCPStore that carries the subgroup's rendezvous: it must not tear the group down (newer
        # torch closes the store's server at once) before the subgroup's ranks have met.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_context_from_a_gloo_process_group():
    torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    run_ranks(3, _from_process_group, free_port())


def _from_tcp_store(rank, world, store_port):
    import torch
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", store_port, world, rank == 0)
    with gdx.Context.from_store(store, rank, world, prefix="job") as ctx:
        x = torch.arange(256, dtype=torch.float32) * (rank + 1)
        y = torch.zeros(256, dtype=torch.float32)
        wx, wy = ctx.register_window(x), ctx.register_window(y)
        ch = ctx.channel(1 - rank)
        ch.put_with_signal(y, 0, x, signal=0)
        ctx.wait(0, 1, timeout=60)
        assert torch.equal(y, torch.arange(256, dtype=torch.float32) * (2 - rank))
        ch.flush()
        ctx.barrier()


def test_context_from_a_tcp_store():
    torch_or_skip()
    run_ranks(2, _from_tcp_store, free_port())
