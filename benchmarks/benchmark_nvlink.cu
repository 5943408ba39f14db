// benchmark_nvlink: two GPUs of one host, one process each (self-launched), in the same run:
//   * device put over NVLink on gdx's direct path (putBlock from many blocks, no proxy),
//   * the batched peer-copy kernel (gdx::peerCopy),
//   * cudaMemcpyPeerAsync (the copy engines),
//   * NCCL send/recv through PyTorch (torch.distributed, 2 processes, NCCL_NVLS_ENABLE=0),
//   * gdx::PeerCopyQueue (transfers submitted back to back from the host) by size and by copy blocks, beside the
//     one-shot peerCopy and cudaMemcpyPeerAsync of the same run, and its 4 KiB forward latency from the host,
// for 4 KiB .. 1 GiB, and the put-with-signal latency between the two GPUs (ping-pong, half the round trip) in the
// thread, warp and block forms beside a signal alone and NCCL's send/recv ping-pong. Table on stdout, JSON with
// --json PATH, plots of gdx against both peers with --plot.
//   benchmark_nvlink [--json PATH] [--plot DIR] [--max-bytes N] [--no-nccl]   (--help says more)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/cuda_check.hpp"
#include "benchmarks/cli.hpp"
#include "benchmarks/gpu_timing.cuh"
#include "benchmarks/nccl_peer.hpp"
#include "benchmarks/nvlink_latency.cuh"
#include "benchmarks/nvlink_report.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/peer_copy.hpp"
#include "gdx/peer_copy_queue.hpp"

