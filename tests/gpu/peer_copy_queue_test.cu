// PeerCopyQueue: the persistent peer-copy kernel fed through a host->device descriptor ring. Copies run from GPU 0
// into GPU 1 over NVLink where two peer GPUs are present, else within GPU 0 (the protocol is the same).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "byte_pattern.cuh"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
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
  {
    PeerCopyQueue::Options o;
    o.blocks = 32;
    o.capacity = 128;
    o.chunkBytes = 32 * 1024;
    // Made (and its kernel loaded) before the watcher runs: loading a kernel may wait for the kernels running on
    // the device, and on one GPU the watcher runs there until the queue's transfers arrive.
    PeerCopyQueue q(0, o);
    watchKernel<<<1, 512, 0, watch>>>(signal, dst, expected, kTransfers, 99, counts, counts + 1);
    GDX_TEST_CUDA(cudaGetLastError());
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

// Runs on the destination GPU while the queue copies transfers whose signal is one word set (kSet) to i + 1 by
// transfer i: the value it reads must never go down (a later transfer's kSet landing before an earlier one's would
// make it), and every transfer below the value read must already be intact (every byte compared).
__global__ void watchInOrderKernel(const uint64_t* signal, const unsigned char* dst, const Expected* e, int n,
                                   uint64_t seed, unsigned long long* counts) {  // bad bytes, regressions, timed out
  __shared__ uint64_t seen, from;
  if (threadIdx.x == 0) seen = 0;
  __syncthreads();
  const uint64_t start = nowNs();
  while (seen < uint64_t(n)) {
    if (threadIdx.x == 0) {
      from = seen;
      const uint64_t v = atomicLoad(const_cast<uint64_t*>(signal), kAcquire);
      if (v < seen) atomicAdd(counts + 1, 1ull);
      if (v > seen) seen = v;
      if (nowNs() - start > 20000000000ull) {  // give up: report the first transfer never seen, check nothing more
        counts[2] = seen + 1;
        from = seen = n;
      }
    }
    __syncthreads();
    unsigned long long mine = 0;
    for (uint64_t i = from; i < seen && i < uint64_t(n); ++i)
      for (uint64_t j = threadIdx.x; j < e[i].bytes; j += blockDim.x)
        mine += dst[e[i].dstOff + j] != byteAt(seed, e[i].srcOff + j);
    if (mine) atomicAdd(counts, mine);
    __syncthreads();
  }
}

// What a plan of transfers (into kSlot-sized slots of dst, poisoned with 0xEE) should leave in dst.
struct Plan {
  std::vector<Expected> transfers;
  size_t slot;
};
Plan makePlan(std::mt19937_64& rng, int n, size_t slot, size_t srcBytes, uint64_t (*size)(std::mt19937_64&, int)) {
  Plan p{{}, slot};
  for (int i = 0; i < n; ++i) {
    const uint64_t bytes = std::min<uint64_t>(size(rng, i), slot);
    p.transfers.push_back({i * slot + rng() % (slot - bytes + 1), rng() % (srcBytes - bytes), bytes});
  }
  return p;
}

// Copies `plan` through `q` with a kSet signal (i + 1 for transfer i) while watchInOrderKernel checks the order on
// the destination, then compares every byte of dst, poison included, on the host.
// `gapNs`: a pause after each submit, so that the poller finds each transfer alone.
void runWatched(PeerCopyQueue& q, const Plan& plan, const unsigned char* src, unsigned char* dst, int dstDev,
                const std::vector<unsigned char>& hostSrc, uint64_t seed, bool oneAtATime, const std::string& what,
                uint64_t gapNs = 0) {
  const int n = static_cast<int>(plan.transfers.size());
  const size_t dstBytes = plan.slot * n;
  auto* signal = deviceAlloc<uint64_t>(dstDev, 1, 0);
  auto* expected = deviceAlloc<Expected>(dstDev, n, 0);
  ASSERT_TRUE(signal && expected);
  cudaSetDevice(dstDev);
  GDX_TEST_CUDA(cudaMemset(dst, 0xEE, dstBytes));
  GDX_TEST_CUDA(cudaMemcpy(expected, plan.transfers.data(), sizeof(Expected) * n, cudaMemcpyHostToDevice));
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  unsigned long long* counts = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&counts, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  counts[0] = counts[1] = counts[2] = 0;
  cudaStream_t watch = nullptr;
  GDX_TEST_CUDA(cudaStreamCreateWithFlags(&watch, cudaStreamNonBlocking));
  watchInOrderKernel<<<1, 512, 0, watch>>>(signal, dst, expected, n, seed, counts);
  GDX_TEST_CUDA(cudaGetLastError());
  const uint64_t base = q.submitted();
  std::vector<unsigned char> expect(dstBytes, 0xEE), got(dstBytes);
  for (int i = 0; i < n; ++i) {
    const Expected& e = plan.transfers[i];
    q.submit(src + e.srcOff, dst + e.dstOff, e.bytes, signal, i + 1, SignalOp::kSet);
    if (oneAtATime) q.waitCompleted(base + i + 1);
    for (const uint64_t t0 = nowNs(); nowNs() - t0 < gapNs;) {
    }
    std::memcpy(&expect[e.dstOff], &hostSrc[e.srcOff], e.bytes);
  }
  q.waitCompleted(base + n);
  GDX_TEST_CUDA(cudaStreamSynchronize(watch));
  EXPECT_EQ(counts[2], 0u) << what << ": the destination's watcher gave up waiting, transfer " << counts[2] - 1
                           << " never became visible";
  EXPECT_EQ(counts[1], 0u) << what << ": the kSet signal went down " << counts[1]
                           << " times: a later transfer's signal was raised before an earlier one's";
  EXPECT_EQ(counts[0], 0u) << what << ": bytes seen on the destination after their transfer's signal that were not "
                           << "the transfer's data yet (signal before data)";
  EXPECT_EQ(readWord(signal), uint64_t(n)) << what << ": final value of the kSet signal (the last transfer's)";
  GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, dstBytes, cudaMemcpyDeviceToHost));
  const long long bad = test::firstMismatch(got.data(), expect.data(), dstBytes);
  EXPECT_EQ(bad, -1) << what << ": first wrong byte of dst at " << bad << " (transfer slot "
                     << bad / static_cast<long long>(plan.slot) << "; 0xEE poison outside the transfers must stay)";
  cudaStreamDestroy(watch);
  cudaFreeHost(counts);
  cudaFree(signal);
  cudaFree(expected);
}

