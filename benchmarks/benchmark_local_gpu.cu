#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "base/cuda_check.hpp"
#include "benchmarks/benchmark_local_gpu.hpp"
#include "benchmarks/direct_api_latency.cuh"
#include "benchmarks/gpu_timing.cuh"
#include "benchmarks/proxy_drain.hpp"
#include "benchmarks/run_info.hpp"
#include "benchmarks/self_launch.hpp"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "proxy/proxy.hpp"

namespace gdx::bench {
namespace {

// ---- raw GPU -> CPU -> GPU round trip through host-mapped memory ------------------------------------------
// Bound of the raw round-trip loops (they measure the hardware, so they spin without backing off).
constexpr uint64_t kRawBoundNs = 10ull * 1000 * 1000 * 1000;

__global__ void pingKernel(uint64_t* ping, uint64_t* pong, int iters, uint64_t* elapsedNs) {
  uint64_t t0 = nowNs();
  for (int i = 1; i <= iters; ++i) {
    atomicStore(ping, uint64_t(i), kRelease);
    while (atomicLoad(pong, kAcquire) != uint64_t(i)) {
      if (nowNs() - t0 > kRawBoundNs) {
        *elapsedNs = ~uint64_t{0};  // the responder never answered
        return;
      }
    }
  }
  *elapsedNs = nowNs() - t0;
}

void checkRaw(uint64_t elapsed, const char* what) {
  if (elapsed == ~uint64_t{0}) throw Error(ErrorCode::kTimeout, std::string(what) + ": no answer within 10 s");
}

// The CPU side of the raw round trip; gives up after the same bound as the kernel.
bool awaitPing(uint64_t* ping, uint64_t i, std::chrono::steady_clock::time_point t0) {
  while (atomicLoad(ping, kAcquire) != i)
    if (std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(kRawBoundNs)) return false;
  return true;
}

double rawRoundTripUs() {
  uint64_t* flags = nullptr;
  GDX_CUDA_CHECK(cudaHostAlloc(&flags, 256, cudaHostAllocMapped));
  std::fill(flags, flags + 32, 0);
  uint64_t *ping = flags, *pong = flags + 16, *elapsed = flags + 8;
  const int iters = 20000;
  auto t0 = std::chrono::steady_clock::now();
  std::thread responder([&] {
    for (uint64_t i = 1; i <= uint64_t(iters) && awaitPing(ping, i, t0); ++i) atomicStore(pong, i, kRelease);
  });
  pingKernel<<<1, 1>>>(ping, pong, iters, elapsed);
  GDX_CUDA_CHECK(cudaDeviceSynchronize());
  responder.join();
  checkRaw(*elapsed, "raw round trip");
  double us = double(*elapsed) / iters / 1000.0;
  cudaFreeHost(flags);
  return us;
}

// The alternative for signals: they live in device memory and the CPU side writes them with a copy (what a
// proxy would have to do without a BAR mapping). Same round trip, the answer travelling by cudaMemcpyAsync.
double rawRoundTripDeviceSignalUs() {
  uint64_t* flags = nullptr;
  uint64_t* devPong = nullptr;
  GDX_CUDA_CHECK(cudaHostAlloc(&flags, 256, cudaHostAllocMapped));
  GDX_CUDA_CHECK(cudaMalloc(&devPong, 8));
  GDX_CUDA_CHECK(cudaMemset(devPong, 0, 8));
  std::fill(flags, flags + 32, 0);
  uint64_t *ping = flags, *elapsed = flags + 8, *value = flags + 16;
  cudaStream_t kernelStream, copyStream;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&kernelStream, cudaStreamNonBlocking));
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&copyStream, cudaStreamNonBlocking));
  const int iters = 2000;
  auto t0 = std::chrono::steady_clock::now();
  std::thread responder([&] {
    for (uint64_t i = 1; i <= uint64_t(iters) && awaitPing(ping, i, t0); ++i) {
      *value = i;
      cudaMemcpyAsync(devPong, value, 8, cudaMemcpyHostToDevice, copyStream);
      cudaStreamSynchronize(copyStream);
    }
  });
  pingKernel<<<1, 1, 0, kernelStream>>>(ping, devPong, iters, elapsed);
  GDX_CUDA_CHECK(cudaStreamSynchronize(kernelStream));
  responder.join();
  checkRaw(*elapsed, "raw round trip with device-memory answers");
  double us = double(*elapsed) / iters / 1000.0;
  cudaStreamDestroy(kernelStream);
  cudaStreamDestroy(copyStream);
  cudaFree(devPong);
  cudaFreeHost(flags);
  return us;
}

