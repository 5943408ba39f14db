// ~Context with commands that kernels left in the device rings: what the proxy can still deliver is delivered
// within GDX_TIMEOUT_MS (every byte compared), and what it cannot is logged with counts per ring, peer and kind,
// never dropped without a word. Windows are declared before the Context so that only ~Context drains the rings
// (a Window's own destruction drains them too).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gpu_test_support.hpp"

namespace gdx {
namespace {

constexpr size_t kChunk = 64 << 10;

// Thread i puts chunk i with a signal; nobody flushes.
__global__ void unflushedPuts(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint32_t* status) {
  const uint64_t off = uint64_t(blockIdx.x * blockDim.x + threadIdx.x) * kChunk;
  const Status s = ch.putWithSignal(dstWin, off, srcWin, off, kChunk, 0, 1);
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// Reserves a ring position and never publishes it (a producer that stopped mid-command), then puts three commands
// behind it: the proxy takes commands in order, so none of them can be delivered.
__global__ void putsBehindAHole(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint32_t* status) {
  uint64_t hole = 0;
  Status s = ch.ring.reserve(1, &hole);
  for (int i = 0; i < 3 && s == Status::kOk; ++i) s = ch.put(dstWin, i * 64, srcWin, 0, 64);
  *status = static_cast<uint32_t>(s);
}

TEST(ContextClose, KernelPutsLeftUnflushedAreDeliveredByTheClosingContext) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  constexpr int kThreads = 128;
  constexpr size_t kBytes = kThreads * kChunk;
  std::vector<unsigned char> want(kBytes), got(kBytes);
  test::fillRandom(want.data(), kBytes, 42);
  void *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&src, kBytes));
  GDX_TEST_CUDA(cudaMalloc(&dst, kBytes));
  GDX_TEST_CUDA(cudaMemcpy(src, want.data(), kBytes, cudaMemcpyHostToDevice));
  GDX_TEST_CUDA(cudaMemset(dst, 0xEE, kBytes));
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 0;
  test::CapturedStderr log;
  {
    Window s, d;  // destroyed after the Context: only ~Context drains the rings
    std::optional<Context> ctx;
    ctx.emplace();
    s = ctx->registerWindow(src, kBytes, MemoryKind::kCuda);
    d = ctx->registerWindow(dst, kBytes, MemoryKind::kCuda);
    ChannelDeviceHandle ch = ctx->deviceChannel(0);
    ch.direct = nullptr;  // through the device ring and the proxy, the path this test is about
    unflushedPuts<<<kThreads / 32, 32>>>(ch, d.id(), s.id(), status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    ctx.reset();
  }
  const std::string text = log.restore();
  EXPECT_EQ(static_cast<Status>(*status), Status::kOk);
  EXPECT_EQ(text.find("did not complete"), std::string::npos) << text;
  GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, kBytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(test::firstMismatch(got.data(), want.data(), kBytes), -1);
  cudaFree(src);
  cudaFree(dst);
  cudaFreeHost(status);
}

TEST(ContextClose, KernelCommandsThatCannotBeDeliveredAreLoggedWithCounts) {
  GDX_SKIP_WITHOUT_GPU();
  test::soloJobEnv();
  setenv("GDX_TIMEOUT_MS", "1500", 1);
  void *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&src, 4096));
  GDX_TEST_CUDA(cudaMalloc(&dst, 4096));
  GDX_TEST_CUDA(cudaMemset(src, 0x11, 4096));
  GDX_TEST_CUDA(cudaMemset(dst, 0x00, 4096));
  uint32_t* status = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, sizeof(uint32_t), cudaHostAllocMapped));
  *status = 99;
  test::CapturedStderr log;
  double closeSeconds = 0;
  {
    Window s, d;
    std::optional<Context> ctx;
    ctx.emplace();
    unsetenv("GDX_TIMEOUT_MS");
    s = ctx->registerWindow(src, 4096, MemoryKind::kCuda);
    d = ctx->registerWindow(dst, 4096, MemoryKind::kCuda);
    ChannelDeviceHandle ch = ctx->deviceChannel(0);
    ch.direct = nullptr;
    putsBehindAHole<<<1, 1>>>(ch, d.id(), s.id(), status);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    ctx.reset();
    closeSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const std::string text = log.restore();
  EXPECT_EQ(static_cast<Status>(*status), Status::kOk);
  EXPECT_NE(text.find("closing the context: 4 command(s) on device ring 0 did not complete"), std::string::npos)
      << text;
  EXPECT_NE(text.find("to peer 0: 3 put"), std::string::npos) << text;
  EXPECT_NE(text.find("1 reserved by a producer but never published"), std::string::npos) << text;
  EXPECT_LT(closeSeconds, 10.0) << "closing must wait GDX_TIMEOUT_MS (1.5 s), not hang";
  std::vector<unsigned char> got(4096);
  GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, 4096, cudaMemcpyDeviceToHost));
  for (unsigned char b : got) ASSERT_EQ(b, 0) << "a command behind the hole was delivered";
  cudaFree(src);
  cudaFree(dst);
  cudaFreeHost(status);
}

}  // namespace
}  // namespace gdx
