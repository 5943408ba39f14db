// Destroying a GPU window fences the direct path: two processes on the same host (one GPU or two) map each other's
// windows through CUDA IPC, and a Window's destruction returns only once every rank unmapped it. The memory freed
// after it and a new allocation at the same address then receive the peer's next stores (a mapping kept by address
// would send them to the old allocation); windows destroyed in another order on each rank are reported by name
// instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gpu_test_support.hpp"
#include "spawn_ranks.hpp"

namespace gdx {
namespace {

constexpr size_t kBytes = 1 << 20;
constexpr uint32_t kSignal = 0;

// Puts this rank's source to the peer's window with the round as signal, then waits for the peer's put to here.
__global__ void exchangeRound(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint64_t round,
                              uint32_t* status) {
  Status s = ch.putWithSignalBlock(dstWin, 0, srcWin, 0, kBytes, kSignal, round, SignalOp::kSet);
  if (threadIdx.x == 0) {
    if (s == Status::kOk) s = ch.flush();
    if (s == Status::kOk) s = ch.wait(kSignal, round);
    if (s != Status::kOk) *status = static_cast<uint32_t>(s);
  }
}

uint64_t seedOf(int rank, uint64_t round) {
  return 1000 * round + rank;
}

void upload(void* dst, uint64_t seed) {
  std::vector<unsigned char> h(kBytes);
  test::fillRandom(h.data(), kBytes, seed);
  ASSERT_EQ(cudaMemcpy(dst, h.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // from pageable memory the copy returns before it landed
}

/// -1 when the kBytes at `dst` are fillRandom(seed)'s, else the first byte that differs.
long long mismatch(const void* dst, uint64_t seed) {
  std::vector<unsigned char> got(kBytes), want(kBytes);
  if (cudaMemcpy(got.data(), dst, kBytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  test::fillRandom(want.data(), kBytes, seed);
  return test::firstMismatch(got.data(), want.data(), kBytes);
}

// Both ranks put to each other's window `dst` from their window `src` (filled for `round` first) and check what the
// peer put into `mine`.
void exchange(Context& ctx, const Window& dst, const Window& src, void* srcMemory, void* mine, uint64_t round,
              const char* what) {
  const int me = ctx.rank(), peer = 1 - me;
  upload(srcMemory, seedOf(me, round));
  ctx.barrier();
  uint32_t* status = nullptr;
  ASSERT_EQ(cudaHostAlloc(&status, 4, cudaHostAllocMapped), cudaSuccess);
  *status = 0;
  exchangeRound<<<1, 256>>>(ctx.deviceChannel(peer), dst.id(), src.id(), round, status);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(static_cast<Status>(*status), Status::kOk) << what << ": " << statusName(static_cast<Status>(*status));
  cudaFreeHost(status);
  EXPECT_EQ(mismatch(mine, seedOf(peer, round)), -1)
      << what << ": rank " << me << " did not get rank " << peer << "'s bytes of round " << round;
  ctx.barrier();
}

void childMain() {
  Context ctx;
  const int me = ctx.rank(), peer = 1 - me;
  ASSERT_EQ(ctx.worldSize(), 2);
  ASSERT_NE(ctx.deviceChannel(peer).direct, nullptr) << "the two ranks do not reach each other directly";
  void* src = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  Window srcWindow = ctx.registerWindow(src, kBytes, MemoryKind::kCuda, "source");

  // Round 1: one allocation holding two windows, so that the peer's mapping of it serves both.
  void* first = nullptr;
  ASSERT_EQ(cudaMalloc(&first, 2 * kBytes), cudaSuccess);
  uint32_t firstId = 0;
  {
    Window a = ctx.registerWindow(first, kBytes, MemoryKind::kCuda, "first half");
    Window b = ctx.registerWindow(static_cast<char*>(first) + kBytes, kBytes, MemoryKind::kCuda, "second half");
    firstId = a.id();
    EXPECT_NE(a.peerData(peer), nullptr) << "the peer's window is not mapped here";
    exchange(ctx, a, srcWindow, src, first, 1, "round 1");
    // Destroyed in the same order on both ranks; rank 1 comes a second late, and rank 0's destructor must wait for
    // it: until then rank 1 still maps rank 0's allocation, which rank 0 frees right after.
    if (me == 1) std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto t0 = std::chrono::steady_clock::now();
    b = Window();
    a = Window();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (me == 0) EXPECT_GE(waited, 0.8) << "rank 0's windows were destroyed before rank 1 unmapped them";
  }
  ASSERT_EQ(cudaFree(first), cudaSuccess);

  // Round 2: a new allocation of the same size, usually at the same address, registered under the freed id.
  void* second = nullptr;
  ASSERT_EQ(cudaMalloc(&second, 2 * kBytes), cudaSuccess);
  std::printf("rank %d: the second allocation is %s the first\n", me, second == first ? "at the address of" : "not at");
  {
    Window a = ctx.registerWindow(second, kBytes, MemoryKind::kCuda, "again");
    EXPECT_EQ(a.id(), firstId);
    exchange(ctx, a, srcWindow, src, second, 2, "round 2, a new allocation under the old id");
  }
  ASSERT_EQ(cudaFree(second), cudaSuccess);

  // Windows destroyed in another order on each rank: both destructors return with the mismatch logged.
  void* third = nullptr;
  ASSERT_EQ(cudaMalloc(&third, 2 * kBytes), cudaSuccess);
  {
    test::CapturedStderr log;
    const auto t0 = std::chrono::steady_clock::now();
    {
      Window x = ctx.registerWindow(third, kBytes, MemoryKind::kCuda, "x");
      Window y = ctx.registerWindow(static_cast<char*>(third) + kBytes, kBytes, MemoryKind::kCuda, "y");
      if (me == 0) {
        Window gone = std::move(x);  // x first, then y (at the end of the scope)
      } else {
        Window gone = std::move(y);
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string text = log.restore();
    EXPECT_NE(text.find("same order on every rank"), std::string::npos) << text;
    EXPECT_LT(s, 8.0) << "destroying windows in another order took " << s << " s";
  }
  cudaFree(third);
  srcWindow = Window();  // destroyed (collectively) before its memory is freed
  cudaFree(src);
}

TEST(WindowFenceChild, Run) {
  if (!std::getenv("GDX_WINDOW_FENCE_CHILD")) GTEST_SKIP() << "runs only as a child of WindowFence.*";
  childMain();
  std::fflush(stdout);
}

TEST(WindowFence, DestroyedGpuWindowsAreUnmappedByEveryPeerBeforeTheMemoryIsFreed) {
  GDX_SKIP_WITHOUT_GPU();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  test::spawnRanks(2, "WindowFenceChild.Run", "window-fence-test", [&](int r) {
    return std::vector<std::string>{"GDX_CUDA_DEVICE=" + std::to_string(r % gpus), "GDX_WINDOW_FENCE_CHILD=1",
                                    "GDX_TIMEOUT_MS=5000", "GDX_LOG_LEVEL=WARN"};
  });
}

}  // namespace
}  // namespace gdx