// ---- put-with-signal latency and put bandwidth through the proxy ------------------------------------------
// elapsed[0]: the whole loop (ns); elapsed[1]: SM clock cycles spent inside putWithSignal (the enqueue), which the
// round trip breaks down into.
__global__ void pingPutWithSignal(ChannelDeviceHandle ch, uint32_t dst, uint32_t src, uint64_t bytes, uint64_t base,
                                  int iters, uint64_t* elapsed, uint32_t* status) {
  uint64_t t0 = nowNs();
  uint64_t enqueueCycles = 0;
  Status s = Status::kOk;
  for (int i = 1; i <= iters && s == Status::kOk; ++i) {
    const long long c0 = clock64();
    s = ch.putWithSignal(dst, 0, src, 0, bytes, 0, 1);
    enqueueCycles += uint64_t(clock64() - c0);
    if (s == Status::kOk) s = ch.wait(0, base + i);
  }
  elapsed[0] = nowNs() - t0;
  elapsed[1] = enqueueCycles;
  *status = static_cast<uint32_t>(s);
}

__global__ void streamPuts(ChannelDeviceHandle ch, uint32_t dst, uint32_t src, uint64_t bytes, uint64_t slots,
                           uint64_t base, int iters, uint64_t* elapsedNs, uint32_t* status) {
  uint64_t t0 = nowNs();
  Status s = Status::kOk;
  for (int i = 0; i + 1 < iters && s == Status::kOk; ++i) s = ch.put(dst, (i % slots) * bytes, src, 0, bytes);
  if (s == Status::kOk) s = ch.putWithSignal(dst, ((iters - 1) % slots) * bytes, src, 0, bytes, 1, 1);
  if (s == Status::kOk) s = ch.wait(1, base + 1);
  *elapsedNs = nowNs() - t0;
  *status = static_cast<uint32_t>(s);
}

// ---- command rate with the null transport -----------------------------------------------------------------
// Each warp takes a ring of its own by its global index, as a many-producer kernel should (gdx/device/channel.hpp):
// ordering holds per ring, and one ring per proxy thread is the most one thread drains.
__global__ void pushCommands(const RingDeviceHandle* rings, int numRings, int perThread, uint32_t* status) {
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  RingDeviceHandle ring = rings[warp % numRings];
  const Command c = Command::put(0, 0, threadIdx.x, 0, blockIdx.x, 8);
  for (int i = 0; i < perThread; ++i) {
    Status s = ring.push(c);
    if (s != Status::kOk) {
      atomicCAS(status, 0u, static_cast<uint32_t>(s));
      return;
    }
  }
}

// The raw limit of the producer side: every thread stores 16-byte commands into host-mapped memory as fast as
// it can (each warp its own 512-byte lines, no reservation, no consumer). kFenced: each store after a system-scope
// release fence, as the ring publishes a command (one fence per warp-wide store: the floor of a push without its
// reservation, which is what bounds a single block).
template <bool kFenced>
__global__ void storeCommands(Command* slots, uint64_t capacity, int perThread) {
  const uint64_t thread = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  const Command c = Command::put(0, 0, threadIdx.x, 0, blockIdx.x, 8);
  for (int i = 0; i < perThread; ++i) {
    Command* slot = &slots[(thread + uint64_t(i) * gridDim.x * blockDim.x) & (capacity - 1)];
    if constexpr (kFenced)
      ptx::releaseStore128Sys(slot->word, c.word[0], c.word[1]);
    else
      ptx::relaxedStore128Sys(slot->word, c.word[0], c.word[1]);
  }
}

constexpr int kRateThreadsPerBlock = 256;
constexpr int kRateBlocks[] = {1, 2, 4, 8, 16, 33, 66, 132};

// Commands per thread for a cell: about 4 M commands in all, so each cell runs for milliseconds at least.
int perThreadFor(int blocks) {
  return std::max(256, (4 << 20) / (blocks * kRateThreadsPerBlock));
}

struct RateRow {
  int proxyThreads, ringsPerThread, blocks;
  double commandsPerSec;
  double commandsPerBatch;  ///< how many commands the proxy threads found per poll, on average
};

struct RateLimits {
  double storesPerSec;          ///< 16-byte stores into host-mapped memory from 132 blocks
  double fencedOneBlockPerSec;  ///< the same from one block, a system release fence before each warp's store
  double drainedPerSec;         ///< one proxy thread draining a ring its producers filled beforehand
};

