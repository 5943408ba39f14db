// Same-host GPUs over NVLink: the batched peer-copy kernel (one process driving both GPUs) and the direct path
// of the device API between two processes on two GPUs (the test re-executes itself, one process a GPU:
// CUDA does not survive fork). Skipped where fewer than two GPUs that can address each other are present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "byte_pattern.cuh"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/peer_copy.hpp"
#include "gpu_test_support.hpp"
#include "spawn_ranks.hpp"

namespace gdx {
namespace {

// ---- peer copy --------------------------------------------------------------------------------------------

// Many descriptors at once, random sizes from 1 B to 4 MiB, random (unaligned) offsets on both sides, into
// disjoint slots of a poisoned destination on the other GPU; every destination byte checked, poison included.
TEST(PeerCopy, ManyRandomUnalignedDescriptorsArriveIntact) {
  GDX_SKIP_WITHOUT_TWO_PEER_GPUS();
  constexpr size_t kSlot = 4u << 20, kDescs = 200;
  const size_t srcBytes = 64u << 20, dstBytes = kSlot * kDescs;
  unsigned char *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaSetDevice(1));
  GDX_TEST_CUDA(cudaMalloc(&dst, dstBytes));
  GDX_TEST_CUDA(cudaMemset(dst, 0xEE, dstBytes));
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  GDX_TEST_CUDA(cudaSetDevice(0));
  ASSERT_TRUE(enablePeerAccess(1));
  GDX_TEST_CUDA(cudaMalloc(&src, srcBytes));
  fillKernel<<<264, 512>>>(src, srcBytes, 11);
  std::vector<unsigned char> hostSrc(srcBytes), expect(dstBytes, 0xEE), got(dstBytes);
  GDX_TEST_CUDA(cudaMemcpy(hostSrc.data(), src, srcBytes, cudaMemcpyDeviceToHost));
  std::mt19937_64 rng(3);
  std::vector<PeerCopyDesc> descs;
  for (size_t i = 0; i < kDescs; ++i) {
    // Sizes spread over every scale: 1 B, tens, thousands, up to 4 MiB.
    uint64_t bytes = i % 4 == 0 ? 1 + rng() % 64 : i % 4 == 1 ? 1 + rng() % 8192 : 1 + rng() % (kSlot - 64);
    if (i == 0) bytes = 1;
    if (i == 1) bytes = kSlot;
    uint64_t dOff = i * kSlot + rng() % (kSlot - bytes + 1), sOff = rng() % (srcBytes - bytes);
    descs.push_back({src + sOff, dst + dOff, bytes});
    std::memcpy(&expect[dOff], &hostSrc[sOff], bytes);
  }
  // Modes: 0 the SM kernel, 1 TMA bulk copies, 2 descriptors from 1 MiB on to the copy engines (mixed batch).
  for (int mode : {0, 1, 2}) {
    const bool bulk = mode == 1;
    GDX_TEST_CUDA(cudaMemset(dst, 0xEE, dstBytes));
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    PeerCopyOptions o;
    o.bulk = bulk;
    o.copyEngineFrom = mode == 2 ? (uint64_t{1} << 20) : 0;
    GDX_TEST_CUDA(peerCopy(descs.data(), descs.size(), nullptr, o));
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, dstBytes, cudaMemcpyDeviceToHost));
    long long bad = test::firstMismatch(got.data(), expect.data(), dstBytes);
    EXPECT_EQ(bad, -1) << "first differing byte in slot " << (bad / static_cast<long long>(kSlot)) << ", mode " << mode;
  }
  cudaFree(src);
  cudaFree(dst);
}

