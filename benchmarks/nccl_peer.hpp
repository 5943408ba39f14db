// The peer the GPU benchmarks measure beside gdx in the same run: NCCL through PyTorch, as a Python script whose
// stdout lines go to the benchmark's own reader. Bounded: a script that hangs (a stuck NCCL communicator, a rank that
// never joins) is killed after `boundSeconds`, and what it printed until then is kept.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace gdx::bench {

/// Writes `scriptText` to a temporary file, runs it as `python3 SCRIPT ARGS` (NCCL_NVLS_ENABLE=0) and hands its
/// output to `readLines(std::istream&)`; a failure or timeout of the script is reported on stderr, not thrown.
template <typename ReadLines>
void runNcclPeer(const std::string& name, const char* scriptText, const std::string& args, ReadLines&& readLines,
                 int boundSeconds = 900) {
  const std::string script = "/tmp/gdx_" + name + "_nccl_" + std::to_string(getpid()) + ".py";
  std::ofstream(script) << scriptText;
  const std::string cmd =
      "NCCL_NVLS_ENABLE=0 timeout --kill-after=10 " + std::to_string(boundSeconds) + " python3 " + script + " " + args;
  std::fprintf(stderr, "NCCL through PyTorch: %s\n", cmd.c_str());
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::string all;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) all += buf;
    const int prc = pclose(p);
    std::istringstream in(all);
    readLines(in);
    const int code = WIFEXITED(prc) ? WEXITSTATUS(prc) : prc;
    if (code == 124)
      std::fprintf(stderr, "NCCL script killed after %d s (results so far kept)\n", boundSeconds);
    else if (code != 0)
      std::fprintf(stderr, "NCCL script exited with %d (results so far kept)\n", code);
  }
  std::remove(script.c_str());
}

/// NCCL send/recv between GPUs 0 and 1 through PyTorch: `python3 SCRIPT PORT SIZE...` prints "nccl SIZE GB/s" for
/// each size (rank 0 sends to rank 1 back to back) and "nccl_latency SIZE US" (one way, half a ping-pong) for 8 B
/// and 4 KiB.
inline const char* const kNcclSendRecvScript = R"PY(
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, sizes, port):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    for n in sizes:
        iters = max(10, min(2000, (8 << 30) // n))
        t = buf[:n]
        for i in range(3):
            dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
        torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(iters):
            dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if rank == 1:
            print(f"nccl {n} {n * iters / dt / 1e9}", flush=True)
    # Latency peer of gdx's put-with-signal: a send/recv ping-pong, one way = half the round trip, timed on rank 0.
    for n in (8, 4096):
        t, iters = buf[:n], 1000
        for i in range(iters + 50):
            if i == 50:
                torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
                t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1); dist.recv(t, 1)
            else:
                dist.recv(t, 0); dist.send(t, 0)
        torch.cuda.synchronize()
        if rank == 0:
            print(f"nccl_latency {n} {(time.perf_counter() - t0) / iters / 2 * 1e6}", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    sizes = [int(x) for x in sys.argv[2:]]
    mp.spawn(run, args=(sizes, int(sys.argv[1])), nprocs=2)
)PY";

}  // namespace gdx::bench
