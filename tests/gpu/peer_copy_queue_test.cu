// PeerCopyQueue: the persistent peer-copy kernel fed through a host->device descriptor ring. Copies run from GPU 0
// into GPU 1 over NVLink where two peer GPUs are present, else within GPU 0 (the protocol is the same).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "byte_pattern.cuh"
#include "gdx/detail/atomic.hpp"
#include "gdx/detail/clock.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "gpu_test_support.hpp"

namespace gdx {
namespace {

// The destination GPU: 1 when GPU 0 can address it, else 0 itself.
int destinationDevice() {
  int n = 0, can = 0;
  cudaGetDeviceCount(&n);
  if (n >= 2) cudaDeviceCanAccessPeer(&can, 0, 1);
  cudaGetLastError();
  if (!can) return 0;
  cudaSetDevice(0);
  return enablePeerAccess(1) ? 1 : 0;
}

template <typename T>
T* deviceAlloc(int device, size_t count, int fill) {
  T* p = nullptr;
  cudaSetDevice(device);
  if (cudaMalloc(&p, count * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemset(p, fill, count * sizeof(T));
  cudaDeviceSynchronize();
  return p;
}

uint64_t readWord(const uint64_t* p) {
  uint64_t v = 0;
  cudaMemcpy(&v, p, 8, cudaMemcpyDeviceToHost);
  return v;
}

// Hundreds of transfers (0 B, a few bytes, kilobytes, megabytes; unaligned on both sides) through a queue only 64
// deep, so the ring wraps and submit waits for slots; every destination byte checked, poison between the slots
// included, and the signal counted exactly once per transfer.
TEST(PeerCopyQueue, RandomTransfersArriveIntactAndSignalOncePerTransfer) {
  GDX_SKIP_WITHOUT_GPU();
  const int dstDev = destinationDevice();
  constexpr size_t kSlot = 2u << 20, kTransfers = 300;
  const size_t srcBytes = 32u << 20, dstBytes = kSlot * kTransfers;
  auto* src = deviceAlloc<unsigned char>(0, srcBytes, 0);
  auto* dst = deviceAlloc<unsigned char>(dstDev, dstBytes, 0xEE);
  auto* signal = deviceAlloc<uint64_t>(dstDev, 1, 0);
  ASSERT_TRUE(src && dst && signal);
  cudaSetDevice(0);
  fillKernel<<<264, 512>>>(src, srcBytes, 21);
  std::vector<unsigned char> hostSrc(srcBytes), expect(dstBytes, 0xEE), got(dstBytes);
  GDX_TEST_CUDA(cudaMemcpy(hostSrc.data(), src, srcBytes, cudaMemcpyDeviceToHost));

  PeerCopyQueue::Options o;
  o.blocks = 8;
  o.capacity = 64;
  o.chunkBytes = 16 * 1024;
  PeerCopyQueue q(0, o);
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < kTransfers; ++i) {
    uint64_t bytes = i % 5 == 0 ? 0 : i % 5 == 1 ? 1 + rng() % 32 : i % 5 == 2 ? 1 + rng() % 70000 : 1 + rng() % kSlot;
    if (i == 3) bytes = kSlot;
    const uint64_t dOff = i * kSlot + rng() % (kSlot - bytes + 1), sOff = rng() % (srcBytes - bytes);
    EXPECT_EQ(q.submit(src + sOff, dst + dOff, bytes, signal, 1), i);
    std::memcpy(&expect[dOff], &hostSrc[sOff], bytes);
  }
  EXPECT_EQ(q.submitted(), kTransfers);
  q.waitCompleted(kTransfers);
  EXPECT_EQ(q.completed(), kTransfers);
  EXPECT_EQ(readWord(signal), kTransfers);
  GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, dstBytes, cudaMemcpyDeviceToHost));
  const long long bad = test::firstMismatch(got.data(), expect.data(), dstBytes);
  EXPECT_EQ(bad, -1) << "first differing byte in slot " << bad / static_cast<long long>(kSlot);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(signal);
}

// One transfer at each size from 1 B to 1 GiB, source and destination at offsets that agree modulo 16 and that do
// not; checked on the destination GPU, the guard bytes on both sides too.
TEST(PeerCopyQueue, SizesFromOneByteToOneGibibyte) {
  GDX_SKIP_WITHOUT_GPU();
  const int dstDev = destinationDevice();
  const size_t kMax = size_t{1} << 30, kPad = 4096;
  auto* src = deviceAlloc<unsigned char>(0, kMax + 2 * kPad, 0);
  auto* dst = deviceAlloc<unsigned char>(dstDev, kMax + 2 * kPad, 0xA5);
  auto* signal = deviceAlloc<uint64_t>(dstDev, 1, 0);
  ASSERT_TRUE(src && dst && signal) << "2 GiB of device memory";
  cudaSetDevice(0);
  fillKernel<<<264, 512>>>(src, kMax + 2 * kPad, 77);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  PeerCopyQueue q(0);
  uint64_t done = 0;
  for (uint64_t bytes : {uint64_t{1}, uint64_t{15}, uint64_t{4099}, (uint64_t{1} << 20) + 7, (uint64_t{64} << 20) + 1,
                         kMax - 32, kMax}) {
    for (uint64_t srcShift : {uint64_t{0}, uint64_t{5}}) {
      const uint64_t dOff = kPad + 3, sOff = kPad + 3 + srcShift;
      if (sOff + bytes > kMax + 2 * kPad || dOff + bytes > kMax + 2 * kPad) continue;
      cudaSetDevice(dstDev);
      GDX_TEST_CUDA(cudaMemset(dst, 0xA5, kMax + 2 * kPad));
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      q.submit(src + sOff, dst + dOff, bytes, signal, ++done, SignalOp::kSet);
      q.waitCompleted(done);
      EXPECT_EQ(readWord(signal), done);
      cudaSetDevice(dstDev);
      EXPECT_EQ(countBad(dst + dOff, bytes, 77, sOff), 0u) << bytes << " bytes, source shifted by " << srcShift;
      EXPECT_EQ(countNot(dst, dOff, 0xA5), 0u) << "guard before, " << bytes << " bytes";
      EXPECT_EQ(countNot(dst + dOff + bytes, kMax + 2 * kPad - dOff - bytes, 0xA5), 0u)
          << "guard after, " << bytes << " bytes";
    }
  }
  cudaFree(src);
  cudaFree(dst);
  cudaFree(signal);
}

struct Expected {
  uint64_t dstOff, srcOff, bytes;
};

// Runs on the destination GPU while the queue copies: for each transfer in order, waits (bounded) until the
// signal says it completed, then checks every byte of it. A signal seen before its data shows up as bad bytes.
__global__ void watchKernel(const uint64_t* signal, const unsigned char* dst, const Expected* e, int n, uint64_t seed,
                            unsigned long long* bad, unsigned long long* timedOut) {
  __shared__ int stop;
  for (int i = 0; i < n; ++i) {
    if (threadIdx.x == 0) {
      const uint64_t start = nowNs();
      while (atomicLoad(const_cast<uint64_t*>(signal), kAcquire) < uint64_t(i + 1) &&
             nowNs() - start < 10000000000ull) {
      }
      stop = atomicLoad(const_cast<uint64_t*>(signal), kAcquire) < uint64_t(i + 1);
      if (stop) *timedOut = i + 1;
    }
    __syncthreads();
    if (stop) return;
    unsigned long long mine = 0;
    for (uint64_t j = threadIdx.x; j < e[i].bytes; j += blockDim.x)
      mine += dst[e[i].dstOff + j] != byteAt(seed, e[i].srcOff + j);
    if (mine) atomicAdd(bad, mine);
    __syncthreads();
  }
}

TEST(PeerCopyQueue, SignalIsNeverSeenBeforeItsData) {
  GDX_SKIP_WITHOUT_GPU();
  const int dstDev = destinationDevice();
  constexpr int kTransfers = 1000;
  constexpr size_t kSlot = 256 * 1024;
  const size_t srcBytes = 16u << 20;
  auto* src = deviceAlloc<unsigned char>(0, srcBytes, 0);
  auto* dst = deviceAlloc<unsigned char>(dstDev, kSlot * kTransfers, 0);
  auto* signal = deviceAlloc<uint64_t>(dstDev, 1, 0);
  auto* expected = deviceAlloc<Expected>(dstDev, kTransfers, 0);
  ASSERT_TRUE(src && dst && signal && expected);
  cudaSetDevice(0);
  fillKernel<<<264, 512>>>(src, srcBytes, 99);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  std::mt19937_64 rng(8);
  std::vector<Expected> plan;
  for (int i = 0; i < kTransfers; ++i) {
    const uint64_t bytes = 1 + rng() % kSlot;
    plan.push_back({i * kSlot + rng() % (kSlot - bytes + 1), rng() % (srcBytes - bytes), bytes});
  }
  cudaSetDevice(dstDev);
  GDX_TEST_CUDA(cudaMemcpy(expected, plan.data(), sizeof(Expected) * plan.size(), cudaMemcpyHostToDevice));
  unsigned long long* counts = nullptr;  // bad bytes, timed-out transfer
  GDX_TEST_CUDA(cudaHostAlloc(&counts, 16, cudaHostAllocMapped | cudaHostAllocPortable));
  counts[0] = counts[1] = 0;
  cudaStream_t watch = nullptr;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&watch, cudaStreamNonBlocking));
  watchKernel<<<1, 512, 0, watch>>>(signal, dst, expected, kTransfers, 99, counts, counts + 1);
  GDX_TEST_CUDA(cudaGetLastError());
  {
    PeerCopyQueue::Options o;
    o.blocks = 32;
    o.capacity = 128;
    o.chunkBytes = 32 * 1024;
    PeerCopyQueue q(0, o);
    for (const Expected& e : plan) q.submit(src + e.srcOff, dst + e.dstOff, e.bytes, signal, 1);
    q.waitCompleted(kTransfers);
  }
  GDX_TEST_CUDA(cudaStreamSynchronize(watch));
  EXPECT_EQ(counts[1], 0u) << "the watcher gave up waiting for transfer " << counts[1];
  EXPECT_EQ(counts[0], 0u) << "bytes read after their signal that were not yet the transfer's data";
  cudaStreamDestroy(watch);
  cudaFreeHost(counts);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(signal);
  cudaFree(expected);
}

