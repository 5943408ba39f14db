// GPU windows in the TCP transport, staged through pinned host memory: every byte of GPU->GPU, GPU->host and
// host->GPU writes from 1 B to 64 MiB over 4 sockets in 256 KiB chunks, each immediate announced only once its data
// (and all earlier data) is on the destination GPU, atomics on GPU windows refused by the sender and by the
// receiver, no CUDA context made on a GPU the process does not use. The loopback transport's GPU copies are checked
// here too. Skips where no GPU is visible.
#include <cuda.h>  // types only: the driver is reached through cudaDriverEntry
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/cuda_check.hpp"
#include "base/device_guard.hpp"
#include "base/gpu.hpp"
#include "gdx/error.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "spawn_ranks.hpp"
#include "support/tcp_helpers.hpp"
#include "support/test_support.hpp"
#include "transport/common/cuda_staging.hpp"
#include "transport/transport.hpp"

namespace gdx {
namespace {

using test::connectAll;
using test::tcpWorld;
using test::waitFor;

constexpr uint32_t kSrcWindow = 1;
constexpr uint32_t kDstWindow = 2;
constexpr uint32_t kWordWindow = 3;
constexpr size_t kGuard = 4096;
constexpr int kSockets = 4;
constexpr size_t kChunk = 256 << 10;

/// Number of visible GPUs, or 0 with `why` set.
int gpuCount(std::string* why) {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    *why = std::string("no usable GPU: cudaGetDeviceCount failed: ") + cudaGetErrorName(rc) + " (" +
           cudaGetErrorString(rc) + ")";
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0) *why = "no GPU is visible (cudaGetDeviceCount returned 0)";
  return n;
}

#define SKIP_WITHOUT_GPU()                     \
  do {                                         \
    std::string gdx_why_;                      \
    if (gpuCount(&gdx_why_) == 0) {            \
      GTEST_SKIP() << "skipped: " << gdx_why_; \
    }                                          \
  } while (0)

/// A window's memory: device memory of `device` (cudaMalloc) or host memory, plus a host mirror for checking.
class TestBuffer {
 public:
  TestBuffer(bool gpu, int device, size_t bytes) : gpu_(gpu), device_(device), bytes_(bytes), host_(bytes) {
    if (gpu_) {
      GDX_CUDA_CHECK(cudaSetDevice(device_));
      GDX_CUDA_CHECK(cudaMalloc(&dev_, bytes_));
    }
  }
  ~TestBuffer() {
    if (dev_ != nullptr) (void)cudaFree(dev_);
  }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;

