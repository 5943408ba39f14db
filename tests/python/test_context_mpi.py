"""gdx.Context.from_mpi: the rendezvous carried by an mpi4py communicator's broadcasts. The communicator here is a
stand-in with mpi4py's calls (Get_rank, Get_size, bcast) over queues between real processes, so that the test runs
where MPI is not installed; every rank then exchanges real bytes through the Context."""

import multiprocessing

import numpy as np

import gdx
from conftest import run_ranks


class QueueComm:
    """mpi4py's Get_rank / Get_size / bcast(obj, root=0) between the processes of run_ranks."""

    def __init__(self, rank: int, queues):
        self.rank, self.queues = rank, queues

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's name)
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return len(self.queues)

    def bcast(self, obj, root: int = 0):
        assert root == 0
        if self.rank == 0:
            for q in self.queues[1:]:
                q.put(obj)
            return obj
        return self.queues[self.rank].get(timeout=60)


def _from_mpi(rank, world, queues):
    comm = QueueComm(rank, queues)
    for round_ in range(2):  # two Contexts over one communicator meet each other, not the first one's leftovers
        with gdx.Context.from_mpi(comm) as ctx:
            assert (ctx.rank, ctx.world_size) == (rank, world)
            send = np.random.default_rng(10 * round_ + rank).integers(0, 256, 4096, dtype=np.uint8)
            recv = np.full(4096, 7, dtype=np.uint8)
            ctx.register_window(send)
            wr = ctx.register_window(recv)
            ch = ctx.channel((rank + 1) % world)
            ch.put_with_signal(wr, 0, send, 0, signal=1)
            ctx.wait(1, 1, timeout=60)
            ch.flush()
            prev = (rank - 1) % world
            expected = np.random.default_rng(10 * round_ + prev).integers(0, 256, 4096, dtype=np.uint8)
            assert np.array_equal(recv, expected), f"rank {rank}: received bytes differ"
            ctx.barrier()


def test_context_from_an_mpi_communicator():
    queues = [multiprocessing.get_context("spawn").Queue() for _ in range(3)]
    run_ranks(3, _from_mpi, queues)