// One descriptor at each size 1 B .. 1 GiB (powers of 4 plus odd sizes), with source and destination at
// offsets that agree modulo 16 (vector body) and that do not (narrower words); checked on the GPU, guards too.
TEST(PeerCopy, SizesFromOneByteToOneGibibyte) {
  GDX_SKIP_WITHOUT_TWO_PEER_GPUS();
  const size_t kMax = size_t{1} << 30, kPad = 4096;
  unsigned char *src = nullptr, *dst = nullptr;
  GDX_TEST_CUDA(cudaSetDevice(1));
  GDX_TEST_CUDA(cudaMalloc(&dst, kMax + 2 * kPad));
  GDX_TEST_CUDA(cudaSetDevice(0));
  ASSERT_TRUE(enablePeerAccess(1));
  GDX_TEST_CUDA(cudaMalloc(&src, kMax + 2 * kPad));
  fillKernel<<<1024, 512>>>(src, kMax + 2 * kPad, 5);
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> sizes;
  for (uint64_t s = 1; s <= kMax; s *= 4) {
    sizes.push_back(s);
    if (s > 16 && s < kMax) sizes.push_back(s * 3 + 7);
  }
  const std::pair<uint64_t, uint64_t> offsets[] = {{0, 0}, {5, 21}, {3, 7}};  // aligned, same mod 16, different
  // Modes: 0 the SM kernel, 1 TMA bulk copies, 2 the defaults (large descriptors to the copy engines).
  for (int mode : {0, 1, 2})
    for (uint64_t bytes : sizes)
      for (auto [so, dOff] : offsets) {
        const uint64_t d = kPad + dOff;
        GDX_TEST_CUDA(cudaMemset(dst, 0xA5, kMax + 2 * kPad));
        GDX_TEST_CUDA(cudaDeviceSynchronize());
        PeerCopyDesc desc{src + kPad + so, dst + d, bytes};
        PeerCopyOptions o;
        o.bulk = mode == 1;
        if (mode < 2) o.copyEngineFrom = 0;
        GDX_TEST_CUDA(peerCopy(&desc, 1, nullptr, o));
        GDX_TEST_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(countBad(dst + d, bytes, 5, kPad + so), 0u)
            << bytes << " bytes, src +" << so << ", dst +" << dOff << ", mode " << mode;
        EXPECT_EQ(countNot(dst, d, 0xA5), 0u) << "guard before, " << bytes << " bytes";
        EXPECT_EQ(countNot(dst + d + bytes, kMax + 2 * kPad - d - bytes, 0xA5), 0u) << "guard after, " << bytes;
      }
  cudaFree(src);
  cudaFree(dst);
}

// ---- direct path between two processes -----------------------------------------------------------------------

struct PutDesc {
  uint64_t srcOffset, dstOffset, bytes;
};

// Block b takes descriptors [b * perBlock, (b + 1) * perBlock). Blocks use the block form, the warp form or the
// single-thread form by b % 3. Every put adds 1 to signal 0.
__global__ void directPuts(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, const PutDesc* descs, int perBlock,
                           uint32_t* status) {
  const PutDesc* mine = descs + size_t(blockIdx.x) * perBlock;
  Status s = Status::kOk;
  if (blockIdx.x % 3 == 0) {
    for (int i = 0; i < perBlock; ++i) {
      Status r = ch.putWithSignalBlock(dstWin, mine[i].dstOffset, srcWin, mine[i].srcOffset, mine[i].bytes, 0, 1);
      if (r != Status::kOk) s = r;
    }
  } else if (blockIdx.x % 3 == 1) {
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int i = warp; i < perBlock; i += warps) {
      Status r = ch.putWithSignalWarp(dstWin, mine[i].dstOffset, srcWin, mine[i].srcOffset, mine[i].bytes, 0, 1);
      if (r != Status::kOk) s = r;
    }
  } else {
    for (int i = threadIdx.x; i < perBlock; i += blockDim.x) {
      Status r = ch.putWithSignal(dstWin, mine[i].dstOffset, srcWin, mine[i].srcOffset, mine[i].bytes, 0, 1);
      if (r != Status::kOk) s = r;
    }
  }
  if (s == Status::kOk) s = ch.flush();
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// Ping-pong that checks ordering: the sender writes round r's pattern into its source, puts it with a signal
// set to r; the receiver's block waits for r, checks every byte of the round right away, acknowledges with
// signal 2 = r. A signal seen before its data shows up as a bad byte. Both run as one block of 1024 threads: the
// launch bounds keep the block form's registers within 64 a thread (without them the sender took 80, and a launch
// of 1024 threads failed with too many resources requested).
__global__ void __launch_bounds__(1024) orderSender(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin,
                                                    unsigned char* src, uint64_t bytes, int rounds, uint32_t* status) {
  for (int r = 1; r <= rounds; ++r) {
    for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x) src[i] = static_cast<unsigned char>(r * 131 + i * 7);
    __syncthreads();
    Status s = ch.putWithSignalBlock(dstWin, 0, srcWin, 0, bytes, 1, r, SignalOp::kSet);
    if (threadIdx.x == 0) {
      if (s == Status::kOk) s = ch.wait(2, r);
      if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
    __syncthreads();
    if (*(volatile uint32_t*)status) return;
  }
}