  void* base() { return gpu_ ? dev_ : host_.data(); }
  MemoryKind kind() const { return gpu_ ? MemoryKind::kCuda : MemoryKind::kHost; }
  size_t bytes() const { return bytes_; }
  /// The host mirror: filled by the test, then upload(); or download() and then read.
  unsigned char* mirror() { return host_.data(); }
  void upload() {
    if (!gpu_) return;
    GDX_CUDA_CHECK(cudaMemcpy(dev_, host_.data(), bytes_, cudaMemcpyHostToDevice));
    // From pageable memory the copy returns before its DMA has landed; the transport's staging copy runs on a
    // non-blocking stream of its own and would not wait for it.
    GDX_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// Reads [offset, offset + n) of the window into `out` (from the GPU, or straight from host memory).
  void read(size_t offset, size_t n, unsigned char* out) const {
    if (gpu_)
      GDX_CUDA_CHECK(cudaMemcpy(out, static_cast<const char*>(dev_) + offset, n, cudaMemcpyDefault));
    else
      std::memcpy(out, host_.data() + offset, n);
  }
  void download() {
    if (gpu_) read(0, bytes_, host_.data());
  }

 private:
  const bool gpu_;
  const int device_;
  const size_t bytes_;
  void* dev_ = nullptr;
  std::vector<unsigned char> host_;
};

struct Mix {
  bool srcGpu;
  bool dstGpu;
};

std::string mixName(const ::testing::TestParamInfo<Mix>& info) {
  return std::string(info.param.srcGpu ? "gpu" : "host") + "_to_" + (info.param.dstGpu ? "gpu" : "host");
}

class TcpStaging : public ::testing::TestWithParam<Mix> {};

TEST_P(TcpStaging, EveryByteArrivesAndImmediatesWaitForTheGpuCopy) {
  SKIP_WITHOUT_GPU();
  std::string unused;
  const int gpus = gpuCount(&unused);
  const Mix mix = GetParam();
  const int sender = 0, receiver = 1;
  const int srcDevice = 0, dstDevice = gpus > 1 ? 1 : 0;  // a second GPU, where there is one

  std::vector<uint64_t> sizes = {1, 4097, (1 << 20) + 3, 64ull << 20};
  std::mt19937_64 rng(23);
  for (int i = 0; i < 40; ++i) sizes.push_back(1 + rng() % 600000);  // one to a few chunks, many sockets busy
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (uint64_t s : sizes) offsets.push_back(total), total += s;
  auto withImm = [&](size_t i) { return i % 3 != 1 || i + 1 == sizes.size(); };

  TestBuffer src(mix.srcGpu, srcDevice, total), dst(mix.dstGpu, dstDevice, total + kGuard);
  test::fillRandom(src.mirror(), total, 99);
  src.upload();
  std::vector<unsigned char> expected(src.mirror(), src.mirror() + total);
  for (uint64_t i = 0; i < total; ++i) dst.mirror()[i] = expected[i] ^ 0x5A;  // every byte starts wrong
  std::memset(dst.mirror() + total, 0xEE, kGuard);
  dst.upload();

  auto t = tcpWorld(2, kSockets, kChunk);
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<long> lastAnnounced{-1};
  t[receiver]->setImmHandler([&](const RemoteWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    long k = static_cast<long>(w.imm);
    if (w.peer != sender || w.window != kDstWindow || k <= lastAnnounced.load() || k >= (long)sizes.size() ||
        w.offset != offsets[k] || w.bytes != sizes[k]) {
      errors.push_back("unexpected announcement imm " + std::to_string(k) + " after " +
                       std::to_string(lastAnnounced.load()));
      return;
    }
    // This write and every earlier one must already be in the destination (on the GPU: copied back from there).
    uint64_t from = offsets[lastAnnounced.load() + 1], to = offsets[k] + sizes[k];
    std::vector<unsigned char> seen(to - from);
    try {
      dst.read(from, to - from, seen.data());
    } catch (const std::exception& e) {
      errors.push_back(std::string("copying the destination back: ") + e.what());
      return;
    }
    long long bad = test::firstMismatch(expected.data() + from, seen.data(), to - from);
    if (bad >= 0)
      errors.push_back("imm " + std::to_string(k) + " announced before byte " + std::to_string(from + bad) +
                       " was in place");
    lastAnnounced.store(k);
  });
  std::atomic<int> failures{0};
  for (auto& x : t)
    x->setPeerFailureHandler([&](int peer, const std::string& why) {
      failures++;
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back("peer " + std::to_string(peer) + " failed: " + why);
    });
  std::string srcKey = t[sender]->registerWindow(kSrcWindow, src.base(), total, src.kind());
  std::string dstKey = t[receiver]->registerWindow(kDstWindow, dst.base(), total, dst.kind());
  EXPECT_EQ(srcKey.size() > 5 && srcKey.compare(srcKey.size() - 5, 5, ":cuda") == 0, mix.srcGpu) << srcKey;
  EXPECT_EQ(dstKey.size() > 5 && dstKey.compare(dstKey.size() - 5, 5, ":cuda") == 0, mix.dstGpu) << dstKey;
  t[sender]->addRemoteWindow(receiver, kDstWindow, total, dstKey);
  connectAll(t, 1);

  TransportLane& lane = t[sender]->lane(0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    WriteOp op;
    op.peer = receiver;
    op.localWindow = kSrcWindow;
    op.localOffset = offsets[i];
    op.remoteWindow = kDstWindow;
    op.remoteOffset = offsets[i];
    op.bytes = sizes[i];
    op.withImm = withImm(i);
    op.imm = static_cast<uint32_t>(i);
    op.cookie = 1000 + i;
    lane.post(op);
  }
  auto done = test::pollCompletions(lane, sizes.size(), 60000);
  ASSERT_EQ(done.size(), sizes.size());
  std::set<uint64_t> cookies;
  for (auto& c : done) {
    EXPECT_EQ(c.status, Status::kOk);
    EXPECT_EQ(c.peer, receiver);
    cookies.insert(c.cookie);
  }
  EXPECT_EQ(cookies.size(), sizes.size());
  ASSERT_TRUE(waitFor([&] { return lastAnnounced.load() == (long)sizes.size() - 1; }, 60000))
      << "last announcement " << lastAnnounced.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : errors) ADD_FAILURE() << e;
  }
  dst.download();
  EXPECT_EQ(test::firstMismatch(expected.data(), dst.mirror(), total), -1);
  for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(dst.mirror()[total + i], 0xEE) << "guard byte " << i;
  EXPECT_EQ(failures.load(), 0);
  for (auto& x : t) x->shutdown();
}

