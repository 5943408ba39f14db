// The proxied command path under many producers: every warp of many blocks takes a device ring by its index, cuts
// each 4 KiB slot into eight consecutive puts (which the proxy merges into one write) and then signals; a second
// kernel, running at the same time, waits for each signal and compares the slot with its source at once. So a
// signal seen before the data of the puts it announces — merged or not, on any ring — fails the test.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gpu_test_support.hpp"

namespace gdx {
namespace {

constexpr int kBlocks = 64, kThreads = 128, kWarps = kBlocks * kThreads / 32, kRounds = 16;
constexpr uint64_t kSlot = 4096, kPiece = kSlot / 8;

__global__ void sendSlots(const ChannelDeviceHandle* rings, int numRings, uint32_t dst, uint32_t src,
                          uint32_t* status) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
  ChannelDeviceHandle ch = rings[warp % numRings];  // a copy per thread: it tracks what to flush
  Status s = Status::kOk;
  for (int r = 0; r < kRounds && s == Status::kOk; ++r) {
    const uint64_t slot = (uint64_t(warp) * kRounds + r) * kSlot;
    // Lanes 0..7 reserve together, in lane order: eight consecutive puts that continue each other.
    if (lane < 8) s = ch.put(dst, slot + lane * kPiece, src, slot + lane * kPiece, kPiece);
    __syncwarp();
    if (lane == 0 && s == Status::kOk) s = ch.signal(warp, 1);
    const unsigned failed = __ballot_sync(~0u, s != Status::kOk);  // the warp leaves together, with the first error
    if (failed) s = static_cast<Status>(__shfl_sync(~0u, static_cast<uint32_t>(s), __ffs(failed) - 1));
  }
  if (s == Status::kOk) s = ch.flushWarp();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// kCheckers warps, each watching kWarps / kCheckers sender warps: waits for round r's signal of each, then compares
// that slot word by word with its source. Few pollers, since every poll of a proxied signal is a PCIe read.
constexpr int kCheckers = 16;

__global__ void checkSlots(ChannelDeviceHandle ch, const uint64_t* dst, const uint64_t* src,
                           unsigned long long* mismatches, uint32_t* status) {
  const int checker = threadIdx.x / 32, lane = threadIdx.x & 31;
  for (int r = 0; r < kRounds; ++r)
    for (int warp = checker; warp < kWarps; warp += kCheckers) {
      const Status s = ch.waitWarp(warp, r + 1);
      if (s != Status::kOk) {
        if (lane == 0) atomicCAS(status, 0u, static_cast<uint32_t>(s));
        return;
      }
      const uint64_t first = (uint64_t(warp) * kRounds + r) * kSlot / 8;
      for (uint64_t i = lane; i < kSlot / 8; i += 32)
        if (atomicLoad(&dst[first + i], kRelaxed) != src[first + i]) atomicAdd(mismatches, 1ull);
    }
}

TEST(CommandPath, MergedPutsFromWarpsOnEveryRingAreInPlaceWhenTheirSignalIsSeen) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_DIRECT", "0", 1);  // the proxy path, even to this GPU
  ContextOptions options = ContextOptions::fromEnv();
  options.proxy.threads = 4;
  options.proxy.deviceRingsPerThread = 1;
  Context ctx(options);
  unsetenv("GDX_DIRECT");
  const size_t bytes = size_t(kWarps) * kRounds * kSlot;
  std::vector<unsigned char> hostSrc(bytes);
  test::fillRandom(hostSrc.data(), bytes, 2026);
  // Host-mapped windows: the transport moves host memory, and both kernels read it directly.
  void *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&src, bytes, cudaHostAllocMapped));
  GDX_TEST_CUDA(cudaHostAlloc(&dst, bytes, cudaHostAllocMapped));
  std::memcpy(src, hostSrc.data(), bytes);
  std::memset(dst, 0xEE, bytes);
  {
    Window s = ctx.registerWindow(src, bytes, MemoryKind::kHost);
    Window d = ctx.registerWindow(dst, bytes, MemoryKind::kHost);
    const int numRings = ctx.numDeviceRings();
    ASSERT_EQ(numRings, 4);
    std::vector<ChannelDeviceHandle> handles;
    for (int r = 0; r < numRings; ++r) handles.push_back(ctx.deviceChannel(0, r));
    ChannelDeviceHandle* devHandles = nullptr;
    uint32_t* status = nullptr;
    unsigned long long* mismatches = nullptr;
    GDX_TEST_CUDA(cudaMalloc(&devHandles, handles.size() * sizeof(ChannelDeviceHandle)));
    GDX_TEST_CUDA(
        cudaMemcpy(devHandles, handles.data(), handles.size() * sizeof(ChannelDeviceHandle), cudaMemcpyHostToDevice));
    GDX_TEST_CUDA(cudaHostAlloc(&status, 2 * sizeof(uint32_t), cudaHostAllocMapped));
    GDX_TEST_CUDA(cudaHostAlloc(&mismatches, sizeof(unsigned long long), cudaHostAllocMapped));
    status[0] = status[1] = 0;
    *mismatches = 0;
    cudaStream_t checker, sender;
    GDX_TEST_CUDA(cudaStreamCreateWithFlags(&checker, cudaStreamNonBlocking));
    GDX_TEST_CUDA(cudaStreamCreateWithFlags(&sender, cudaStreamNonBlocking));
    // Both kernels loaded before either runs: with lazy loading, the sender's first launch could otherwise wait for
    // the checker, which waits for the sender.
    cudaFuncAttributes attributes;
    GDX_TEST_CUDA(cudaFuncGetAttributes(&attributes, checkSlots));
    GDX_TEST_CUDA(cudaFuncGetAttributes(&attributes, sendSlots));
    checkSlots<<<1, kCheckers * 32, 0, checker>>>(ctx.deviceChannel(0), static_cast<const uint64_t*>(dst),
                                                  static_cast<const uint64_t*>(src), mismatches, status + 1);
    sendSlots<<<kBlocks, kThreads, 0, sender>>>(devHandles, numRings, d.id(), s.id(), status);
    GDX_TEST_CUDA(cudaStreamSynchronize(sender));
    GDX_TEST_CUDA(cudaStreamSynchronize(checker));
    const ProxyCounters c = ctx.stats();
    EXPECT_EQ(status[0], 0u) << "sender: " << statusName(Status(status[0])) << "; the proxy took " << c.commands
                             << " of " << kWarps * kRounds * 9 << " commands in " << c.batches << " polls (" << c.writes
                             << " writes, " << c.errors << " errors); proxy: " << ctx.proxyError();
    EXPECT_EQ(status[1], 0u) << "checker: " << statusName(Status(status[1]));
    EXPECT_EQ(*mismatches, 0ull) << "8-byte words not yet in place when their slot's signal was seen";
    const long long bad = test::firstMismatch(static_cast<const unsigned char*>(dst), hostSrc.data(), bytes);
    EXPECT_EQ(bad, -1) << "first differing byte " << bad << " (slot " << bad / static_cast<long long>(kSlot) << ")";
    EXPECT_LT(c.writes, uint64_t(kWarps) * kRounds * 8) << "no consecutive puts were merged";
    cudaStreamDestroy(checker);
    cudaStreamDestroy(sender);
    cudaFree(devHandles);
    cudaFreeHost(status);
    cudaFreeHost(mismatches);
  }
  cudaFreeHost(src);
  cudaFreeHost(dst);
}

}  // namespace
}  // namespace gdx
