// The device API on a real GPU: kernels issue put / putWithSignal / signal / atomicAdd / wait / flush
// through a device ring to the proxy and the transport (TCP to itself by default, GDX_TRANSPORT to change).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gpu_test_support.hpp"
#include "runtime/context_impl.hpp"

namespace gdx {
namespace {

struct PutDesc {
  uint64_t srcOffset, dstOffset, bytes;
};

// Each warp takes descriptors [warp * perWarp, (warp + 1) * perWarp). Even warps: every lane puts its own
// descriptors (single-thread form) and the warp flushes with flushWarp, which must cover every lane's puts.
// Odd warps: the warp walks them with the warp-cooperative form. Every put carries a signal add of 1 on
// signal 0; statuses go to `status`.
__global__ void randomPuts(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, const PutDesc* descs, int perWarp,
                           uint32_t* status) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  Status s = Status::kOk;
  const PutDesc* mine = descs + size_t(warp) * perWarp;
  if (warp % 2 == 0) {
    for (int i = lane; i < perWarp && s == Status::kOk; i += 32)
      s = ch.putWithSignal(dstWin, mine[i].dstOffset, srcWin, mine[i].srcOffset, mine[i].bytes, 0, 1);
    Status f = ch.flushWarp();
    if (s == Status::kOk) s = f;
  } else {
    for (int i = 0; i < perWarp && s == Status::kOk; ++i)
      s = ch.putWithSignalWarp(dstWin, mine[i].dstOffset, srcWin, mine[i].srcOffset, mine[i].bytes, 0, 1);
    if (s == Status::kOk) s = ch.flushWarp();
  }
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

__global__ void manySignals(ChannelDeviceHandle ch, int perThread, uint32_t* status) {
  Status s = Status::kOk;
  for (int i = 0; i < perThread && s == Status::kOk; ++i) s = ch.signal(1, 1);
  if (s == Status::kOk) s = ch.flush();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// Blocks whose x size is not a multiple of 32: lanes must still be told apart (%laneid, not threadIdx.x).
__global__ void signalsFrom2dBlocks(ChannelDeviceHandle ch, uint32_t* status) {
  Status s = ch.signal(4, 1);
  if (s == Status::kOk) s = ch.signalWarp(5, 1);
  if (s == Status::kOk) s = ch.flushWarp();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// Every lane of each warp puts its slot with a signal and then signals, through the warp forms, and flushes: lanes
// together, or (`apart`) odd lanes one loop trip after even ones, in blocks whose size may leave a partial last warp.
// Each warp is one group whichever lanes the compiler runs together at the call: one put and one signal per warp.
// Each thread writes what its last call returned and which call that was (1 put, 2 signal, 3 flush) to `report`.
__global__ void warpFormPuts(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint64_t slot, uint64_t stride,
                             bool apart, uint32_t firstSignal, uint32_t* report) {
  const unsigned lane = threadIdx.x & 31, warp = blockIdx.x * ((blockDim.x + 31) / 32) + threadIdx.x / 32;
  const unsigned turn = apart ? (lane & 1) : 0;
  Status s = Status::kOk;
  uint32_t step = 0;
  for (unsigned trip = 0; trip <= turn; ++trip) {
    if (trip != turn) continue;
    step = 1;
    s = ch.putWithSignalWarp(dstWin, warp * stride, srcWin, warp * stride, slot, firstSignal, 1);
    if (s == Status::kOk) {
      step = 2;
      s = ch.signalWarp(firstSignal + 1, 1);
    }
  }
  if (s == Status::kOk) {
    step = 3;
    s = ch.flushWarp();
  }
  report[blockIdx.x * blockDim.x + threadIdx.x] = step << 16 | static_cast<uint32_t>(s);
}

// One signal after everything the kernels before it enqueued on the same ring: once it is seen, so is all of theirs.
__global__ void signalOnce(ChannelDeviceHandle ch, uint32_t signal, uint32_t* status) {
  Status s = ch.signal(signal, 1);
  if (s == Status::kOk) s = ch.flush();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

__global__ void waitOnce(ChannelDeviceHandle ch, uint32_t signal, uint64_t value, uint32_t* status) {
  *status = static_cast<uint32_t>(ch.wait(signal, value));
}

__global__ void putThenFlush(ChannelDeviceHandle ch, uint32_t dstWin, uint64_t dstOffset, uint32_t srcWin,
                             uint64_t bytes, uint32_t* status) {
  Status s = ch.put(dstWin, dstOffset, srcWin, 0, bytes);
  if (s == Status::kOk) s = ch.flush();
  *status = static_cast<uint32_t>(s);
}

// One thread, one copy of the handle: a refused put fails the flush that covers it, then a valid putWithSignal on the
// same ring and its flush succeed and its signal arrives (errors are per command, not per ring).
__global__ void rejectedThenValid(ChannelDeviceHandle ch, uint32_t badWin, uint32_t dstWin, uint32_t srcWin,
                                  uint64_t bytes, uint32_t signal, uint32_t* status) {
  Status s = ch.put(badWin, 0, srcWin, 0, bytes);
  status[0] = static_cast<uint32_t>(s == Status::kOk ? ch.flush() : s);
  s = ch.putWithSignal(dstWin, 0, srcWin, 0, bytes, signal, 1);
  status[1] = static_cast<uint32_t>(s == Status::kOk ? ch.flush() : s);
  status[2] = static_cast<uint32_t>(ch.wait(signal, 1));
}

__global__ void atomicAdds(ChannelDeviceHandle ch, uint32_t win, int perThread, uint32_t* status) {
  Status s = Status::kOk;
  for (int i = 0; i < perThread && s == Status::kOk; ++i) s = ch.atomicAdd(win, 8 * (threadIdx.x % 4), 1);
  // The signal lands after this thread's adds (same ring, same peer): the host waits on it.
  if (s == Status::kOk) s = ch.signal(2, 1);
  if (s == Status::kOk) s = ch.flush();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

class DeviceApi : public ::testing::TestWithParam<MemoryKind> {
 protected:
  void SetUp() override {
    GDX_SKIP_WITHOUT_GPU();
    test::soloJobEnv();
  }
};

// Many blocks x warps, random sizes and offsets, random data, both forms of the API; every byte of the
// destination is compared, including the poison between the regions.
TEST_P(DeviceApi, RandomPutsFromManyBlocksAndWarpsArriveIntact) {
  const MemoryKind kind = GetParam();
  Context ctx;
  constexpr int kBlocks = 32, kThreads = 128, kPerWarp = 16, kSlot = 4096;
  const int warps = kBlocks * kThreads / 32, puts = warps * kPerWarp;
  const size_t srcBytes = size_t{8} << 20, dstBytes = size_t(puts) * kSlot;
  std::vector<unsigned char> hostSrc(srcBytes), expect(dstBytes, 0xEE);
  test::fillRandom(hostSrc.data(), srcBytes, 42);
  std::vector<PutDesc> descs(puts);
  std::mt19937_64 rng(7);
  for (int i = 0; i < puts; ++i) {
    uint64_t bytes = 1 + rng() % (kSlot - 64);
    uint64_t dst = uint64_t(i) * kSlot + rng() % (kSlot - bytes);
    uint64_t src = rng() % (srcBytes - bytes);
    descs[i] = {src, dst, bytes};
    std::memcpy(&expect[dst], &hostSrc[src], bytes);
  }
  void *src = nullptr, *dst = nullptr;
  if (kind == MemoryKind::kCuda) {
    GDX_TEST_CUDA(cudaMalloc(&src, srcBytes));
    GDX_TEST_CUDA(cudaMalloc(&dst, dstBytes));
  } else {
    GDX_TEST_CUDA(cudaHostAlloc(&src, srcBytes, cudaHostAllocMapped));
    GDX_TEST_CUDA(cudaHostAlloc(&dst, dstBytes, cudaHostAllocMapped));
  }
  GDX_TEST_CUDA(cudaMemcpy(src, hostSrc.data(), srcBytes, cudaMemcpyDefault));
  GDX_TEST_CUDA(cudaMemset(dst, 0xEE, dstBytes));
  {
    Window s = ctx.registerWindow(src, srcBytes, kind);
    Window d = ctx.registerWindow(dst, dstBytes, kind);
    PutDesc* devDescs = nullptr;
    uint32_t* status = nullptr;
    GDX_TEST_CUDA(cudaMalloc(&devDescs, puts * sizeof(PutDesc)));
    GDX_TEST_CUDA(cudaMemcpy(devDescs, descs.data(), puts * sizeof(PutDesc), cudaMemcpyHostToDevice));
    GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
    *status = 0;
    randomPuts<<<kBlocks, kThreads>>>(ctx.deviceChannel(0), d.id(), s.id(), devDescs, kPerWarp, status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(*status, 0u) << statusName(static_cast<Status>(*status)) << "; proxy: " << ctx.proxyError();
    ctx.wait(0, puts);
    std::vector<unsigned char> got(dstBytes);
    GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, dstBytes, cudaMemcpyDefault));
    long long bad = test::firstMismatch(got.data(), expect.data(), dstBytes);
    EXPECT_EQ(bad, -1) << "first differing byte in slot " << (bad / kSlot);
    cudaFree(devDescs);
    cudaFreeHost(status);
  }
  if (kind == MemoryKind::kCuda) {
    cudaFree(src);
    cudaFree(dst);
  } else {
    cudaFreeHost(src);
    cudaFreeHost(dst);
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, DeviceApi, ::testing::Values(MemoryKind::kHost, MemoryKind::kCuda),
                         [](const auto& info) { return info.param == MemoryKind::kCuda ? "gpu" : "host"; });

// A small ring under every SM's worth of producers: the ring wraps thousands of times while full, and
// every command still arrives exactly once (the signal counts them).
TEST(DeviceApiRing, WrapAroundUnderFullLoadCountsExactly) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_RING_SIZE", "64", 1);
  Context ctx;
  unsetenv("GDX_RING_SIZE");
  constexpr int kBlocks = 132, kThreads = 128, kPerThread = 16;
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 0;
  manySignals<<<kBlocks, kThreads>>>(ctx.deviceChannel(0), kPerThread, status);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(*status, 0u) << statusName(static_cast<Status>(*status));
  const uint64_t total = uint64_t(kBlocks) * kThreads * kPerThread;
  ctx.wait(1, total);
  EXPECT_EQ(ctx.signalValue(1), total);
  EXPECT_GT(total, 64u * 1000) << "the ring of 64 slots wrapped over a thousand times";
  cudaFreeHost(status);
}

TEST(DeviceApiRing, TwoDimensionalBlocksPushEveryCommandOnce) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  Context ctx;
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 0;
  const dim3 block(16, 6);  // 96 threads: 3 warps, each spanning several rows
  signalsFrom2dBlocks<<<20, block>>>(ctx.deviceChannel(0), status);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(*status, 0u) << statusName(static_cast<Status>(*status));
  ctx.wait(4, 20 * 96);
  ctx.wait(5, 20 * 3);
  EXPECT_EQ(ctx.signalValue(4), 20u * 96);
  EXPECT_EQ(ctx.signalValue(5), 20u * 3) << "one signalWarp per warp";
  cudaFreeHost(status);
}

TEST(DeviceApiRing, WarpFormsActOncePerWarpWhenLanesArriveApart) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_TIMEOUT_MS", "5000", 1);
  Context ctx;
  struct Shape {
    const char* name;
    int threads;  // per block: 48 leaves a partial warp of 16 lanes
    bool apart;   // odd lanes call one loop trip after even ones
    int gap;      // bytes between slots: 0 lets the proxy merge one warp's put with the next one's
  };
  const Shape shapes[] = {{"whole warps together", 64, false, 0},
                          {"a partial warp, lanes together", 48, false, 0},
                          {"a partial warp, lanes apart", 48, true, 0},
                          {"a partial warp, lanes apart, slots apart", 48, true, 24}};
  constexpr int kBlocks = 20, kMaxThreads = 64;  // per block: the largest shape's
  constexpr uint64_t kSlot = 1000, kMaxBytes = (kSlot + 24) * kBlocks * 2;
  std::vector<unsigned char> hostSrc(kMaxBytes);
  test::fillRandom(hostSrc.data(), kMaxBytes, 99);
  test::GpuBuffer src(kMaxBytes), dst(kMaxBytes);
  GDX_TEST_CUDA(cudaMemcpy(src.p, hostSrc.data(), kMaxBytes, cudaMemcpyHostToDevice));
  uint32_t* report = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&report, (kBlocks * kMaxThreads + 1) * sizeof(uint32_t), cudaHostAllocMapped));
  uint32_t* const lastStatus = report + kBlocks * kMaxThreads;  // signalOnce's
  {
    Window s = ctx.registerWindow(src.p, kMaxBytes, MemoryKind::kCuda);
    Window d = ctx.registerWindow(dst.p, kMaxBytes, MemoryKind::kCuda);
    uint32_t signal = 6;
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(shape.name);
      const int warps = kBlocks * ((shape.threads + 31) / 32);
      const uint64_t stride = kSlot + shape.gap, bytes = stride * warps;
      GDX_TEST_CUDA(cudaMemset(dst.p, 0xEE, kMaxBytes));
      std::memset(report, 0xFF, kBlocks * kMaxThreads * sizeof(uint32_t));
      *lastStatus = 0;
      warpFormPuts<<<kBlocks, shape.threads>>>(ctx.deviceChannel(0), d.id(), s.id(), kSlot, stride, shape.apart, signal,
                                               report);
      // The marker only once the puts' kernel has ended: a kernel launched while it was flushing held up the
      // transport's staging copies from GPU memory (which that flush waits for) until the bound, on an H200 with
      // CUDA's lazy module loading.
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      signalOnce<<<1, 1>>>(ctx.deviceChannel(0), signal + 2, lastStatus);
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(*lastStatus, 0u) << statusName(static_cast<Status>(*lastStatus));
      ctx.wait(signal + 2, 1);  // after every command of the first kernel on this ring
      for (int t = 0; t < kBlocks * shape.threads; ++t) {
        const Status st = static_cast<Status>(report[t] & 0xFFFF);
        if (report[t] >> 16 != 3 || st != Status::kOk) {
          static const char* const kSteps[] = {"no call", "put", "signal", "flush"};
          ADD_FAILURE() << "block " << t / shape.threads << " thread " << t % shape.threads << ": "
                        << kSteps[std::min(report[t] >> 16, 3u)] << " returned " << statusName(st)
                        << "; proxy: " << ctx.proxyError();
          break;
        }
      }
      EXPECT_EQ(ctx.signalValue(signal), uint64_t(warps)) << "one putWithSignalWarp per warp";
      EXPECT_EQ(ctx.signalValue(signal + 1), uint64_t(warps)) << "one signalWarp per warp";
      std::vector<unsigned char> got(bytes);
      GDX_TEST_CUDA(cudaMemcpy(got.data(), dst.p, bytes, cudaMemcpyDeviceToHost));
      for (int w = 0; w < warps; ++w)
        EXPECT_EQ(test::firstMismatch(got.data() + w * stride, hostSrc.data() + w * stride, kSlot), -1) << "warp " << w;
      signal += 3;
    }
  }
  cudaFreeHost(report);
}

