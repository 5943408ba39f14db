// Relayed channels: data sent over the network (the proxy and TCP) to a relay rank is forwarded by the relay's
// PeerCopyQueue over NVLink into the destination GPU, then the destination's signal is raised. Three processes:
// rank 0 relays on GPU 0, rank 1 receives on GPU 1, rank 2 sends from GPU 1 with the direct path turned off (so
// everything it sends crosses the proxy and the transport, as from another host). Skipped without two peer GPUs.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "byte_pattern.cuh"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/error.hpp"
#include "gpu_test_support.hpp"
#include "spawn_ranks.hpp"

namespace gdx {
namespace {

constexpr int kRelay = 0, kDestination = 1, kSender = 2;
constexpr uint64_t kSeed = 300;
constexpr size_t kSrcBytes = 32u << 20;
constexpr size_t kSlot = 1u << 20;
constexpr int kHostPuts = 48;
constexpr size_t kBigPut = (20u << 20) + 5;  // more than one command carries (16 MiB): a chunked relayed put
constexpr size_t kDstBytes = kHostPuts * kSlot + kBigPut + 4096;
constexpr int kRounds = 200;
constexpr uint64_t kRoundBytes = 64 * 1024 + 3;

struct Piece {
  uint64_t src, dst, bytes;
};

// The host-API phase: random pieces (1 B .. 1 MiB, unaligned) into their own slots, then one big piece.
std::vector<Piece> hostPieces() {
  std::mt19937_64 rng(17);
  std::vector<Piece> p;
  for (int i = 0; i < kHostPuts; ++i) {
    const uint64_t bytes = i % 3 == 0 ? 1 + rng() % 64 : 1 + rng() % kSlot;
    p.push_back({rng() % (kSrcBytes - bytes), i * kSlot + rng() % (kSlot - bytes + 1), bytes});
  }
  p.push_back({7, kHostPuts * kSlot + 1, kBigPut});
  return p;
}

// The device-API phase: round r puts kRoundBytes from source offset r * kRoundBytes to a region of its own.
__host__ __device__ inline uint64_t roundOffset(int r) {
  return uint64_t(r) * kRoundBytes;
}

__global__ void relayedSender(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, uint32_t* status) {
  Status s = Status::kOk;
  for (int r = 0; r < kRounds && s == Status::kOk; ++r)
    s = ch.putWithSignalWarp(dstWin, roundOffset(r), srcWin, roundOffset(r), kRoundBytes, 1, 1);
  if (s == Status::kOk) s = ch.flushWarp();
  if (s == Status::kOk && threadIdx.x == 0) {
    // Not relayed: atomics.
    if (ch.atomicAdd(dstWin, 0, 1) != Status::kInvalidArgument) s = Status::kProxyError;
  }
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// Destination: waits for each round's signal, then checks the round's bytes; a signal seen before its data
// shows up as bad bytes.
__global__ void relayedReceiver(ChannelDeviceHandle ch, const unsigned char* dst, unsigned long long* bad,
                                uint32_t* status) {
  __shared__ int stop;
  for (int r = 0; r < kRounds; ++r) {
    if (threadIdx.x == 0) {
      Status s = ch.wait(1, r + 1);
      stop = s != Status::kOk;
      if (stop) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
    __syncthreads();
    if (stop) return;
    unsigned long long mine = 0;
    for (uint64_t j = threadIdx.x; j < kRoundBytes; j += blockDim.x)
      mine += dst[roundOffset(r) + j] != byteAt(kSeed, roundOffset(r) + j);
    if (mine) atomicAdd(bad, mine);
    __syncthreads();
  }
}

void childMain() {
  Context ctx;
  const int rank = ctx.rank();
  ASSERT_EQ(ctx.worldSize(), 3);
  unsigned char *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&src, kSrcBytes));
  GDX_TEST_CUDA(cudaMalloc(&dst, kDstBytes));
  fillKernel<<<264, 512>>>(src, kSrcBytes, kSeed);
  GDX_TEST_CUDA(cudaMemset(dst, 0xEE, kDstBytes));
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  uint32_t* status = nullptr;
  unsigned long long* bad = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, 16, cudaHostAllocMapped));
  GDX_TEST_CUDA(cudaHostAlloc(&bad, 8, cudaHostAllocMapped));
  status[0] = 0;
  *bad = 0;
  {
    Window s = ctx.registerWindow(src, kSrcBytes, MemoryKind::kCuda);
    Window d = ctx.registerWindow(dst, kDstBytes, MemoryKind::kCuda);
    if (rank == kRelay) EXPECT_TRUE(ctx.isDirect(kDestination));
    if (rank == kSender) EXPECT_FALSE(ctx.isDirect(kRelay)) << "the sender must go through the proxy";
    const std::vector<Piece> pieces = hostPieces();
    ctx.barrier();

    // Phase 1: host API, every byte checked at the destination, poison between the pieces included.
    if (rank == kSender) {
      Channel ch = ctx.relayChannel(kDestination, kRelay);
      EXPECT_EQ(ch.peer(), kRelay);
      EXPECT_EQ(ch.destination(), kDestination);
      for (size_t i = 0; i + 1 < pieces.size(); ++i)
        ch.putWithSignal(d, pieces[i].dst, s, pieces[i].src, pieces[i].bytes, 0, 1);
      ch.put(d, pieces.back().dst, s, pieces.back().src, pieces.back().bytes);  // forwarded without a signal
      ch.signal(0, 1);                                                          // ordered after it
      ch.flush();
      EXPECT_EQ(test::errorCodeOf([&] { ch.atomicAdd(d, 0, 1); }), ErrorCode::kInvalidArgument);
      EXPECT_EQ(test::errorCodeOf([&] { ctx.relayChannel(kDestination, kDestination); }), ErrorCode::kInvalidArgument);
      EXPECT_EQ(test::errorCodeOf([&] { ctx.relayChannel(kDestination, kSender); }), ErrorCode::kInvalidArgument);
      EXPECT_EQ(test::errorCodeOf([&] { ctx.relayChannel(7, kRelay); }), ErrorCode::kInvalidArgument);
      EXPECT_EQ(test::errorCodeOf([&] { ch.putWithSignal(d, kDstBytes - 8, s, 0, 16, 0, 1); }),
                ErrorCode::kInvalidArgument);
    }
    if (rank == kDestination) {
      ctx.wait(0, pieces.size());
      std::vector<unsigned char> got(kDstBytes), expect(kDstBytes, 0xEE), source(kSrcBytes);
      for (size_t i = 0; i < kSrcBytes; ++i) source[i] = byteAt(kSeed, i);
      for (const Piece& p : pieces) std::memcpy(&expect[p.dst], &source[p.src], p.bytes);
      GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, kDstBytes, cudaMemcpyDeviceToHost));
      const long long first = test::firstMismatch(got.data(), expect.data(), kDstBytes);
      EXPECT_EQ(first, -1) << "first differing byte at " << first;
      EXPECT_EQ(ctx.signalValue(0), pieces.size());
    }
    ctx.barrier();
    if (rank == kRelay) {
      ASSERT_NE(ctx.forwarder(), nullptr);
      EXPECT_GE(ctx.forwarder()->completed(), pieces.size() + 2);
    }

    // Phase 2: device API from a kernel, the destination checking each round as soon as its signal arrives.
    GDX_TEST_CUDA(cudaMemset(dst, 0xEE, kDstBytes));
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    ctx.barrier();
    if (rank == kDestination) {
      relayedReceiver<<<1, 512>>>(ctx.deviceChannel(kRelay), dst, bad, status);
    }
    if (rank == kSender) {
      ChannelDeviceHandle ch = ctx.deviceRelayChannel(kDestination, kRelay);
      EXPECT_EQ(ch.direct, nullptr);
      relayedSender<<<1, 32>>>(ch, d.id(), s.id(), status);
    }
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(status[0], 0u) << statusName(static_cast<Status>(status[0]));
    EXPECT_EQ(*bad, 0u) << "bytes read after their signal that were not the forwarded data";
    ctx.barrier();
  }
  cudaFree(src);
  cudaFree(dst);
  cudaFreeHost(status);
  cudaFreeHost(bad);
}

TEST(RelayChild, Run) {
  if (!std::getenv("GDX_RELAY_CHILD")) GTEST_SKIP() << "runs only as a child of Relay.* (GDX_RELAY_CHILD)";
  childMain();
}

TEST(Relay, NetworkDataIsForwardedOverNvlinkWithItsSignal) {
  GDX_SKIP_WITHOUT_TWO_PEER_GPUS();
  test::spawnRanks(3, "RelayChild.Run", "relay-test", [](int r) {
    std::vector<std::string> env{"GDX_RELAY_CHILD=1", "GDX_CUDA_DEVICE=" + std::to_string(r == kRelay ? 0 : 1)};
    if (r == kSender) env.push_back("GDX_DIRECT=0");
    return env;
  });
}

}  // namespace
}  // namespace gdx
