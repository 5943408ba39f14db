#!/usr/bin/env python3
"""Fails when a file of one layer includes a file of a higher layer (README.md, "Layout").

The layers, lowest first; a file may include files of its own layer and of lower ones, never of a higher one nor of
a sibling on the same level (device and rdma do not know each other):

  0 base     errors, logging, configuration, host buffers, window registry, command ring
  1 device   kernels and their host drivers (peer copy, copy queue)
  1 rdma     transports (tcp, verbs, loopback, their shared parts) and the bootstrap
  2 proxy    proxy threads and their placement
  3 runtime  Context, Window, Channel, the direct path, the relay
  4 ep       MoE dispatch/combine (normal and low-latency mode) on the public API
  4 p2p      point-to-point endpoints and the URL transport, over the transports of rdma
  5 python   the Python package's extension (python/src/): bindings of every layer below

A source file's layer is its top folder; a header under include/gdx/ gets its layer from HEADER_LAYERS below, so
that a new header must be placed in a layer before the check passes.
"""
import pathlib
import re
import sys

LEVEL = {"base": 0, "device": 1, "rdma": 1, "proxy": 2, "runtime": 3, "ep": 4, "p2p": 4, "python": 5}

HEADER_LAYERS = {
    # public
    "gdx.hpp": "runtime", "context.hpp": "runtime", "window.hpp": "runtime", "channel.hpp": "runtime",
    "channel_device.hpp": "runtime", "peer_copy.hpp": "device", "peer_copy_queue.hpp": "device",
    "error.hpp": "base", "status.hpp": "base", "config.hpp": "base", "device.hpp": "base", "types.hpp": "base",
    # internals
    "detail/atomic.hpp": "base", "detail/clock.hpp": "base", "detail/command.hpp": "base",
    "detail/cuda_check.hpp": "base", "detail/gpu.hpp": "base", "detail/host_buffer.hpp": "base",
    "detail/log.hpp": "base", "detail/ptx.hpp": "base", "detail/ring.hpp": "base", "detail/ring_device.hpp": "base",
    "detail/signal_imm.hpp": "base", "detail/window_registry.hpp": "base", "detail/put_commands.hpp": "base",
    "detail/copy_device.hpp": "device",
    "detail/transport.hpp": "rdma", "detail/bootstrap.hpp": "rdma",
    "detail/proxy.hpp": "proxy", "detail/placement.hpp": "proxy",
    "detail/direct_device.hpp": "runtime", "detail/context_link.hpp": "runtime",
    # the MoE layer
    "ep/buffer.hpp": "ep", "ep/low_latency.hpp": "ep",
    # point-to-point endpoints and the URL transport
    "p2p/endpoint.hpp": "p2p", "p2p/url_transport.hpp": "p2p", "p2p/rdma_transport.hpp": "p2p",
    "p2p/event_base.hpp": "p2p",
    "p2p/tcpx_session.hpp": "p2p",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]')
SOURCES = ("*.hpp", "*.cpp", "*.cu", "*.cuh")


def layer_of(path: str):
    """The layer of a repository-relative path, None for files outside the layered tree (system headers)."""
    if path.startswith("include/gdx/"):
        rel = path[len("include/gdx/"):]
        if rel not in HEADER_LAYERS:
            raise KeyError(rel)
        return HEADER_LAYERS[rel]
    top = path.split("/", 1)[0]
    return top if top in LEVEL else None


def allowed(src: str, dst: str) -> bool:
    return src == dst or LEVEL[dst] < LEVEL[src]


def main(root: pathlib.Path) -> int:
    problems = []
    files = [p for folder in list(LEVEL) + ["include/gdx"] for pattern in SOURCES
             for p in (root / folder).rglob(pattern)]
    for path in sorted(set(files)):
        rel = path.relative_to(root).as_posix()
        try:
            src = layer_of(rel)
        except KeyError:
            problems.append(f"{rel}: header has no layer in tests/check_layers.py HEADER_LAYERS")
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            target_path = "include/" + target if target.startswith("gdx/") else target
            try:
                dst = layer_of(target_path)
            except KeyError:
                problems.append(f"{rel}:{number}: includes {target}, which has no layer in HEADER_LAYERS")
                continue
            if dst is None and not target.startswith("gdx/") and (root / target).exists():
                problems.append(f"{rel}:{number}: includes {target}, outside the layered folders")
                continue
            if dst is not None and not allowed(src, dst):
                problems.append(f"{rel}:{number}: {src} (level {LEVEL[src]}) includes {target} of {dst} "
                                f"(level {LEVEL[dst]}): an arrow upwards or sideways")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layering")
        return 1
    print(f"check_layers: {len(files)} files, every include points down or within its layer")
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