TEST(DeviceApiRing, AtomicAddsFromAllThreadsSumExactly) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  Context ctx;
  uint64_t* words = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&words, 64, cudaHostAllocMapped));
  std::memset(words, 0, 64);
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 0;
  {
    Window w = ctx.registerWindow(words, 64);
    atomicAdds<<<8, 128>>>(ctx.deviceChannel(0), w.id(), 20, status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(*status, 0u);
    ctx.wait(2, 8 * 128);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(words[i], 8u * 128 * 20 / 4) << "word " << i;
  }
  cudaFreeHost(words);
  cudaFreeHost(status);
}

// A wait that nobody answers returns kTimeout, not a hang, within twice its bound.
TEST(DeviceApiErrors, WaitTimesOutWithinTwiceItsBound) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_TIMEOUT_MS", "500", 1);
  Context ctx;
  unsetenv("GDX_TIMEOUT_MS");
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 99;
  auto t0 = std::chrono::steady_clock::now();
  waitOnce<<<1, 1>>>(ctx.deviceChannel(0), 5, 1, status);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(static_cast<Status>(*status), Status::kTimeout);
  EXPECT_GE(s, 0.5);
  EXPECT_LT(s, 1.0);
  cudaFreeHost(status);
}

// A kernel naming an unregistered window or an offset past the end gets kProxyError back from flush, the
// proxy says why, nothing is written; the ring is not broken by it: a valid put and signal afterwards arrive.
TEST(DeviceApiErrors, InvalidWindowOrOffsetIsRejectedAndReported) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_TIMEOUT_MS", "20000", 1);
  Context ctx;
  unsetenv("GDX_TIMEOUT_MS");
  void *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&src, 4096));
  GDX_TEST_CUDA(cudaMalloc(&dst, 4096));
  GDX_TEST_CUDA(cudaMemset(src, 0x11, 4096));
  GDX_TEST_CUDA(cudaMemset(dst, 0x00, 4096));
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, 3 * sizeof(uint32_t), cudaHostAllocMapped));
  {
    Window s = ctx.registerWindow(src, 4096, MemoryKind::kCuda);
    Window d = ctx.registerWindow(dst, 4096, MemoryKind::kCuda);
    putThenFlush<<<1, 1>>>(ctx.deviceChannel(0), 50, 0, s.id(), 64, status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(static_cast<Status>(status[0]), Status::kProxyError);
    EXPECT_NE(ctx.proxyError().find("window 50"), std::string::npos) << ctx.proxyError();
    putThenFlush<<<1, 1>>>(ctx.deviceChannel(0), d.id(), 4090, s.id(), 64, status + 1);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(static_cast<Status>(status[1]), Status::kProxyError);
    std::vector<unsigned char> got(4096);
    GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, 4096, cudaMemcpyDeviceToHost));
    for (unsigned char b : got) ASSERT_EQ(b, 0) << "a rejected put wrote to the destination";
    EXPECT_GE(ctx.stats().errors, 2u);
    EXPECT_EQ(gdx::detail::contextImpl(ctx).proxy().deviceRing(0).error(), Status::kOk);
    // The signal array's window is the library's: a put into or out of it is refused in the kernel, as on the host
    // (the proxy would take it: the peer registered that window).
    putThenFlush<<<1, 1>>>(ctx.deviceChannel(0), kSignalWindowId, 0, s.id(), 8, status);
    putThenFlush<<<1, 1>>>(ctx.deviceChannel(0), d.id(), 0, kSignalWindowId, 8, status + 1);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(static_cast<Status>(status[0]), Status::kInvalidArgument);
    EXPECT_EQ(static_cast<Status>(status[1]), Status::kInvalidArgument);
    auto t0 = std::chrono::steady_clock::now();
    rejectedThenValid<<<1, 1>>>(ctx.deviceChannel(0), 50, d.id(), s.id(), 256, 3, status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(static_cast<Status>(status[0]), Status::kProxyError);
    EXPECT_EQ(static_cast<Status>(status[1]), Status::kOk) << ctx.proxyError();
    EXPECT_EQ(static_cast<Status>(status[2]), Status::kOk);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, 4096, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i < 256 ? 0x11 : 0) << "byte " << i;
  }
  cudaFree(src);
  cudaFree(dst);
  cudaFreeHost(status);
}

}  // namespace
}  // namespace gdx
