"""gdx.Context() leaves the environment alone once CUDA was used before it (PyTorch's torch.cuda.set_device, say):
CUDA_DEVICE_MAX_CONNECTIONS is set only while the CUDA driver is not loaded yet, when it can still take effect and no
driver thread may be reading the environment that setenv() reallocates. On this machine the driver's stub library
stands in for "CUDA was used first"; on GPUs (label gpu) the reported case itself: torch first, then gdx.Context()
from the environment, world size 1, in a fresh process."""

import os
import pathlib
import subprocess
import sys

import pytest

import gdx
from conftest import free_port

STUB = pathlib.Path("/usr/local/cuda/lib64/stubs/libcuda.so")

PROGRAM = """
import ctypes, sys
if {load_driver}:
    ctypes.CDLL({driver!r}, mode=ctypes.RTLD_GLOBAL)  # CUDA's driver, loaded before gdx as a framework would
{before}
import gdx
with gdx.Context() as ctx:
    assert (ctx.rank, ctx.world_size) == (0, 1)
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
value = libc.getenv(b"CUDA_DEVICE_MAX_CONNECTIONS")
print("CUDA_DEVICE_MAX_CONNECTIONS=" + (value.decode() if value is not None else "unset"))
"""


def _run(load_driver: bool, driver: str = "", before: str = "", transport: str = "loopback", timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(GDX_RANK="0", GDX_WORLD_SIZE="1", GDX_MASTER_ADDR="127.0.0.1", GDX_MASTER_PORT=str(free_port()),
               GDX_TRANSPORT=transport)
    code = PROGRAM.format(load_driver=load_driver, driver=driver, before=before)
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _cuda_build():
    return gdx._gdx.ep_available()  # the MoE layer is built exactly when CUDA is


@pytest.mark.skipif(not _cuda_build(), reason="gdx was built without CUDA: it never sets CUDA variables")
def test_context_sets_max_connections_when_cuda_is_unused():
    out = _run(load_driver=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(not _cuda_build() or not STUB.exists(), reason="needs a CUDA build and CUDA's driver stub")
def test_context_leaves_the_environment_alone_once_the_driver_is_loaded():
    out = _run(load_driver=True, driver=str(STUB))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CUDA_DEVICE_MAX_CONNECTIONS=unset" in out.stdout, out.stdout + out.stderr


def _cuda_torch_or_skip():
    torch = pytest.importorskip("torch", reason="torch is not installed for this interpreter")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")


@pytest.mark.gpu
@pytest.mark.parametrize("transport", ["tcp", "loopback"])
def test_context_from_env_after_torch_set_device(transport):
    """The reported crash: torch.cuda.set_device(0) before gdx.Context() (no arguments, from the environment)."""
    _cuda_torch_or_skip()
    out = _run(load_driver=False, before="import torch\ntorch.cuda.set_device(0)", transport=transport)
    assert out.returncode == 0, f"exit code {out.returncode}:\n{out.stdout}{out.stderr}"
    assert "CUDA_DEVICE_MAX_CONNECTIONS=unset" in out.stdout, out.stdout + out.stderr