struct Buffers {
  unsigned char* src = nullptr;
  unsigned char* dst = nullptr;
  std::vector<unsigned char> hostSrc;
  int dstDev = 0;
  Buffers(size_t srcBytes, size_t dstBytes, uint64_t seed) : hostSrc(srcBytes) {
    dstDev = destinationDevice();
    src = deviceAlloc<unsigned char>(0, srcBytes, 0);
    dst = deviceAlloc<unsigned char>(dstDev, dstBytes, 0);
    if (!src || !dst) return;
    cudaSetDevice(0);
    fillKernel<<<264, 512>>>(src, srcBytes, seed);
    cudaMemcpy(hostSrc.data(), src, srcBytes, cudaMemcpyDeviceToHost);
  }
  ~Buffers() {
    cudaFree(src);
    cudaFree(dst);
  }
};

// Thousands of small transfers (0 B to 16 KiB, unaligned) submitted back to back are batched several to a unit of
// work; their kSet signals must still land in ticket order and never before their data.
TEST(PeerCopyQueue, BatchedSmallTransfersSignalInTicketOrder) {
  GDX_SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 4000;
  constexpr size_t kSlot = 16 * 1024, kSrc = 8u << 20;
  Buffers b(kSrc, kSlot * kTransfers, 31);
  ASSERT_TRUE(b.src && b.dst);
  std::mt19937_64 rng(12);
  const Plan plan = makePlan(rng, kTransfers, kSlot, kSrc, [](std::mt19937_64& r, int i) -> uint64_t {
    return i % 7 == 0 ? 0 : i % 7 == 1 ? 1 + r() % 16 : 1 + r() % (16 * 1024);
  });
  PeerCopyQueue::Options o;
  o.blocks = 16;
  o.capacity = 256;
  PeerCopyQueue q(0, o);
  runWatched(q, plan, b.src, b.dst, b.dstDev, b.hostSrc, 31, false, "batched small transfers");
}

