"""python -m gdx.bench.ep: its options and its clean skip on a machine without GPUs (here); on GPUs (label gpu) a
short run whose lines and JSON are checked. python -m gdx.bench.p2p: a short run over loopback, its options."""

import json
import subprocess
import sys

import pytest

import gdx


def _bench(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)


def test_bench_ep_help_and_bad_options():
    out = _bench("gdx.bench.ep", "--help")
    assert out.returncode == 0 and "--tokens" in out.stdout and "all_to_all_single" in out.stdout
    out = _bench("gdx.bench.ep", "--tokens", "12,x")
    assert out.returncode == 2 and "not a comma-separated list of integers" in out.stderr
    out = _bench("gdx.bench.ep", "--ranks", "3")  # 256 experts over 3 ranks
    assert out.returncode == 2 and "is not a multiple of --ranks 3" in out.stderr


def _runnable():
    if not gdx._gdx.ep_available():
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_runnable(), reason="this machine can run the benchmark (checked by the GPU test)")
def test_bench_ep_skips_cleanly_without_gpus():
    out = _bench("gdx.bench.ep", "--tokens", "128")
    assert out.returncode == 77, out.stderr
    assert out.stderr.startswith("gdx.bench.ep: skipped: "), out.stderr


def test_bench_p2p_short_run_over_loopback(tmp_path):
    path = tmp_path / "p2p_python.json"
    out = _bench("gdx.bench.p2p", "--sizes", "1,64K,1M", "--iters", "5", "--json", str(path), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[config] device=cpu iters=5" in out.stdout and "connection: tcp" in out.stdout, out.stdout
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "p2p_python" and [r["bytes"] for r in doc["results"]] == [1, 65536, 1 << 20]
    for r in doc["results"]:
        assert min(r["sendrecv_latency_us"], r["sendrecv_GBps"], r["write_latency_us"], r["write_GBps"]) > 0, r


def test_bench_p2p_help_bad_options_and_gpu_skip():
    out = _bench("gdx.bench.p2p", "--help")
    assert out.returncode == 0 and "--role" in out.stdout and "write" in out.stdout
    out = _bench("gdx.bench.p2p", "--sizes", "4K,x")
    assert out.returncode == 2 and "not a comma-separated list of sizes" in out.stderr
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        out = _bench("gdx.bench.p2p", "--device", "gpu")
        assert out.returncode == 77 and out.stderr.startswith("gdx.bench.p2p: skipped: "), out.stderr


@pytest.mark.gpu
def test_bench_ep_short_run(tmp_path):
    if not _runnable():
        pytest.skip("needs torch with CUDA and a build of gdx with CUDA")
    path = tmp_path / "moe_python.json"
    out = _bench("gdx.bench.ep", "--ranks", "2", "--tokens", "128,1024", "--iters", "5", "--json", str(path),
                 timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert lines[0].startswith("[config] ranks=2")
    cases = [(d["tokens"], d["dtype"], d["op"]) for d in json.loads(path.read_text())["results"]]
    assert cases == [(n, dt, op) for n in (128, 1024) for dt, op in (("bf16", "dispatch"), ("bf16", "combine"),
                                                                       ("fp8", "dispatch"))]
    for line in lines[1:]:
        assert " GB/s (NVL), avg_t: " in line, line
    for d in json.loads(path.read_text())["results"]:
        assert d["us"] > 0 and d["host_us"] > 0 and d["GBps"] > 0 and d["bytes_per_rank"] > 0, d
