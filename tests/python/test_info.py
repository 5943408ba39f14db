"""python -m gdx.info runs and names the version, the transports and the MoE layer; gdx imports without torch."""

import subprocess
import sys

import gdx


def test_info_prints_what_this_build_offers():
    out = subprocess.run([sys.executable, "-m", "gdx.info"], capture_output=True, text=True, timeout=120, check=True)
    assert f"gdx {gdx.__version__}" in out.stdout
    for line in ("transports: tcp, loopback", "MoE layer (gdx.ep):", "GPUs:", "RDMA devices:", "NUMA nodes:"):
        assert line in out.stdout, out.stdout


def test_importing_gdx_does_not_import_torch():
    code = "import sys, gdx, gdx.ep, gdx.p2p; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
