"""``python -m gdx.bench.p2p``: gdx.p2p.Endpoint through the Python layer between two processes: send/recv and
one-sided write, latency and bandwidth per message size.

Without --role it runs both sides on this host (the server is a second process it starts; TCP over loopback unless
GDX_TRANSPORT says otherwise). Between hosts, as the seed's benchmark script: ``--role server`` on one, ``--role
client --remote-ip ADDR`` on the other, with the same --sizes and --iters. Per size: send/recv latency is half of a
ping-pong's round trip; send/recv bandwidth is `--iters` sends posted back to back, timed until the receiver says
they all arrived; write latency is one blocking write (it returns once the data is in place at the peer); write
bandwidth is `--iters` write_async in flight, timed until all completed. Host memory (numpy), or CUDA tensors with
--device gpu (torch; skipped with exit code 77 where there is none). A table, and JSON with --json FILE.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

SKIPPED = 77


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m gdx.bench.p2p", description=__doc__.split("\n\n")[0].strip("`"),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["server", "client"], help="one side only (default: both, on this host)")
    p.add_argument("--remote-ip", default="127.0.0.1", help="the server's address (client)")
    p.add_argument("--port", type=int, default=0, help="the server's port (default: GDX_P2P_PORT + its GPU)")
    p.add_argument("--sizes", default="256,4K,64K,1M,16M", help="message sizes, comma-separated (K, M, G suffixes)")
    p.add_argument("--iters", type=int, default=50, help="messages per size and measurement")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="host arrays or CUDA tensors")
    p.add_argument("--local-gpu-idx", type=int, default=0, help="the GPU of this side (--device gpu)")
    p.add_argument("--num-cpus", type=int, default=2, help="progress threads of the endpoint")
    p.add_argument("--json", metavar="FILE", help="where the results go (client; default: none)")
    a = p.parse_args(argv)
    try:
        a.sizes = [_size(s) for s in a.sizes.split(",") if s.strip()]
    except (ValueError, IndexError):
        p.error(f"--sizes {a.sizes!r}: not a comma-separated list of sizes")
    if not a.sizes or min(a.sizes) <= 0:
        p.error("--sizes: needs at least one positive size")
    if a.iters <= 0:
        p.error("--iters must be positive")
    return a


def _why_not_runnable(args):
    if args.device == "cpu":
        return None
    try:
        import torch
    except ImportError:
        return "--device gpu needs torch, which is not installed for this interpreter"
    if not torch.cuda.is_available():
        return "--device gpu: no CUDA GPU visible to torch"
    return None


def _buffer(args, nbytes: int, fill: int):
    if args.device == "gpu":
        import torch
        return torch.full((nbytes,), fill, dtype=torch.uint8, device=f"cuda:{args.local_gpu_idx}")
    import numpy as np
    return np.full(nbytes, fill, dtype=np.uint8)


def _sync(args):
    if args.device == "gpu":
        import torch
        torch.cuda.synchronize()


class _Side:
    """One side's endpoint, connection and buffers; `data` is sent and written, `inbox` receives and is written."""

    def __init__(self, args, server: bool):
        from .. import p2p
        self.args = args
        gpu = args.local_gpu_idx if args.device == "gpu" else -1
        port = args.port if args.port else None
        self.ep = p2p.Endpoint(gpu, args.num_cpus, port=port if server else 0)
        if server:
            print(f"gdx.bench.p2p server: listening on {self.ep.ip}:{self.ep.port} (GPU {gpu})", flush=True)
            _, ip, _, self.conn = self.ep.accept()
        else:
            _, self.conn = self.ep.connect(args.remote_ip, gpu, port)
        biggest = max(args.sizes)
        self.data, self.inbox = _buffer(args, biggest, 0x5A), _buffer(args, biggest, 0)
        self.ack, self.ack_in = _buffer(args, 64, 1), _buffer(args, 64, 0)
        self.mr = {name: self.ep.reg(getattr(self, name))[1] for name in ("data", "inbox", "ack", "ack_in")}
        _sync(args)

    def send(self, name: str, n: int) -> None:
        self.ep.send(self.conn, self.mr[name], getattr(self, name), n)

    def recv(self, name: str, n: int) -> None:
        self.ep.recv(self.conn, self.mr[name], getattr(self, name), n)