RateLimits rawRateLimits(WindowRegistry& registry) {
  RateLimits l{};
  {
    constexpr uint64_t kCapacity = uint64_t{1} << 16;
    Command* slots = nullptr;
    GDX_CUDA_CHECK(cudaHostAlloc(&slots, kCapacity * sizeof(Command), cudaHostAllocMapped));
    const int blocks = 132, perThread = perThreadFor(blocks);
    storeCommands<false><<<blocks, kRateThreadsPerBlock>>>(slots, kCapacity, 16);  // warm-up
    const float ms =
        eventMs([&] { storeCommands<false><<<blocks, kRateThreadsPerBlock>>>(slots, kCapacity, perThread); });
    l.storesPerSec = double(blocks) * kRateThreadsPerBlock * perThread / (ms / 1e3);
    const int onePerThread = perThreadFor(1);
    storeCommands<true><<<1, kRateThreadsPerBlock>>>(slots, kCapacity, 16);
    const float fencedMs =
        eventMs([&] { storeCommands<true><<<1, kRateThreadsPerBlock>>>(slots, kCapacity, onePerThread); });
    l.fencedOneBlockPerSec = double(kRateThreadsPerBlock) * onePerThread / (fencedMs / 1e3);
    cudaFreeHost(slots);
  }
  {
    constexpr uint64_t kCommands = uint64_t{1} << 22;
    l.drainedPerSec = kCommands / drainFilledRingSeconds(registry, 0, kCommands);
  }
  return l;
}

// Rings per proxy thread in the rate tables: one (the default of a Context) and several, so a many-producer kernel's
// warps share each ring with fewer others.
constexpr int kRateRingsPerThread[] = {1, 4};

std::vector<RateRow> nullTransportRates(WindowRegistry& registry, int ringsPerThread) {
  std::vector<RateRow> rows;
  uint32_t* status = nullptr;
  GDX_CUDA_CHECK(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  RingDeviceHandle* devRings = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&devRings, 8 * ringsPerThread * sizeof(RingDeviceHandle)));
  for (int threads : {1, 2, 4, 8}) {
    Proxy::Options o = Proxy::Options::fromEnv();
    o.threads = threads;
    o.ringsPerThread = 0;
    o.deviceRingsPerThread = ringsPerThread;
    o.ringCapacity = 8192;
    o.placement = defaultPlacement();
    Proxy proxy(o, nullptr, registry);
    proxy.start();
    std::vector<RingDeviceHandle> handles;
    for (int r = 0; r < proxy.numDeviceRings(); ++r) handles.push_back(proxy.deviceRing(r).deviceHandle());
    GDX_CUDA_CHECK(
        cudaMemcpy(devRings, handles.data(), handles.size() * sizeof(RingDeviceHandle), cudaMemcpyHostToDevice));
    for (int blocks : kRateBlocks) {
      *status = 0;
      const ProxyCounters before = proxy.totalCounters();
      const int perThread = perThreadFor(blocks);
      const uint64_t total = uint64_t(blocks) * kRateThreadsPerBlock * perThread;
      auto t0 = std::chrono::steady_clock::now();
      pushCommands<<<blocks, kRateThreadsPerBlock>>>(devRings, proxy.numDeviceRings(), perThread, status);
      GDX_CUDA_CHECK(cudaDeviceSynchronize());
      while (proxy.totalCounters().commands - before.commands < total && *status == 0) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
          throw Error(ErrorCode::kTimeout, "null transport: the proxy consumed " +
                                               std::to_string(proxy.totalCounters().commands - before.commands) +
                                               " of " + std::to_string(total) + " commands in 60 s");
        std::this_thread::yield();
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (*status != 0) throw Error(ErrorCode::kInternal, std::string("push failed: ") + statusName(Status(*status)));
      const ProxyCounters after = proxy.totalCounters();
      rows.push_back(RateRow{threads, ringsPerThread, blocks, total / s,
                             double(after.commands - before.commands) / double(after.batches - before.batches)});
    }
    proxy.stop();
  }
  cudaFree(devRings);
  cudaFreeHost(status);
  return rows;
}

struct SizeRow {
  size_t bytes;
  double latencyUs, gbPerSec;
  double memcpyGbPerSec;  ///< the peer: the copy the loopback transport makes per put, back to back without gdx
};