__global__ void __launch_bounds__(1024) orderReceiver(ChannelDeviceHandle ch, const unsigned char* dst, uint64_t bytes,
                                                      int rounds, unsigned long long* bad, uint32_t* status) {
  __shared__ int stop;
  for (int r = 1; r <= rounds; ++r) {
    if (threadIdx.x == 0) {
      Status s = ch.wait(1, r);
      stop = s != Status::kOk;
      if (stop) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
    __syncthreads();
    if (stop) return;
    unsigned long long mine = 0;
    for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
      mine += reinterpret_cast<const volatile unsigned char*>(dst)[i] != static_cast<unsigned char>(r * 131 + i * 7);
    if (mine) atomicAdd(bad, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
      Status s = ch.signal(2, r, SignalOp::kSet);
      if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
  }
}

// Round r of the per-form ordering test: 1 B to 64 KiB, at source and destination offsets that agree modulo 16
// (the single-thread form's vector path, with a head and a tail) and, every fourth round, that do not.
__device__ void roundShape(int r, uint64_t* srcOff, uint64_t* dstOff, uint64_t* bytes) {
  const uint64_t sizes[] = {1, 8, 24, 100, 4096, 4096 + 5, 16384 + 3, 65536};
  *bytes = sizes[r % 8];
  *srcOff = 32 + (r * 5) % 16;
  *dstOff = 64 + *srcOff + (r % 4 == 3 ? 1 : 0);
}
__device__ unsigned char roundByte(int r, uint64_t i) {
  return static_cast<unsigned char>(r * 131 + i * 7 + (i >> 8));
}

// The same ping-pong for each form of putWithSignal (0: one thread, 1: one warp, 2: the block; 3..5: the same with
// the windows bound once, BoundWindows), signals `ping` and `ping` + 1: the sender writes round r's bytes, puts them
// with ping = r and waits for the ack.
__global__ void formSender(ChannelDeviceHandle ch, uint32_t dstWin, uint32_t srcWin, unsigned char* src, int rounds,
                           int form, uint32_t ping, uint32_t* status) {
  const BoundWindows w = ch.bind(dstWin, srcWin);
  for (int r = 1; r <= rounds; ++r) {
    uint64_t so, dof, bytes;
    roundShape(r, &so, &dof, &bytes);
    for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x) src[so + i] = roundByte(r, i);
    __syncthreads();
    Status s = Status::kOk;
    if (form == 0 && threadIdx.x == 0)
      s = ch.putWithSignal(dstWin, dof, srcWin, so, bytes, ping, r, SignalOp::kSet);
    else if (form == 1 && threadIdx.x < 32)
      s = ch.putWithSignalWarp(dstWin, dof, srcWin, so, bytes, ping, r, SignalOp::kSet);
    else if (form == 2)
      s = ch.putWithSignalBlock(dstWin, dof, srcWin, so, bytes, ping, r, SignalOp::kSet);
    else if (form == 3 && threadIdx.x == 0)
      s = ch.putWithSignal(w, dof, so, bytes, ping, r, SignalOp::kSet);
    else if (form == 4 && threadIdx.x < 32)
      s = ch.putWithSignalWarp(w, dof, so, bytes, ping, r, SignalOp::kSet);
    else if (form == 5)
      s = ch.putWithSignalBlock(w, dof, so, bytes, ping, r, SignalOp::kSet);
    if (threadIdx.x == 0) {
      if (s == Status::kOk) s = ch.wait(ping + 1, r);
      if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
    __syncthreads();
    if (*(volatile uint32_t*)status) return;
  }
}

// Waits for round r's signal, compares every byte of the round (and once the byte after it, which must keep its
// 0xEE poison), then acknowledges.
__global__ void formReceiver(ChannelDeviceHandle ch, const unsigned char* dst, int rounds, uint32_t ping,
                             unsigned long long* bad, uint32_t* status) {
  __shared__ int stop;
  for (int r = 1; r <= rounds; ++r) {
    if (threadIdx.x == 0) {
      Status s = ch.wait(ping, r);
      stop = s != Status::kOk;
      if (stop) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
    __syncthreads();
    if (stop) return;
    uint64_t so, dof, bytes;
    roundShape(r, &so, &dof, &bytes);
    const volatile unsigned char* d = dst + dof;
    unsigned long long mine = 0;
    for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x) mine += d[i] != roundByte(r, i);
    if (threadIdx.x == 0 && r == 7) mine += d[bytes] != 0xEE;  // the first 64 KiB round: nothing wrote past it yet
    if (mine) atomicAdd(bad, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
      Status s = ch.signal(ping + 1, r, SignalOp::kSet);
      if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
    }
  }
}

__global__ void directAtomics(ChannelDeviceHandle ch, uint32_t win, int perThread, uint32_t* status) {
  Status s = Status::kOk;
  for (int i = 0; i < perThread && s == Status::kOk; ++i) s = ch.atomicAdd(win, 8 * (threadIdx.x % 4), 1);
  if (s == Status::kOk) s = ch.signal(3, 1);
  if (s != Status::kOk) atomicCAS(status, 0u, static_cast<uint32_t>(s));
}

// One rank of the two-process test (GDX_NVLINK_CHILD set): puts random descriptors to the other rank while the
// other does the same, checks every byte it received, then the ordering ping-pong and the atomics.
void childMain(bool expectDirect) {
  Context ctx;
  const int rank = ctx.rank(), peer = 1 - rank;
  ASSERT_EQ(ctx.worldSize(), 2);
  SCOPED_TRACE("rank " + std::to_string(rank));
  // Phase markers with the time since the start, unbuffered: a stall shows which step it sits in and for how long.
  const auto t0 = std::chrono::steady_clock::now();
  auto phase = [&](const std::string& what) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[nvlink rank %d +%.3f s] %s\n", rank, s, what.c_str());
    std::fflush(stderr);
  };
  // The kSet signals carry the round each side reached: print them when a phase fails.
  auto signals = [&](std::initializer_list<uint32_t> ids) {
    std::string out;
    for (uint32_t id : ids) out += " signal " + std::to_string(id) + "=" + std::to_string(ctx.signalValue(id));
    return out;
  };
  ASSERT_EQ(ctx.isDirect(peer), expectDirect);
  constexpr int kBlocks = 24, kThreads = 256, kPerBlock = 12;
  constexpr uint64_t kSlot = 1u << 20;
  const int puts = kBlocks * kPerBlock;
  const size_t srcBytes = 16u << 20, dstBytes = size_t(puts) * kSlot;
  unsigned char *src = nullptr, *dstAlloc = nullptr;
  GDX_TEST_CUDA(cudaMalloc(&src, srcBytes));
  // The destination window starts 4 KiB + 48 B into its allocation: the IPC mapping must add the offset.
  const size_t kInside = 4096 + 48;
  GDX_TEST_CUDA(cudaMalloc(&dstAlloc, dstBytes + kInside));
  unsigned char* dst = dstAlloc + kInside;
  fillKernel<<<264, 512>>>(src, srcBytes, 100 + rank);
  GDX_TEST_CUDA(cudaMemset(dstAlloc, 0xEE, dstBytes + kInside));
  GDX_TEST_CUDA(cudaDeviceSynchronize());
  // The same descriptors on both ranks (seeded alike); each rank's source differs by its seed.
  std::vector<PutDesc> descs(puts);
  std::mt19937_64 rng(9);
  for (int i = 0; i < puts; ++i) {
    uint64_t bytes = i % 5 == 0 ? 1 + rng() % 32 : i % 5 == 1 ? 0 : 1 + rng() % (kSlot - 64);
    if (i == 2) bytes = kSlot;
    uint64_t d = uint64_t(i) * kSlot + rng() % (kSlot - bytes + 1), s = rng() % (srcBytes - bytes + 1);
    descs[i] = {s, d, bytes};
  }
  uint32_t* status = nullptr;
  unsigned long long* bad = nullptr;
  GDX_TEST_CUDA(cudaHostAlloc(&status, 16, cudaHostAllocMapped));
  GDX_TEST_CUDA(cudaHostAlloc(&bad, 8, cudaHostAllocMapped));
  status[0] = status[1] = status[2] = status[3] = 0;
  *bad = 0;
  PutDesc* devDescs = nullptr;
  uint64_t* words = nullptr;
  {
    Window s = ctx.registerWindow(src, srcBytes, MemoryKind::kCuda);
    Window d = ctx.registerWindow(dst, dstBytes, MemoryKind::kCuda);
    GDX_TEST_CUDA(cudaMalloc(&words, 64));
    GDX_TEST_CUDA(cudaMemset(words, 0, 64));
    Window w = ctx.registerWindow(words, 64, MemoryKind::kCuda);
    ChannelDeviceHandle ch = ctx.deviceChannel(peer);
    EXPECT_EQ(ch.direct != nullptr, expectDirect);
    devDescs = nullptr;
    GDX_TEST_CUDA(cudaMalloc(&devDescs, puts * sizeof(PutDesc)));
    GDX_TEST_CUDA(cudaMemcpy(devDescs, descs.data(), puts * sizeof(PutDesc), cudaMemcpyHostToDevice));
    phase("setup done");
    ctx.barrier();
    phase("directPuts");
    directPuts<<<kBlocks, kThreads>>>(ch, d.id(), s.id(), devDescs, kPerBlock, status);
    GDX_TEST_CUDA(cudaGetLastError());  // a launch that fails (resources) must not pass as silence
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(status[0], 0u) << statusName(static_cast<Status>(status[0]));
    phase("host wait for signal 0 >= " + std::to_string(puts) + ";" + signals({0}));
    ctx.wait(0, puts);  // the host sees direct-path signals too
    EXPECT_EQ(ctx.signalValue(0), uint64_t(puts));
    std::vector<unsigned char> got(dstBytes), peerSrc(srcBytes), expect(dstBytes, 0xEE);
    for (size_t i = 0; i < srcBytes; ++i) peerSrc[i] = byteAt(100 + peer, i);
    for (const PutDesc& p : descs) std::memcpy(&expect[p.dstOffset], &peerSrc[p.srcOffset], p.bytes);
    GDX_TEST_CUDA(cudaMemcpy(got.data(), dst, dstBytes, cudaMemcpyDeviceToHost));
    long long first = test::firstMismatch(got.data(), expect.data(), dstBytes);
    EXPECT_EQ(first, -1) << "first differing byte in slot " << (first / static_cast<long long>(kSlot));
    EXPECT_EQ(countNot(dstAlloc, kInside, 0xEE), 0u) << "bytes before the window were written";
    ctx.barrier();

    phase("ordering ping-pong");
    // Ordering: rank 0 sends, rank 1 checks, many rounds of 256 KiB.
    const int rounds = expectDirect ? 3000 : 300;
    const uint64_t bytes = 256 << 10;
    if (rank == 0)
      orderSender<<<1, 1024>>>(ch, d.id(), s.id(), src, bytes, rounds, status + 1);
    else
      orderReceiver<<<1, 1024>>>(ch, dst, bytes, rounds, bad, status + 1);
    GDX_TEST_CUDA(cudaGetLastError());  // a launch that fails (resources) must not pass as silence
    GDX_TEST_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(status[1], 0u) << statusName(static_cast<Status>(status[1])) << signals({1, 2});
    EXPECT_EQ(*bad, 0u) << "bytes seen stale after their signal";
    ctx.barrier();

    // Ordering and content for each form (thread, warp, block; with window ids, then bound) at 1 B .. 64 KiB,
    // aligned and not; rank 0 sends.
    for (int form = 0; form < 6; ++form) {
      const int formRounds = expectDirect ? 800 : 80;
      const uint32_t ping = 4 + 2 * form;
      *bad = 0;
      status[1] = 0;  // a failure of the phase before must not stop this one's sender after one round
      phase("form " + std::to_string(form));
      GDX_TEST_CUDA(cudaMemset(dst, 0xEE, 256 << 10));
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      ctx.barrier();
      if (rank == 0)
        formSender<<<1, 256>>>(ch, d.id(), s.id(), src, formRounds, form, ping, status + 1);
      else
        formReceiver<<<1, 256>>>(ch, dst, formRounds, ping, bad, status + 1);
      GDX_TEST_CUDA(cudaGetLastError());  // a launch that fails (resources) must not pass as silence
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      const char* const names[] = {"single-thread",       "warp",       "block",
                                   "bound single-thread", "bound warp", "bound block"};
      const char* name = names[form];
      EXPECT_EQ(status[1], 0u) << name << " form: " << statusName(static_cast<Status>(status[1]))
                               << signals({ping, ping + 1});
      EXPECT_EQ(*bad, 0u) << name << " form: bytes that were not the round's data after its signal was seen (or "
                          << "a byte past the put that lost its poison)";
      ctx.barrier();
    }

    // Atomics (direct path only: the proxy's atomics are covered by the host-window tests): every thread of
    // 8 x 128 adds to the peer's words, then signals.
    if (expectDirect) {
      phase("atomics");
      directAtomics<<<8, 128>>>(ch, w.id(), 20, status + 2);
      GDX_TEST_CUDA(cudaGetLastError());  // a launch that fails (resources) must not pass as silence
      GDX_TEST_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(status[2], 0u);
      ctx.wait(3, 8 * 128);
      uint64_t got4[4];
      GDX_TEST_CUDA(cudaMemcpy(got4, words, 32, cudaMemcpyDeviceToHost));
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got4[i], 8u * 128 * 20 / 4) << "word " << i;
    }
    phase("teardown");
    ctx.barrier();
  }  // the windows are deregistered (and unmapped by the peer) before their memory is freed
  phase("windows gone");
  cudaFree(devDescs);
  cudaFree(words);
  cudaFree(src);
  cudaFree(dstAlloc);
  cudaFreeHost(status);
  cudaFreeHost(bad);
}

