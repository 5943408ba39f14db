"""README.md's Python examples, run as written: the Context one on three ranks, the gdx.p2p one in one process;
the received bytes are then checked here."""

import pathlib
import re

import numpy as np

from conftest import run_ranks

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_example(marker: str = "gdx.Context()") -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if marker in b]
    assert len(blocks) == 1, f"README.md has {len(blocks)} python blocks with {marker!r}; this test runs exactly one"
    return blocks[0]


def _run_example(rank, world, code):
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    prev = (rank - 1) % world
    assert np.array_equal(scope["recv"], np.full(1 << 20, prev, dtype=np.uint8)), f"rank {rank}: recv differs"


def test_readme_example_runs():
    run_ranks(3, _run_example, readme_example())


def test_readme_p2p_example_runs():
    scope = {}
    exec(compile(readme_example("from gdx import p2p"), "README.md", "exec"), scope)
    send, recv, half = scope["send"], scope["recv"], scope["half"]
    assert np.array_equal(recv[:half], send[:half]), "the received half differs"
    assert np.array_equal(recv[half:], send[:half]), "the written half differs"
