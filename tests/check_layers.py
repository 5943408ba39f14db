#!/usr/bin/env python3
"""Fails when an include line breaks the layering README.md states ("Layout").

include/gdx/ is the API: its headers include only other headers of include/gdx (and system headers), never a file of
the library's folders, so that an installed gdx is complete and the internals can change without breaking users.

The library's folders are layers, lowest first; a file may include files of its own folder, of lower levels and the
API, never of a higher level nor of a sibling on the same level:

  0 base       errors, logging, configuration, host buffers, window registry, command ring, GPU selection
  1 sockets    TCP sockets (connect, accept, bounded reads and writes)
  1 device     kernels and their host drivers (peer copy, copy queue)
  2 bootstrap  the rendezvous: rank, world size, tagged collectives over TCP
  2 transport  transports behind gdx::Transport (tcp, verbs, loopback, what they share)
  3 proxy      proxy threads and their placement
  4 runtime    Context (its state behind the API), Window, Channel, the direct path, the relay
  5 ep         MoE dispatch/combine on the API: includes only gdx/*, base/ and its own files
  5 p2p        point-to-point endpoints and the URL transport: never runtime/ nor proxy/
  6 python     the Python package's extension (python/src/): bindings of every layer below
"""
import pathlib
import re
import sys

LEVEL = {"base": 0, "sockets": 1, "device": 1, "bootstrap": 2, "transport": 2, "proxy": 3, "runtime": 4, "ep": 5,
         "p2p": 5, "python": 6}
# Folders a layer may include beyond the API and its own (stricter than the levels): ep is written on the API alone.
ONLY = {"ep": {"base"}}

INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]')
SOURCES = ("*.hpp", "*.cpp", "*.cu", "*.cuh")


def folder_of(path: str):
    """The layer of a repository-relative path: "api" for include/gdx, None outside the layered tree."""
    if path.startswith("include/gdx/"):
        return "api"
    top = path.split("/", 1)[0]
    return top if top in LEVEL else None


def problem(src: str, target: str, dst):
    if dst is None or dst == src:
        return None
    if src == "api":
        return "a header of the API includes a file of the library's folders (not installed)" if dst != "api" else None
    if dst == "api":
        return None
    if src in ONLY and dst not in ONLY[src]:
        return f"{src} includes only gdx/* and {', '.join(sorted(ONLY[src]))}/"
    if LEVEL[dst] >= LEVEL[src]:
        return f"{src} (level {LEVEL[src]}) includes {dst} (level {LEVEL[dst]}): an arrow upwards or sideways"
    return None


def main(root: pathlib.Path) -> int:
    problems = []
    files = [p for folder in list(LEVEL) + ["include/gdx"] for pattern in SOURCES
             for p in (root / folder).rglob(pattern)]
    for path in sorted(set(files)):
        rel = path.relative_to(root).as_posix()
        src = folder_of(rel)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if target.startswith("gdx/"):
                if not (root / "include" / target).exists():
                    problems.append(f"{rel}:{number}: includes {target}, which is not a header of include/gdx")
                continue
            dst = folder_of(target)
            if dst is None and (root / target).exists():
                problems.append(f"{rel}:{number}: includes {target}, outside the layered folders")
                continue
            why = problem(src, target, dst)
            if why:
                problems.append(f"{rel}:{number}: includes {target}: {why}")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layering")
        return 1
    print(f"check_layers: {len(files)} files, every include points down, within its layer or into the API")
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
