"""``python -m gdx.bench.p2p --role server|client``: the P2P endpoint's send/recv and read/write benchmark (seed
002's benchmark script). Its place is kept here; it needs gdx.p2p.Endpoint, which is not bound yet (gdx/p2p)."""

import sys


def main() -> int:
    print("gdx.bench.p2p: needs gdx.p2p.Endpoint, which this build does not have yet (the P2P endpoint is not bound)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