namespace gdx::bench {
namespace {

constexpr int kThreads = 512;
// peerCopy's hybrid mode is measured with descriptors from this size on given to the copy engines.
constexpr uint64_t kCopyEngineFrom = uint64_t{16} << 20;

// One put of `bytes`, cut into chunks that the blocks take grid-stride, each with the block form of put.
__global__ void __launch_bounds__(kThreads, 2) putKernel(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin,
                                                         uint64_t bytes, uint64_t chunk, uint32_t* status) {
  Status s = Status::kOk;
  for (uint64_t off = blockIdx.x * chunk; off < bytes; off += uint64_t(gridDim.x) * chunk) {
    const uint64_t n = bytes - off < chunk ? bytes - off : chunk;
    Status r = ch.putBlock(dstWin, off, srcWin, off, n);
    if (r != Status::kOk) s = r;
  }
  if (s != Status::kOk && threadIdx.x == 0) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// `iters` puts of `bytes` from one launch (the device-initiated case: no launch per put). Each round ends with
// a grid barrier, so round i+1 starts only once every block finished its part of put i. The grid must be
// co-resident (the host caps it by the occupancy).
__global__ void __launch_bounds__(kThreads, 2)
    putLoopKernel(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint64_t bytes, uint64_t chunk, int iters,
                  unsigned* barrier, uint32_t* status) {
  Status s = Status::kOk;
  for (int it = 0; it < iters; ++it) {
    for (uint64_t off = blockIdx.x * chunk; off < bytes; off += uint64_t(gridDim.x) * chunk) {
      const uint64_t n = bytes - off < chunk ? bytes - off : chunk;
      Status r = ch.putBlock(dstWin, off, srcWin, off, n);
      if (r != Status::kOk) s = r;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicAdd(barrier, 1u);
      const unsigned target = (it + 1) * gridDim.x;
      while (atomicLoad(barrier, kAcquire) < target) {
      }
    }
    __syncthreads();
  }
  if (s != Status::kOk && threadIdx.x == 0) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

int itersFor(uint64_t bytes) {
  return static_cast<int>(std::clamp<uint64_t>((8ull << 30) / bytes, 10, 2000));
}

template <typename F>
double timeGBps(uint64_t bytes, F&& launch) {
  return eventGBps(bytes, itersFor(bytes), launch);
}

// One rank. Rank 0 measures; rank 1 takes part in the latency ping-pong. Results as "kind bytes value" lines.
int rankMain(uint64_t maxBytes, const std::string& resultsPath) {
  if (!envFirstSet({"GDX_CUDA_DEVICE"}))
    setenv("GDX_CUDA_DEVICE", std::to_string(envInt("GDX_LOCAL_RANK", 0)).c_str(), 1);
  Context ctx;
  const int rank = ctx.rank(), peer = 1 - rank;
  if (ctx.worldSize() != 2) throw Error(ErrorCode::kInvalidArgument, "benchmark_nvlink needs exactly 2 ranks");
  const bool direct = ctx.isDirect(peer);
  void *src = nullptr, *dst = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&src, maxBytes));
  GDX_CUDA_CHECK(cudaMalloc(&dst, maxBytes));
  GDX_CUDA_CHECK(cudaMemset(src, rank + 1, maxBytes));
  GDX_CUDA_CHECK(cudaMemset(dst, 0, maxBytes));
  GDX_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t* status = nullptr;
  uint64_t* elapsed = nullptr;
  GDX_CUDA_CHECK(cudaHostAlloc(&status, 64, cudaHostAllocMapped));
  GDX_CUDA_CHECK(cudaHostAlloc(&elapsed, 64, cudaHostAllocMapped));
  *status = 0;
  std::ostringstream out;
  out << "direct " << (direct ? 1 : 0) << "\n";
  int sms = 0;
  GDX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.gpu().device));
  cudaDeviceProp prop{};
  GDX_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.gpu().device));
  {
    Window s = ctx.registerWindow(src, maxBytes, MemoryKind::kCuda);
    Window d = ctx.registerWindow(dst, maxBytes, MemoryKind::kCuda);
    ChannelDeviceHandle ch = ctx.deviceChannel(peer);
    ctx.barrier();
    if (rank == 0) {
      out << "gpu " << prop.name << "\n";
      // The peer-copy kernel and the copy engines write into GPU 1's memory from this process.
      void* peerDst = nullptr;
      GDX_CUDA_CHECK(cudaSetDevice(1));
      GDX_CUDA_CHECK(cudaMalloc(&peerDst, maxBytes));
      GDX_CUDA_CHECK(cudaSetDevice(ctx.gpu().device));
      if (!enablePeerAccess(1)) throw Error(ErrorCode::kInvalidArgument, "GPU 0 cannot access GPU 1");
      // Pull: the peer-copy kernel running on GPU 1, reading GPU 0's memory over NVLink.
      GDX_CUDA_CHECK(cudaSetDevice(1));
      if (!enablePeerAccess(ctx.gpu().device)) throw Error(ErrorCode::kInvalidArgument, "GPU 1 cannot access GPU 0");
      GDX_CUDA_CHECK(cudaSetDevice(ctx.gpu().device));
      auto pullGBps = [&](uint64_t bytes, const PeerCopyOptions& o) {
        GDX_CUDA_CHECK(cudaSetDevice(1));
        PeerCopyDesc desc{src, peerDst, bytes};
        double r = timeGBps(bytes, [&] { GDX_CUDA_CHECK(peerCopy(&desc, 1, nullptr, o)); });
        GDX_CUDA_CHECK(cudaSetDevice(ctx.gpu().device));
        return r;
      };
      // PeerCopyQueue: `iters` transfers submitted back to back, timed on the host until the last completed.
      auto queueGBps = [&](uint64_t bytes, unsigned blocks) {
        PeerCopyQueue::Options qo = PeerCopyQueue::Options::fromEnv();
        qo.blocks = blocks;
        PeerCopyQueue q(ctx.gpu().device, qo);
        const int iters = itersFor(bytes);
        for (int i = 0; i < 3; ++i) q.submit(src, peerDst, bytes);
        q.waitCompleted(3);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) q.submit(src, peerDst, bytes);
        q.waitCompleted(3 + iters);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return double(bytes) * iters / s / 1e9;
      };
      unsigned* barrier = nullptr;
      GDX_CUDA_CHECK(cudaMalloc(&barrier, 4));
      int occ = 0;
      GDX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, putLoopKernel, kThreads, 0));
      // The grid and chunk of a transfer, as peerCopy chooses them (PeerCopyOptions).
      auto shape = [&](uint64_t bytes, const PeerCopyOptions& o, uint64_t* grid, uint64_t* chunk) {
        const uint64_t maxBlocks = uint64_t(sms) * o.blocksPerSm;
        *chunk = std::min<uint64_t>(std::max<uint64_t>(bytes / maxBlocks, 8192), o.maxChunkBytes) & ~uint64_t{15};
        *grid = std::min<uint64_t>((bytes + *chunk - 1) / *chunk, maxBlocks);
      };
      auto putGBps = [&](uint64_t bytes, const PeerCopyOptions& o) {
        uint64_t grid, chunk;
        shape(bytes, o, &grid, &chunk);
        return timeGBps(bytes,
                        [&] { putKernel<<<unsigned(grid), kThreads>>>(ch, d.id(), s.id(), bytes, chunk, status); });
      };
      auto putLoopGBps = [&](uint64_t bytes, const PeerCopyOptions& o) {
        uint64_t grid, chunk;
        shape(bytes, o, &grid, &chunk);
        grid = std::min<uint64_t>(grid, uint64_t(sms) * occ);
        const int iters = itersFor(bytes);
        GDX_CUDA_CHECK(cudaMemset(barrier, 0, 4));
        putLoopKernel<<<unsigned(grid), kThreads>>>(ch, d.id(), s.id(), bytes, chunk, 3, barrier, status);
        GDX_CUDA_CHECK(cudaMemset(barrier, 0, 4));
        const float ms = eventMs([&] {
          putLoopKernel<<<unsigned(grid), kThreads>>>(ch, d.id(), s.id(), bytes, chunk, iters, barrier, status);
        });
        return gbps(bytes, iters, ms);
      };
      const PeerCopyOptions defaults;
      for (uint64_t bytes : sizesUpTo(maxBytes)) {
        double put = direct ? putGBps(bytes, defaults) : -1.0;  // through the proxy this would measure TCP
        double loop = direct ? putLoopGBps(bytes, defaults) : -1.0;
        PeerCopyDesc desc{src, peerDst, bytes};
        PeerCopyOptions kernelOnly;
        kernelOnly.copyEngineFrom = 0;
        double pc = timeGBps(bytes, [&] { GDX_CUDA_CHECK(peerCopy(&desc, 1, nullptr, kernelOnly)); });
        double mc = timeGBps(
            bytes, [&] { GDX_CUDA_CHECK(cudaMemcpyPeerAsync(peerDst, 1, src, ctx.gpu().device, bytes, nullptr)); });
        double pull = pullGBps(bytes, kernelOnly);
        PeerCopyOptions bulkOpt = kernelOnly;
        bulkOpt.bulk = true;
        double bulk = timeGBps(bytes, [&] { GDX_CUDA_CHECK(peerCopy(&desc, 1, nullptr, bulkOpt)); });
        PeerCopyOptions hybridOpt;
        hybridOpt.copyEngineFrom = kCopyEngineFrom;
        double hybrid = timeGBps(bytes, [&] { GDX_CUDA_CHECK(peerCopy(&desc, 1, nullptr, hybridOpt)); });
        double queue = queueGBps(bytes, PeerCopyQueue::Options::fromEnv().blocks);
        out << "hybrid " << bytes << " " << hybrid << "\nqueue " << bytes << " " << queue << "\n";
        out << "pull " << bytes << " " << pull << "\nbulk " << bytes << " " << bulk << "\n";
        out << "put " << bytes << " " << put << "\nputloop " << bytes << " " << loop << "\npeercopy " << bytes << " "
            << pc << "\nmemcpy " << bytes << " " << mc << "\n";
        std::fprintf(stderr,
                     "  %10llu B: put %.1f  put in-kernel loop %.1f  peerCopy %.1f (pull %.1f, bulk %.1f, copy engines "
                     "from %llu MiB %.1f)  PeerCopyQueue %.1f  cudaMemcpyPeerAsync %.1f GB/s\n",
                     (unsigned long long)bytes, put, loop, pc, pull, bulk, (unsigned long long)(kCopyEngineFrom >> 20),
                     hybrid, queue, mc);
      }
      // How many SMs the copy needs: peerCopy with its grid capped, and the persistent PeerCopyQueue with that
      // many copy blocks (transfers submitted back to back from the host, timed until the last one completed),
      // beside cudaMemcpyPeerAsync of the same size measured above.
      for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{1} << 30}) {
        if (bytes > maxBytes) continue;
        for (unsigned blocks : {16u, 32u, 66u, 132u}) {
          PeerCopyOptions o;
          o.copyEngineFrom = 0;
          o.maxBlocks = blocks;
          PeerCopyDesc desc{src, peerDst, bytes};
          double pc = timeGBps(bytes, [&] { GDX_CUDA_CHECK(peerCopy(&desc, 1, nullptr, o)); });
          double q = queueGBps(bytes, blocks);
          out << "grid " << bytes << " " << blocks << " " << pc << " " << q << "\n";
          std::fprintf(stderr, "  grid %10llu B: %u blocks: peerCopy %.1f  PeerCopyQueue %.1f GB/s\n",
                       (unsigned long long)bytes, blocks, pc, q);
        }
      }
      // One 4 KiB transfer at a time through a PeerCopyQueue on this GPU into GPU 1, timed on the host.
      const ForwardLatency fl = queueForwardLatency(ctx.gpu().device, 1, src, peerDst);
      out << "qlat raw " << fl.rawRoundTripUs << "\nqlat signal " << fl.signalAckUs << "\nqlat completion "
          << fl.completionUs << "\n";
      std::fprintf(stderr,
                   "  PeerCopyQueue 4 KiB forward: submit -> signal on GPU 1 -> ack %.2f us, submit -> "
                   "completion %.2f us; raw host -> GPU 1 -> host %.2f us\n",
                   fl.signalAckUs, fl.completionUs, fl.rawRoundTripUs);
      cudaFree(barrier);
      if (*status)
        throw Error(ErrorCode::kInvalidArgument,
                    std::string("put failed: ") + statusName(static_cast<Status>(*status)));
      GDX_CUDA_CHECK(cudaSetDevice(1));
      cudaFree(peerDst);
      GDX_CUDA_CHECK(cudaSetDevice(ctx.gpu().device));
    }
    ctx.barrier();
    // Latency: a signal alone, then put with signal in each form at 8 B, 4 KiB and 64 KiB, with window ids and
    // with the windows bound once; separate signal ids per case (no re-arming needed).
    struct LatencyCase {
      Form form;
      uint64_t bytes;
      int iters;
    };
    const LatencyCase cases[] = {
        {Form::kSignal, 0, 10000},        {Form::kThread, 8, 10000},         {Form::kWarp, 8, 10000},
        {Form::kBlock, 8, 10000},         {Form::kThread, 4096, 5000},       {Form::kWarp, 4096, 10000},
        {Form::kBlock, 4096, 10000},      {Form::kThread, 65536, 1000},      {Form::kWarp, 65536, 5000},
        {Form::kBlock, 65536, 5000},      {Form::kThreadBound, 8, 10000},    {Form::kWarpBound, 8, 10000},
        {Form::kBlockBound, 8, 10000},    {Form::kThreadBound, 4096, 5000},  {Form::kWarpBound, 4096, 10000},
        {Form::kBlockBound, 4096, 10000}, {Form::kThreadBound, 65536, 1000}, {Form::kWarpBound, 65536, 5000},
        {Form::kBlockBound, 65536, 5000}};
    auto report = [&](const char* what, double oneWayUs) {
      if (*status)
        throw Error(ErrorCode::kInvalidArgument,
                    std::string("ping-pong failed: ") + statusName(static_cast<Status>(*status)) + " (" + what + ")");
      if (rank == 0) std::fprintf(stderr, "  %s: one way %.2f us\n", what, oneWayUs);
    };
    uint32_t id = 10;
    for (const LatencyCase& c : cases) {
      ctx.barrier();
      launchPingPong(c.form, ch, d.id(), s.id(), c.bytes, c.iters, 100, rank == 0, id, id + 1, elapsed, status);
      id += 2;
      GDX_CUDA_CHECK(cudaDeviceSynchronize());
      const double oneWayUs = double(*elapsed) / c.iters / 2 / 1000;
      const std::string what = std::string(formName(c.form)) + " form, " + std::to_string(c.bytes) + " B";
      report(what.c_str(), oneWayUs);
      if (rank == 0) out << "latency " << formName(c.form) << " " << c.bytes << " " << oneWayUs << "\n";
    }
    // The 8-byte put with the signal's release in other PTX encodings (direct path only).
    for (int e = 0; direct && e < 4; ++e) {
      ctx.barrier();
      const int iters = 10000;
      pingPongEncoding<<<1, 1>>>(ch, d.id(), s.id(), iters, 100, rank == 0, id, id + 1, static_cast<Encoding>(e),
                                 elapsed, status);
      id += 2;
      GDX_CUDA_CHECK(cudaDeviceSynchronize());
      const double oneWayUs = double(*elapsed) / iters / 2 / 1000;
      report(encodingName(static_cast<Encoding>(e)), oneWayUs);
      if (rank == 0) out << "encoding " << e << " " << oneWayUs << "\n";
    }
    ctx.barrier();
  }
  cudaFree(src);
  cudaFree(dst);
  if (rank == 0) {
    std::ofstream f(resultsPath);
    f << out.str();
  }
  return 0;
}