INSTANTIATE_TEST_SUITE_P(Gpu, TcpStaging, ::testing::Values(Mix{true, true}, Mix{true, false}, Mix{false, true}),
                         mixName);

TEST(TcpStagingGpu, AtomicsOnGpuWindowsAreRefusedBySenderAndReceiver) {
  SKIP_WITHOUT_GPU();
  TestBuffer words(true, 0, 64);
  std::memset(words.mirror(), 0xA5, 64);
  words.upload();
  auto t = tcpWorld(2, 2, kChunk);
  std::mutex mu;
  std::vector<std::string> why;
  for (auto& x : t)
    x->setPeerFailureHandler([&](int, const std::string& w) {
      std::lock_guard<std::mutex> lock(mu);
      why.push_back(w);
    });
  std::string key = t[1]->registerWindow(kWordWindow, words.base(), 64, MemoryKind::kCuda);
  t[0]->addRemoteWindow(1, kWordWindow, 64, key);
  connectAll(t, 1);

  AtomicOp op;
  op.peer = 1;
  op.remoteWindow = kWordWindow;
  op.remoteOffset = 8;
  op.kind = SignalOp::kAdd;
  op.value = 1;
  try {
    t[0]->lane(0).postAtomic(op);
    ADD_FAILURE() << "an atomic on a GPU window was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("atomics on GPU windows are not supported by the TCP transport"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t[0]->lane(0).inFlight(), 0u);

  // A sender that does not know the window is on a GPU (no key) sends it; the receiver refuses the message and
  // fails the peer instead of touching the word.
  t[0]->addRemoteWindow(1, kWordWindow, 64, "");
  t[0]->lane(0).postAtomic(op);
  ASSERT_TRUE(waitFor([&] { return t[1]->peerStatus(0) == Status::kPeerFailed; }, 20000));
  {
    std::lock_guard<std::mutex> lock(mu);
    bool named = false;
    for (auto& w : why) named |= w.find("atomics on GPU windows are not supported by the TCP transport") != w.npos;
    EXPECT_TRUE(named) << "no failure names the refused atomic";
  }
  unsigned char after[64];
  words.read(0, 64, after);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(after[i], 0xA5) << "byte " << i << " of the GPU window changed";
  for (auto& x : t) x->shutdown();
}

TEST(TcpStagingGpu, RegistrationChecksTheMemory) {
  SKIP_WITHOUT_GPU();
  auto t = makeTcpTransport(test::tcpOptions(0, 1, 1, kChunk, 5000));
  std::vector<char> host(64);
  try {
    t->registerWindow(1, host.data(), host.size(), MemoryKind::kCuda);
    ADD_FAILURE() << "host memory accepted as a GPU window";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("MemoryKind::kHost"), std::string::npos) << e.what();
  }
  TestBuffer gpu(true, 0, 4096);
  EXPECT_EQ(t->registerWindow(2, gpu.base(), 4096, MemoryKind::kCuda), "tcp:2:4096:cuda");
  // A window reaching past the allocation is refused: its last byte is no device memory.
  TestBuffer small(true, 0, 1 << 21);
  EXPECT_THROW(t->registerWindow(3, small.base(), (1ull << 40), MemoryKind::kCuda), Error);
}