// The cut of a transfer depends on the number of copy blocks (at most one chunk per block, each at least the
// minimum chunk): every count from 1 block to all that fit copies a mix of sizes intact, in order.
TEST(PeerCopyQueue, EveryBlockCountCopiesEveryByte) {
  GDX_SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 60;
  constexpr size_t kSlot = 12u << 20, kSrc = 32u << 20;
  Buffers b(kSrc, kSlot * kTransfers, 47);
  ASSERT_TRUE(b.src && b.dst);
  for (unsigned blocks : {1u, 2u, 16u, 66u, 132u, 1024u}) {
    std::mt19937_64 rng(blocks);
    const Plan plan = makePlan(rng, kTransfers, kSlot, kSrc, [](std::mt19937_64& r, int i) -> uint64_t {
      const uint64_t sizes[] = {0, 1, 4096, 100 * 1024 + 3, (1u << 20) + 7, (9u << 20) + 5, 1 + r() % (12u << 20)};
      return sizes[i % 7];
    });
    PeerCopyQueue::Options o;
    o.blocks = blocks;  // 1024 is capped to what is resident
    o.capacity = 32;
    o.chunkBytes = 64 * 1024;
    PeerCopyQueue q(0, o);
    runWatched(q, plan, b.src, b.dst, b.dstDev, b.hostSrc, 47, false,
               std::to_string(blocks) + " copy blocks (" + std::to_string(q.options().blocks) + " resident)");
  }
}

// One transfer at a time, each waited for before the next: the block that completes a transfer finds every earlier
// one signalled and raises the signal itself (no hand-off to the signaller); data still comes first.
TEST(PeerCopyQueue, OneAtATimeSignalsAfterTheData) {
  GDX_SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 300;
  constexpr size_t kSlot = 3u << 20, kSrc = 16u << 20;
  Buffers b(kSrc, kSlot * kTransfers, 58);
  ASSERT_TRUE(b.src && b.dst);
  std::mt19937_64 rng(3);
  const Plan plan = makePlan(rng, kTransfers, kSlot, kSrc, [](std::mt19937_64& r, int i) -> uint64_t {
    return i % 3 == 0 ? 1 + r() % 4096 : i % 3 == 1 ? 4096 : 1 + r() % (3u << 20);
  });
  PeerCopyQueue q(0);
  runWatched(q, plan, b.src, b.dst, b.dstDev, b.hostSrc, 58, true, "one transfer at a time");
}

// Small transfers submitted one by one while a large one is still being copied: the poller finds each alone but
// must not copy it itself (copy_queue_layout.hpp), since its signal would overtake the large one's; the small ones
// submitted once the large one is done are copied by the poller. Order and data hold either way.
TEST(PeerCopyQueue, LoneSmallTransfersBehindALargeOneKeepTheOrder) {
  GDX_SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 48;
  constexpr size_t kSlot = 24u << 20, kSrc = 32u << 20;
  Buffers b(kSrc, kSlot * kTransfers, 73);
  ASSERT_TRUE(b.src && b.dst);
  std::mt19937_64 rng(5);
  const Plan plan = makePlan(rng, kTransfers, kSlot, kSrc, [](std::mt19937_64& r, int i) -> uint64_t {
    return i % 4 == 0 ? (20u << 20) + r() % 4096 : 1 + r() % (8 * 1024);
  });
  PeerCopyQueue::Options o;
  o.blocks = 8;  // a 20 MiB copy takes tens of microseconds, longer than the gaps below
  PeerCopyQueue q(0, o);
  runWatched(q, plan, b.src, b.dst, b.dstDev, b.hostSrc, 73, false, "lone small transfers behind large ones",
             /*gapNs=*/5000);
}

// After the kernel left (idle) and came back, units and counters start afresh: mixed transfers still arrive intact.
TEST(PeerCopyQueue, RelaunchedKernelStartsAfresh) {
  GDX_SKIP_WITHOUT_GPU();
  constexpr int kTransfers = 40;
  constexpr size_t kSlot = 2u << 20, kSrc = 8u << 20;
  Buffers b(kSrc, kSlot * kTransfers, 64);
  ASSERT_TRUE(b.src && b.dst);
  PeerCopyQueue::Options o = PeerCopyQueue::Options::fromEnv();
  o.idleNs = 1000 * 1000;
  o.capacity = 16;
  PeerCopyQueue q(0, o);
  for (int round = 0; round < 3; ++round) {
    std::mt19937_64 rng(round);
    const Plan plan = makePlan(rng, kTransfers, kSlot, kSrc, [](std::mt19937_64& r, int i) -> uint64_t {
      return i % 2 ? 1 + r() % 8192 : 1 + r() % (2u << 20);
    });
    runWatched(q, plan, b.src, b.dst, b.dstDev, b.hostSrc, 64, false, "round " + std::to_string(round));
    const uint64_t start = nowNs();
    while (q.running() && nowNs() - start < 2000000000ull) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_FALSE(q.running()) << "the kernel should have left after 1 ms idle, round " << round;
  }
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
