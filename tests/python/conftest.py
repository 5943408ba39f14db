"""Shared helpers of the Python tests: real processes (multiprocessing, spawn), one per rank, each joining a gdx job
over TCP on loopback. Run from CTest (label py; the GPU ones also gpu) with PYTHONPATH=<build>/python."""

import multiprocessing
import os
import socket
import sys
import traceback

import pytest

RANK_TIMEOUT_S = 120


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch with CUDA and GPUs (skipped without)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(target, rank, world, port, env, args):
    os.environ.update({"GDX_RANK": str(rank), "GDX_WORLD_SIZE": str(world), "GDX_MASTER_ADDR": "127.0.0.1",
                       "GDX_MASTER_PORT": str(port), "GDX_JOB_SECRET": f"pytest-{port}"})
    os.environ.update(env)
    try:
        target(rank, world, *args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def run_ranks(world, target, *args, env=None, timeout=RANK_TIMEOUT_S):
    """Runs target(rank, world, *args) in `world` fresh processes; fails the test naming every rank that failed."""
    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(target, r, world, port, dict(env or {}), args))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    failed = []
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
            failed.append(f"rank {r} still running after {timeout} s")
        elif p.exitcode != 0:
            failed.append(f"rank {r} exited with {p.exitcode}")
    assert not failed, "; ".join(failed) + " (their stderr is above)"


def torch_or_skip():
    return pytest.importorskip("torch", reason="torch is not installed for this interpreter")


def pytest_sessionfinish(session, exitstatus):
    """With PYTEST_GDX_SKIPPED_RC set (CTest's GPU run), a session whose tests were all skipped exits with that code,
    so CTest reports Skipped rather than Passed."""
    code = os.environ.get("PYTEST_GDX_SKIPPED_RC")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not code or reporter is None or exitstatus != 0:
        return
    stats = reporter.stats
    if stats.get("skipped") and not stats.get("passed") and not stats.get("failed"):
        session.exitstatus = int(code)