// A process that drives GPU 1 and moves GPU windows through the TCP transport must leave GPU 0 alone: the sender and
// receiver threads pick the window's GPU before their first CUDA call (pinning the staging buffer), where the runtime
// would otherwise make device 0's context for them, on the GPU of another rank; so must DeviceGuard and the staging
// copier on a thread without a context, and PeerCopyQueue's idle thread. Runs in a child process (this binary
// again, TcpStagingGpuChild.OnlyGpuOneIsUsed) whose only CUDA use is GPU 1, so GPU 0's context state is its own.
TEST(TcpStagingGpu, TransportThreadsMakeNoContextOnAnotherGpu) {
  SKIP_WITHOUT_GPU();
  std::string unused;
  if (gpuCount(&unused) < 2) GTEST_SKIP() << "needs two GPUs";
  test::spawnRanks(1, "TcpStagingGpuChild.OnlyGpuOneIsUsed", "tcp-staging-context",
                   [](int) { return std::vector<std::string>{"GDX_TCP_STAGING_CHILD=1"}; });
}

/// Whether device `device`'s primary context is active in this process (cuDevicePrimaryCtxGetState through
/// cudaDriverEntry, so the test links no libcuda); fails the test when the driver cannot say.
bool primaryContextActive(int device) {
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  const auto state = reinterpret_cast<GetState>(cudaDriverEntry("cuDevicePrimaryCtxGetState", 12000));
  if (!state) {
    ADD_FAILURE() << "no cuDevicePrimaryCtxGetState in the driver";
    return true;
  }
  unsigned int flags = 0;
  int active = 0;
  if (state(static_cast<CUdevice>(device), &flags, &active) != CUDA_SUCCESS) {
    ADD_FAILURE() << "cuDevicePrimaryCtxGetState(" << device << ") failed";
    return true;
  }
  return active != 0;
}

TEST(TcpStagingGpuChild, OnlyGpuOneIsUsed) {
  if (!std::getenv("GDX_TCP_STAGING_CHILD"))
    GTEST_SKIP() << "runs only as the child of TcpStagingGpu.TransportThreadsMakeNoContextOnAnotherGpu";
  const uint64_t total = 3 * kChunk + 5;  // four chunks over two sockets: both sender and receiver threads stage
  TestBuffer src(true, 1, total), dst(true, 1, total);
  test::fillRandom(src.mirror(), total, 31);
  src.upload();
  std::vector<unsigned char> expected(src.mirror(), src.mirror() + total);
  std::memset(dst.mirror(), 0xEE, total);
  dst.upload();
  ASSERT_FALSE(primaryContextActive(0)) << "GPU 0 had a context before the transport ran";

  auto t = tcpWorld(2, 2, kChunk);
  std::atomic<bool> announced{false};
  t[1]->setImmHandler([&](const RemoteWrite& w) { announced = w.imm == 7; });
  t[0]->registerWindow(kSrcWindow, src.base(), total, MemoryKind::kCuda);
  t[0]->addRemoteWindow(1, kDstWindow, total, t[1]->registerWindow(kDstWindow, dst.base(), total, MemoryKind::kCuda));
  connectAll(t, 1);
  WriteOp op;
  op.peer = 1;
  op.localWindow = kSrcWindow;
  op.remoteWindow = kDstWindow;
  op.bytes = total;
  op.withImm = true;
  op.imm = 7;
  op.cookie = 1;
  t[0]->lane(0).post(op);
  auto done = test::pollCompletions(t[0]->lane(0), 1, 20000);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, Status::kOk);
  ASSERT_TRUE(waitFor([&] { return announced.load(); }, 20000)) << "the write's immediate never arrived";
  dst.download();
  EXPECT_EQ(test::firstMismatch(expected.data(), dst.mirror(), total), -1);
  for (auto& x : t) x->shutdown();
  EXPECT_FALSE(primaryContextActive(0)) << "the TCP transport's threads made a context on GPU 0, a GPU this process "
                                           "never used (staging for windows on GPU 1)";

  // A fresh thread has no context; DeviceGuard and the staging copier leave it on the device they used instead of
  // "restoring" device 0.
  std::thread fresh([&] {
    EXPECT_EQ(cudaThreadDevice(), -1) << "a new thread reported a CUDA context";
    {
      DeviceGuard guard(1);
      EXPECT_EQ(cudaThreadDevice(), 1);
    }
    common::CudaCopier copier(20000ull * 1000000);
    std::vector<unsigned char> back(64);
    EXPECT_EQ(copier.copy(back.data(), dst.base(), back.size(), 1), "");
    EXPECT_EQ(std::memcmp(back.data(), expected.data(), back.size()), 0);
    EXPECT_EQ(cudaThreadDevice(), 1);
  });
  fresh.join();
  EXPECT_FALSE(primaryContextActive(0)) << "DeviceGuard or the staging copier made a context on GPU 0";

  // PeerCopyQueue's idle thread stops the kernel after idleNs without work: its event queries are for GPU 1 too.
  PeerCopyQueue::Options o = PeerCopyQueue::Options::fromEnv();
  o.idleNs = 2 * 1000 * 1000;
  {
    PeerCopyQueue q(1, o);
    q.submit(src.base(), dst.base(), 4096);
    q.waitCompleted(q.submitted());
    ASSERT_TRUE(waitFor([&] { return !q.running(); }, 20000)) << "the idle kernel was not stopped";
  }
  EXPECT_FALSE(primaryContextActive(0)) << "PeerCopyQueue's idle thread made a context on GPU 0";
}