// cudaMemcpyAsync device to device, back to back over the same slots as the put stream: what the loopback
// transport's copies reach without the ring, the proxy and the synchronisation after each put.
double memcpyGbPerSec(void* dst, const void* src, size_t bytes, size_t window, int iters) {
  size_t i = 0;
  return eventGBps(bytes, iters, [&] {
    char* to = static_cast<char*>(dst) + (i++ % (window / bytes)) * bytes;
    GDX_CUDA_CHECK(cudaMemcpyAsync(to, src, bytes, cudaMemcpyDeviceToDevice));
  });
}

}  // namespace

bool gpuAvailable() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

int runGpuMode(const GpuModeOptions& opt) {
  // A world of one: the proxy delivers back to this GPU. The thinnest transport measures the path itself.
  if (launchedByHand()) {
    setenv("GDX_RANK", "0", 1);
    setenv("GDX_WORLD_SIZE", "1", 1);
    setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
    setenv("GDX_MASTER_PORT", std::to_string(freeLoopbackPort()).c_str(), 1);
    setenv("GDX_JOB_SECRET", "benchmark_local", 0);
    setenv("GDX_TRANSPORT", "loopback", 0);
  }
  // This mode measures the proxy path; a rank's own GPU would otherwise be reached directly (benchmark_nvlink
  // measures that path).
  setenv("GDX_DIRECT", "0", 0);
  const double rawUs = rawRoundTripUs();
  const double rawDeviceSignalUs = rawRoundTripDeviceSignalUs();
  std::vector<SizeRow> sizes;
  double hostWindowLatencyUs = 0, enqueueUs = 0, proxyHandlingUs = -1;
  std::string transportName, gpuName;
  {
    Context ctx;
    transportName = ctx.transportName();
    cudaDeviceProp prop{};
    GDX_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.gpu().device));
    gpuName = prop.name;
    const size_t window = std::max(opt.maxBytes, size_t{64} << 20);
    void *src = nullptr, *dst = nullptr, *hsrc = nullptr, *hdst = nullptr;
    GDX_CUDA_CHECK(cudaMalloc(&src, window));
    GDX_CUDA_CHECK(cudaMalloc(&dst, window));
    GDX_CUDA_CHECK(cudaMemset(src, 1, window));
    GDX_CUDA_CHECK(cudaHostAlloc(&hsrc, 4096, cudaHostAllocMapped));
    GDX_CUDA_CHECK(cudaHostAlloc(&hdst, 4096, cudaHostAllocMapped));
    uint64_t* scratch = nullptr;
    GDX_CUDA_CHECK(cudaHostAlloc(&scratch, 256, cudaHostAllocMapped));
    uint32_t* status = reinterpret_cast<uint32_t*>(scratch + 8);
    {
      Window s = ctx.registerWindow(src, window, MemoryKind::kCuda);
      Window d = ctx.registerWindow(dst, window, MemoryKind::kCuda);
      Window hs = ctx.registerWindow(hsrc, 4096, MemoryKind::kHost);
      Window hd = ctx.registerWindow(hdst, 4096, MemoryKind::kHost);
      uint64_t pings = 0, streams = 0;
      auto check = [&](const char* what) {
        if (*status != 0)
          throw Error(ErrorCode::kInternal,
                      std::string(what) + ": " + statusName(Status(*status)) + "; proxy: " + ctx.proxyError());
      };
      // Small put-with-signal between host-mapped windows: the proxy path with the least data movement.
      {
        const int iters = 2000;
        const ProxyCounters before = ctx.stats();
        pingPutWithSignal<<<1, 1>>>(ctx.deviceChannel(0), hd.id(), hs.id(), 8, pings, iters, scratch, status);
        GDX_CUDA_CHECK(cudaDeviceSynchronize());
        check("latency, host windows");
        const ProxyCounters after = ctx.stats();
        pings += iters;
        hostWindowLatencyUs = double(scratch[0]) / iters / 1000.0;
        int clockKhz = 0;
        GDX_CUDA_CHECK(cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, ctx.gpu().device));
        enqueueUs = clockKhz > 0 ? double(scratch[1]) / iters / (clockKhz / 1e3) : -1;
        // GDX_PROXY_TIMING=1 only: the proxy's own time per round trip (taking the pair out, posting it).
        if (after.handlingNs > before.handlingNs)
          proxyHandlingUs = double(after.handlingNs - before.handlingNs) / iters / 1000.0;
      }
      for (size_t bytes = opt.minBytes; bytes <= opt.maxBytes; bytes *= 2) {
        const int li = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 10, 2000));
        pingPutWithSignal<<<1, 1>>>(ctx.deviceChannel(0), d.id(), s.id(), bytes, pings, li, scratch, status);
        GDX_CUDA_CHECK(cudaDeviceSynchronize());
        check("latency");
        pings += li;
        double lat = double(scratch[0]) / li / 1000.0;
        const int bi = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / bytes, 4, 20000));
        streamPuts<<<1, 1>>>(ctx.deviceChannel(0), d.id(), s.id(), bytes, window / bytes, streams, bi, scratch, status);
        GDX_CUDA_CHECK(cudaDeviceSynchronize());
        check("bandwidth");
        streams += 1;
        double gbs = double(bytes) * bi / (double(scratch[0]) / 1e9) / 1e9;
        sizes.push_back(SizeRow{bytes, lat, gbs, memcpyGbPerSec(dst, src, bytes, window, bi)});
      }
    }
    cudaFree(src);
    cudaFree(dst);
    cudaFreeHost(hsrc);
    cudaFreeHost(hdst);
    cudaFreeHost(scratch);
  }
  const std::vector<DirectApiLatency> directApi = directApiLatencyOneGpu();
  // PeerCopyQueue's forward latency with source and destination on this GPU: the queue's own machinery (host slot,
  // poller, workers, signal) without the link; benchmark_nvlink measures it between two GPUs. 4 KiB is copied by the
  // polling warp itself, 64 KiB by a copy block.
  ForwardLatency forward{}, forward64k{};
  {
    constexpr uint64_t kLarge = 64 * 1024;
    void *from = nullptr, *to = nullptr;
    GDX_CUDA_CHECK(cudaMalloc(&from, kLarge));
    GDX_CUDA_CHECK(cudaMalloc(&to, kLarge));
    int device = 0;
    GDX_CUDA_CHECK(cudaGetDevice(&device));
    forward = queueForwardLatency(device, device, from, to);
    forward64k = queueForwardLatency(device, device, from, to, kLarge);
    cudaFree(from);
    cudaFree(to);
  }
  WindowRegistry registry(0, 1, kMaxWindows);
  static char fake;  // never touched: the null transport moves no data
  registry.addLocal(0, &fake, size_t{1} << 30, MemoryKind::kHost);
  registry.addRemote(0, 0, size_t{1} << 30);
  const RateLimits limits = rawRateLimits(registry);
  std::vector<RateRow> rates;
  for (int rings : kRateRingsPerThread) {
    std::vector<RateRow> r = nullTransportRates(registry, rings);
    rates.insert(rates.end(), r.begin(), r.end());
  }

  std::printf("benchmark_local (GPU mode): kernel -> ring -> proxy -> %s transport -> same GPU\n",
              transportName.c_str());
  std::printf("raw GPU->CPU->GPU round trip through host-mapped memory: %.2f us\n", rawUs);
  std::printf("same, answer written into device memory with cudaMemcpyAsync: %.2f us (signals stay host-mapped)\n",
              rawDeviceSignalUs);
  std::printf("putWithSignal -> signal seen by the waiting kernel, 8 B, host-mapped windows: %.2f us (%.2fx raw)\n",
              hostWindowLatencyUs, hostWindowLatencyUs / rawUs);
  std::printf("  of which inside putWithSignal (the enqueue) %.2f us (SM cycles at the peak clock)", enqueueUs);
  if (proxyHandlingUs >= 0) std::printf(", the proxy's handling %.2f us", proxyHandlingUs);
  std::printf("%s\n", proxyHandlingUs >= 0 ? "" : " (GDX_PROXY_TIMING=1 adds the proxy's handling)");
  std::printf("%12s %16s %12s %14s   (GPU windows; memcpy: the peer, cudaMemcpyAsync back to back)\n", "bytes",
              "put+signal_us", "GB/s", "memcpy_GB/s");
  for (const SizeRow& r : sizes)
    std::printf("%12zu %16.2f %12.3f %14.3f\n", r.bytes, r.latencyUs, r.gbPerSec, r.memcpyGbPerSec);
  std::printf("direct-path device API on this GPU, two blocks of one kernel ping-pong (one way, us):\n");
  for (const DirectApiLatency& d : directApi) std::printf("  %-30s %8.2f\n", d.what.c_str(), d.oneWayUs);
  for (const auto& [what, f] : {std::pair{"4 KiB", forward}, std::pair{"64 KiB", forward64k}})
    std::printf(
        "PeerCopyQueue %s on this GPU (median, us): submit -> signal seen by a kernel -> host %.2f, submit -> "
        "completion seen %.2f; raw host -> kernel -> host %.2f\n",
        what, f.signalAckUs, f.completionUs, f.rawRoundTripUs);
  std::printf(
      "null transport command rate (Mcommands/s), %d threads per block, each warp on ring warp %% rings;\n"
      "raw limits: 16-byte stores into host-mapped memory from 132 blocks %.1f M/s; from 1 block, each warp's store "
      "after a system release fence (a push less its reservation) %.1f M/s; one proxy thread draining a filled ring "
      "%.1f M/s\n",
      kRateThreadsPerBlock, limits.storesPerSec / 1e6, limits.fencedOneBlockPerSec / 1e6, limits.drainedPerSec / 1e6);
  for (int rings : kRateRingsPerThread) {
    std::printf("%d device ring(s) per proxy thread\n%8s", rings, "blocks");
    for (int t : {1, 2, 4, 8}) std::printf(" %8s", ("proxy" + std::to_string(t)).c_str());
    std::printf("   (commands per poll, proxy1/2/4/8)\n");
    for (int b : kRateBlocks) {
      std::printf("%8d", b);
      for (const RateRow& r : rates)
        if (r.blocks == b && r.ringsPerThread == rings) std::printf(" %8.1f", r.commandsPerSec / 1e6);
      std::printf("  ");
      for (const RateRow& r : rates)
        if (r.blocks == b && r.ringsPerThread == rings) std::printf(" %5.0f", r.commandsPerBatch);
      std::printf("\n");
    }
  }
  std::ofstream out(opt.json);
  out << "{\"benchmark\":\"benchmark_local\",\"mode\":\"gpu\",\"transport\":\"" << transportName << "\""
      << runInfoJson(gpuName + ", " + hostName()) << ",\"raw_round_trip_us\":" << rawUs
      << ",\"raw_round_trip_device_signal_us\":" << rawDeviceSignalUs
      << ",\"put_with_signal_host_windows_us\":" << hostWindowLatencyUs << ",\"enqueue_us\":" << enqueueUs
      << ",\"proxy_handling_us\":" << proxyHandlingUs << ",\"raw_store_commands_per_s\":" << limits.storesPerSec
      << ",\"raw_fenced_store_one_block_commands_per_s\":" << limits.fencedOneBlockPerSec
      << ",\"raw_drain_commands_per_s\":" << limits.drainedPerSec << ",\"sizes\":[";
  for (size_t i = 0; i < sizes.size(); ++i)
    out << (i ? "," : "") << "{\"bytes\":" << sizes[i].bytes << ",\"latency_us\":" << sizes[i].latencyUs
        << ",\"gb_per_s\":" << sizes[i].gbPerSec << ",\"cuda_memcpy_gb_per_s\":" << sizes[i].memcpyGbPerSec << "}";
  out << "],\"queue_forward_4k_one_gpu\":{\"signal_ack_us\":" << forward.signalAckUs
      << ",\"completion_us\":" << forward.completionUs << ",\"raw_round_trip_us\":" << forward.rawRoundTripUs << "}";
  out << ",\"queue_forward_64k_one_gpu\":{\"signal_ack_us\":" << forward64k.signalAckUs
      << ",\"completion_us\":" << forward64k.completionUs << ",\"raw_round_trip_us\":" << forward64k.rawRoundTripUs
      << "}";
  out << ",\"direct_api_one_gpu\":[";
  for (size_t i = 0; i < directApi.size(); ++i)
    out << (i ? "," : "") << "{\"case\":\"" << directApi[i].what << "\",\"one_way_us\":" << directApi[i].oneWayUs
        << "}";
  out << "],\"null_transport_rate\":[";
  for (size_t i = 0; i < rates.size(); ++i)
    out << (i ? "," : "") << "{\"proxy_threads\":" << rates[i].proxyThreads
        << ",\"rings_per_thread\":" << rates[i].ringsPerThread << ",\"blocks\":" << rates[i].blocks
        << ",\"commands_per_s\":" << rates[i].commandsPerSec << ",\"commands_per_poll\":" << rates[i].commandsPerBatch
        << "}";
  out << "]}\n";
  std::printf("wrote %s\n", opt.json.c_str());
  return 0;
}

}  // namespace gdx::bench