// The kernel leaves when idle (a cudaDeviceSynchronize returns) and comes back on the next submit.
TEST(PeerCopyQueue, LeavesWhenIdleAndComesBack) {
  GDX_SKIP_WITHOUT_GPU();
  const int dstDev = destinationDevice();
  auto* src = deviceAlloc<unsigned char>(0, 4096, 0x11);
  auto* dst = deviceAlloc<unsigned char>(dstDev, 4096, 0);
  auto* signal = deviceAlloc<uint64_t>(dstDev, 1, 0);
  ASSERT_TRUE(src && dst && signal);
  PeerCopyQueue::Options o = PeerCopyQueue::Options::fromEnv();
  o.idleNs = 2 * 1000 * 1000;
  PeerCopyQueue q(0, o);
  for (int round = 1; round <= 3; ++round) {
    q.submit(src, dst, 4096, signal, 1);
    EXPECT_TRUE(q.running());
    q.waitCompleted(round);
    const uint64_t start = nowNs();
    while (q.running() && nowNs() - start < 2000000000ull) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_FALSE(q.running()) << "still running 2 s after the last transfer, round " << round;
    cudaSetDevice(0);
    GDX_TEST_CUDA(cudaDeviceSynchronize());
  }
  EXPECT_EQ(readWord(signal), 3u);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(signal);
}

TEST(PeerCopyQueue, RejectsBadInput) {
  GDX_SKIP_WITHOUT_GPU();
  auto* buf = deviceAlloc<uint64_t>(0, 4, 0);
  ASSERT_NE(buf, nullptr);
  PeerCopyQueue q(0);
  EXPECT_EQ(test::errorCodeOf([&] { q.submit(nullptr, buf, 8); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::errorCodeOf([&] { q.submit(buf, nullptr, 8); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::errorCodeOf(
                [&] { q.submit(buf, buf + 1, 8, reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(buf) + 4), 1); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(q.submitted(), 0u) << "rejected transfers must not take a ticket";
  PeerCopyQueue::Options bad;
  bad.chunkBytes = 1000;
  EXPECT_EQ(test::errorCodeOf([&] { PeerCopyQueue r(0, bad); }), ErrorCode::kInvalidArgument);
  // A signal-only transfer (0 bytes) still raises its signal.
  q.submit(nullptr, nullptr, 0, buf + 2, 42, SignalOp::kSet);
  q.waitCompleted(1);
  EXPECT_EQ(readWord(buf + 2), 42u);
  cudaFree(buf);
}

}  // namespace
}  // namespace gdx