int byHand(char** argv, uint64_t maxBytes, std::string json, bool nccl, const std::string& plotDir) {
  std::string results = "/tmp/gdx_nvlink_" + std::to_string(getpid()) + ".txt";
  setenv("GDX_NVLINK_RESULTS", results.c_str(), 1);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  int rc = runSelfAsJob(2, argv);
  if (rc != 0) {
    std::fprintf(stderr, "benchmark_nvlink: a rank failed (%d)\n", rc);
    return rc;
  }
  std::map<std::string, std::map<uint64_t, double>> r;
  std::string gpu = "?";
  bool direct = false;
  std::vector<std::string> grid;
  std::map<std::string, std::map<uint64_t, double>> latency;  // form -> bytes -> us one way
  std::map<int, double> encodings;                            // Encoding -> us one way
  std::map<std::string, double> forward;                      // raw, signal, completion -> us
  auto readLines = [&](std::istream& in) {
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string kind;
      ls >> kind;
      if (kind == "gpu") {
        std::getline(ls, gpu);
        if (!gpu.empty() && gpu[0] == ' ') gpu.erase(0, 1);
      } else if (kind == "direct") {
        int d = 0;
        ls >> d;
        direct = d;
      } else if (kind == "grid") {
        std::string rest;
        std::getline(ls, rest);
        grid.push_back(rest);
      } else if (kind == "latency") {
        std::string form;
        uint64_t b;
        double v;
        if (ls >> form >> b >> v) latency[form][b] = v;
      } else if (kind == "encoding") {
        int e;
        double v;
        if (ls >> e >> v) encodings[e] = v;
      } else if (kind == "qlat") {
        std::string what;
        double v;
        if (ls >> what >> v) forward[what] = v;
      } else if (kind == "put" || kind == "putloop" || kind == "pull" || kind == "bulk" || kind == "peercopy" ||
                 kind == "hybrid" || kind == "queue" || kind == "memcpy" || kind == "nccl" || kind == "nccl_latency") {
        uint64_t b;
        double v;
        if (ls >> b >> v) r[kind][b] = v;
      }
    }
  };
  {
    std::ifstream f(results);
    readLines(f);
  }
  std::remove(results.c_str());
  if (nccl) {
    std::string args = std::to_string(freeLoopbackPort());
    for (uint64_t s : sizesUpTo(maxBytes)) args += " " + std::to_string(s);
    runNcclPeer("nvlink", kNcclSendRecvScript, args, readLines);
  }
  const std::string date = isoDateUtc();
  std::printf("benchmark_nvlink: 2 x %s, %s, path to the peer: %s\n", gpu.c_str(), date.c_str(),
              direct ? "direct (CUDA IPC, no proxy)" : "PROXY");
  std::printf("GB/s; gdx put: one launch per put; in-kernel: many puts from one launch (grid barrier per put)\n");
  std::printf("%12s %10s %10s %10s %10s %10s %10s %10s %10s %11s %11s\n", "bytes", "gdx put", "in-kernel", "peerCopy",
              "pc bulk", "pc hybrid", "queue", "memcpyPeer", "NCCL", "put/memcpy", "best/memcpy");
  std::ostringstream js;
  js << "{\n  \"benchmark\": \"nvlink\",\n  \"gpu\": " << jsonString(gpu)
     << ",\n  \"machine\": " << jsonString("2 x " + gpu + ", " + hostName()) << ",\n  \"date\": " << jsonString(date)
     << ",\n  \"direct\": " << (direct ? "true" : "false") << ",\n  \"bandwidth_GBps\": [";
  bool first = true;
  for (uint64_t s : sizesUpTo(maxBytes)) {
    auto get = [&](const char* k) {
      auto it = r[k].find(s);
      return it == r[k].end() ? -1.0 : it->second;
    };
    double put = get("put"), loop = get("putloop"), pc = get("peercopy"), mc = get("memcpy"), nc = get("nccl"),
           pull = get("pull"), bulk = get("bulk"), hybrid = get("hybrid"), queue = get("queue");
    const double best = std::max({put, loop, pc, bulk, queue});
    std::printf("%12llu %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.2fx %10.2fx\n",
                (unsigned long long)s, put, loop, pc, bulk, hybrid, queue, mc, nc, mc > 0 ? put / mc : 0,
                mc > 0 ? best / mc : 0);
    js << (first ? "\n" : ",\n") << "    {\"bytes\": " << s << ", \"gdx_put\": " << put
       << ", \"gdx_put_in_kernel\": " << loop << ", \"peer_copy\": " << pc << ", \"peer_copy_pull\": " << pull
       << ", \"peer_copy_bulk\": " << bulk << ", \"peer_copy_copy_engines_from_16MiB\": " << hybrid
       << ", \"peer_copy_queue\": " << queue << ", \"cuda_memcpy_peer_async\": " << mc << ", \"nccl_send_recv\": " << nc
       << "}";
    first = false;
  }
  js << "\n  ],";
  printQueue(r, grid, forward, maxBytes, js);
  printLatency(latency, encodings, r["nccl_latency"], js);
  js << "\n  \"units\": \"GB/s = 1e9 bytes per second; us: microseconds; -1: not measured\"\n}\n";
  if (json.empty() && !plotDir.empty()) {
    std::filesystem::create_directories(plotDir);
    json = plotDir + "/benchmark_nvlink.json";
  }
  if (!json.empty()) std::ofstream(json) << js.str();
  return plotDir.empty() ? 0 : plotJson("benchmark_nvlink", json, plotDir);
}

}  // namespace
}  // namespace gdx::bench