// The loopback transport copies to and from GPU windows itself, on the lane's stream, before it announces.
TEST(LoopbackGpu, CopiesEveryByteBetweenGpuAndHostWindowsBeforeAnnouncing) {
  SKIP_WITHOUT_GPU();
  const std::vector<uint64_t> sizes = {1, 4097, (1 << 20) + 3, 64ull << 20};
  uint64_t total = 0;
  std::vector<uint64_t> offsets;
  for (uint64_t s : sizes) offsets.push_back(total), total += s;
  for (Mix mix : {Mix{true, true}, Mix{true, false}, Mix{false, true}}) {
    SCOPED_TRACE(std::string(mix.srcGpu ? "gpu" : "host") + " -> " + (mix.dstGpu ? "gpu" : "host"));
    TestBuffer src(mix.srcGpu, 0, total), dst(mix.dstGpu, 0, total);
    test::fillRandom(src.mirror(), total, 5);
    src.upload();
    std::vector<unsigned char> expected(src.mirror(), src.mirror() + total);
    for (uint64_t i = 0; i < total; ++i) dst.mirror()[i] = expected[i] ^ 0x5A;
    dst.upload();
    auto t = makeLoopbackTransport();
    std::vector<std::string> errors;
    t->setImmHandler([&](const RemoteWrite& w) {
      std::vector<unsigned char> seen(w.bytes);
      dst.read(w.offset, w.bytes, seen.data());
      if (test::firstMismatch(expected.data() + w.offset, seen.data(), w.bytes) >= 0)
        errors.push_back("imm " + std::to_string(w.imm) + " announced before its data");
    });
    t->registerWindow(kSrcWindow, src.base(), total, src.kind());
    t->addRemoteWindow(0, kDstWindow, total, t->registerWindow(kDstWindow, dst.base(), total, dst.kind()));
    t->connect({t->localAddress()}, 1);
    TransportLane& lane = t->lane(0);
    for (size_t i = 0; i < sizes.size(); ++i) {
      WriteOp op;
      op.peer = 0;
      op.localWindow = kSrcWindow;
      op.localOffset = offsets[i];
      op.remoteWindow = kDstWindow;
      op.remoteOffset = offsets[i];
      op.bytes = sizes[i];
      op.withImm = true;
      op.imm = static_cast<uint32_t>(i);
      op.cookie = i;
      lane.post(op);
    }
    Completion c[8];
    ASSERT_EQ(lane.poll(c, 8), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(c[i].status, Status::kOk) << "write " << i;
    for (auto& e : errors) ADD_FAILURE() << e;
    dst.download();
    EXPECT_EQ(test::firstMismatch(expected.data(), dst.mirror(), total), -1);
    if (mix.dstGpu) {
      AtomicOp op;
      op.peer = 0;
      op.remoteWindow = kDstWindow;
      op.remoteOffset = 0;
      EXPECT_THROW(lane.postAtomic(op), Error);
    }
  }
}

}  // namespace
}  // namespace gdx