def _serve(args) -> int:
    s = _Side(args, server=True)
    # The inbox is advertised once; the client writes into it.
    descriptor = s.ep.advertise(s.conn, s.mr["inbox"], s.inbox)
    s.ack[:len(descriptor)] = _as_array(args, descriptor)
    _sync(args)
    s.send("ack", len(descriptor))
    for n in args.sizes:
        for _ in range(args.iters):  # ping-pong
            s.recv("inbox", n)
            s.send("data", n)
        ids = [s.ep.recv_async(s.conn, s.mr["inbox"], s.inbox, n)[1] for _ in range(args.iters)]
        for t in ids:
            s.ep.wait(t)
        s.send("ack", 1)  # all arrived
        s.recv("ack_in", 1)  # the client finished writing this size
    s.ep.close()
    return 0


def _as_array(args, raw: bytes):
    if args.device == "gpu":
        import torch
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(f"cuda:{args.local_gpu_idx}")
    import numpy as np
    return np.frombuffer(raw, dtype=np.uint8)


def _measure(args) -> list:
    from .. import p2p
    s = _Side(args, server=False)
    s.recv("ack_in", p2p.DESCRIPTOR_BYTES)
    _sync(args)
    descriptor = bytes(_host_bytes(s.ack_in[:p2p.DESCRIPTOR_BYTES]))
    results = []
    for n in args.sizes:
        t0 = time.perf_counter()
        for _ in range(args.iters):
            s.send("data", n)
            s.recv("inbox", n)
        lat = (time.perf_counter() - t0) / (2 * args.iters)
        t0 = time.perf_counter()
        ids = [s.ep.send_async(s.conn, s.mr["data"], s.data, n)[1] for _ in range(args.iters)]
        for t in ids:
            s.ep.wait(t)
        s.recv("ack_in", 1)
        send_bw = n * args.iters / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(args.iters):
            s.ep.write(s.conn, s.mr["data"], s.data, n, descriptor)
        write_lat = (time.perf_counter() - t0) / args.iters
        t0 = time.perf_counter()
        ids = [s.ep.write_async(s.conn, s.mr["data"], s.data, n, descriptor)[1] for _ in range(args.iters)]
        for t in ids:
            s.ep.wait(t)
        write_bw = n * args.iters / (time.perf_counter() - t0)
        s.send("ack", 1)
        results.append({"bytes": n, "sendrecv_latency_us": lat * 1e6, "sendrecv_GBps": send_bw / 1e9,
                        "write_latency_us": write_lat * 1e6, "write_GBps": write_bw / 1e9})
        r = results[-1]
        print(f"{_human(n):>8}  {r['sendrecv_latency_us']:12.1f}  {r['sendrecv_GBps']:10.3f}  "
              f"{r['write_latency_us']:12.1f}  {r['write_GBps']:10.3f}", flush=True)
    transport = s.ep.connection_transport(s.conn)
    s.ep.close()
    return results, transport


def _host_bytes(a):
    return a.cpu().numpy().tobytes() if hasattr(a, "cpu") else a.tobytes()


def _human(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _client(args, header: str) -> int:
    print(header)
    print(f"{'size':>8}  {'sendrecv_us':>12}  {'send_GB/s':>10}  {'write_us':>12}  {'write_GB/s':>10}", flush=True)
    results, transport = _measure(args)
    print(f"connection: {transport}")
    if args.json:
        from .. import __version__
        doc = {"benchmark": "p2p_python", "version": __version__, "device": args.device, "iters": args.iters,
               "transport": transport, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
               "results": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    why = _why_not_runnable(args)
    if why:
        print(f"gdx.bench.p2p: skipped: {why}", file=sys.stderr)
        return SKIPPED
    if args.role == "server":
        return _serve(args)
    header = f"[config] device={args.device} iters={args.iters} num_cpus={args.num_cpus}"
    if args.role == "client":
        return _client(args, header)
    # Both sides here: the server in a second process, on a free port.
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        args.port = sock.getsockname()[1]
    argv = sys.argv[1:] if argv is None else list(argv)
    server = subprocess.Popen([sys.executable, "-m", "gdx.bench.p2p", *argv, "--role", "server", "--port",
                               str(args.port), "--json", os.devnull], stdout=subprocess.DEVNULL)
    try:
        rc = _client(args, header + " (both sides on this host)")
    finally:
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return rc or server.returncode


if __name__ == "__main__":
    sys.exit(main())