int main(int argc, char** argv) {
  std::string json, plotDir;
  uint64_t maxBytes = uint64_t{1} << 30;
  bool nccl = true;
  const int parsed = gdx::bench::parseFlags(
      argc, argv,
      "Two GPUs of one host, one process each (self-launched), in one run: gdx's direct-path device put over NVLink,\n"
      "gdx::peerCopy, gdx::PeerCopyQueue (by size, by copy blocks, 4 KiB forward latency), cudaMemcpyPeerAsync,\n"
      "NCCL send/recv through PyTorch, and put-with-signal latency per form (one way, half a ping-pong) beside a\n"
      "signal alone and NCCL's, for 4 KiB .. --max-bytes. Table on stdout, JSON with --json, plots with --plot.",
      {{"--json", "FILE", "where the results go (default: none; DIR/benchmark_nvlink.json with --plot)",
        [&](const std::string& v) { json = v; }},
       gdx::bench::plotFlag(plotDir),
       {"--max-bytes", "N", "largest transfer (default 1G)",
        [&](const std::string& v) { maxBytes = gdx::bench::parseCount(v); }},
       {"--no-nccl", "", "skip the NCCL peer (PyTorch)", [&](const std::string&) { nccl = false; }}});
  if (parsed >= 0) return parsed;
  if (gdx::bench::launchedByHand()) {
    int gpus = 0;
    const cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus < 1) {
      std::fprintf(stderr, "benchmark_nvlink: needs GPUs of one host (two for NVLink); this machine has none (%s)\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
      return 2;
    }
    if (!plotDir.empty() && gdx::bench::checkPlotter("benchmark_nvlink")) return 2;
  }
  try {
    if (gdx::bench::launchedByHand()) return gdx::bench::byHand(argv, maxBytes, json, nccl, plotDir);
    const char* results = std::getenv("GDX_NVLINK_RESULTS");
    return gdx::bench::rankMain(maxBytes, results ? results : "/dev/stdout");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "benchmark_nvlink: %s\n", e.what());
    return 1;
  }
}
