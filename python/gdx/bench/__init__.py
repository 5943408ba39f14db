"""Benchmarks of the Python package, run as modules:

- ``python -m gdx.bench.ep``: gdx.ep.Buffer dispatch / combine (normal mode, NVLink) between the GPUs of this host,
  lines like DeepEP's intranode test (time and "GB/s (NVL)" per call) beside torch.distributed.all_to_all_single
  carrying the same bytes in the same run; the figures of benchmarks/benchmark_moe (C++) through the Python layer.
- ``python -m gdx.bench.p2p --role server|client``: the P2P endpoint's benchmark, once gdx.p2p is bound.
"""
