"""README.md's Python example, run as written on three ranks; the received bytes are then checked here."""

import pathlib
import re

import numpy as np

from conftest import run_ranks

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, f"README.md has {len(blocks)} python blocks; this test runs exactly one"
    return blocks[0]


def _run_example(rank, world, code):
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    prev = (rank - 1) % world
    assert np.array_equal(scope["recv"], np.full(1 << 20, prev, dtype=np.uint8)), f"rank {rank}: recv differs"


def test_readme_example_runs():
    run_ranks(3, _run_example, readme_example())