TEST(DirectPathChild, Run) {
  const char* child = std::getenv("GDX_NVLINK_CHILD");
  if (!child) GTEST_SKIP() << "runs only as a child of DirectPath.* (GDX_NVLINK_CHILD)";
  childMain(std::string(child) == "direct");
}

// Starts two copies of this binary, one a GPU, filtered to DirectPathChild.Run; both must pass.
void runPair(bool direct) {
  test::spawnRanks(2, "DirectPathChild.Run", "nvlink-test", [direct](int r) {
    return std::vector<std::string>{"GDX_CUDA_DEVICE=" + std::to_string(r),
                                    std::string("GDX_DIRECT=") + (direct ? "1" : "0"),
                                    "GDX_TIMEOUT_MS=20000",  // each stall costs 20 s: the total counts them
                                    std::string("GDX_NVLINK_CHILD=") + (direct ? "direct" : "proxy")};
  });
}

TEST(DirectPath, TwoProcessesOnTwoGpusPutSignalAndAtomicDirectly) {
  GDX_SKIP_WITHOUT_TWO_PEER_GPUS();
  runPair(true);
}

TEST(DirectPath, SameProgramThroughTheProxyWithDirectDisabled) {
  GDX_SKIP_WITHOUT_TWO_PEER_GPUS();
  runPair(false);
}

}  // namespace
}  // namespace gdx
