// gdx::p2p::Endpoint with cudaMalloc regions between two processes of one host (GPU 0 and GPU 1, or both on GPU 0
// where only one is visible): send/recv GPU to GPU over the TCP transport (staged through pinned host memory) for
// sizes 1 B..64 MiB, one-sided write/read between GPU regions, and the IPC forms writeIpc/readIpc GPU to GPU without
// a NIC; poisoned destinations, every byte compared on the host; out-of-range and damaged IPC descriptors refused
// with nothing copied. The test binary re-executes itself per process (CUDA does not survive fork). Skips without
// a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/endpoint.hpp"
#include "gpu/gpu_test_support.hpp"
#include "gpu/spawn_ranks.hpp"
#include "p2p/protocol.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::Endpoint;

// 1, 256 and 4096 bytes travel eagerly (copied from the receiver's eager buffer into GPU memory), the rest straight.
const std::vector<size_t> kSizes = {1, 256, p2p::kEagerBytes, p2p::kEagerBytes + 1, (1 << 20) + 5, 64 << 20};
constexpr size_t kRegion = 16 << 20;  // one-sided: four quarters, one per way of moving data
constexpr size_t kQuarter = kRegion / 4;

/// Waits until earlier copies and memsets have landed. A cudaMemcpy from pageable memory returns once the bytes are
/// staged, a cudaMemset at once; the endpoint's copies (a transport's staging, IPC) run on streams of their own and
/// do not wait for either: an eager send right after the upload would otherwise send what was there before.
void landed() {
  if (cudaDeviceSynchronize() != cudaSuccess) throw Error(ErrorCode::kCuda, "cudaDeviceSynchronize failed");
}

void upload(void* dst, size_t n, uint64_t seed) {
  std::vector<unsigned char> h(n);
  fillRandom(h.data(), n, seed);
  if (cudaMemcpy(dst, h.data(), n, cudaMemcpyHostToDevice) != cudaSuccess)
    throw Error(ErrorCode::kCuda, "cudaMemcpy to the GPU failed");
  landed();
}

/// How long a host function holds the legacy default stream at most in the eager-receive check.
constexpr std::chrono::seconds kHoldBound{20};

/// -1 when the `n` GPU bytes at `src` are fillRandom(seed)'s, else the first that differs.
long long mismatchOnGpu(const void* src, size_t n, uint64_t seed) {
  std::vector<unsigned char> got(n), want(n);
  if (cudaMemcpy(got.data(), src, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  fillRandom(want.data(), n, seed);
  return firstMismatch(got.data(), want.data(), n);
}

int serverMain(int gpu, int port) {
  CHILD_CHECK(cudaSetDevice(gpu) == cudaSuccess);
  p2p::EndpointOptions o = loopbackEndpoint(port);
  o.localGpu = gpu;
  Endpoint ep(o);
  uint64_t conn = ep.accept().connId;
  for (size_t n : kSizes) {
    GpuBuffer dst(n);
    CHILD_CHECK(cudaMemset(dst.p, 0xA5, n) == cudaSuccess);  // poisoned
    landed();
    uint64_t mr = ep.reg(dst.p, n);
    ep.recv(conn, mr, dst.p, n);
    CHILD_CHECK(mismatchOnGpu(dst.p, n, 1000 + n) == -1);
    ep.dereg(mr);
  }
  {
    // An eager receive into GPU memory while the legacy default stream is held (by a host function that waits for
    // the receive, as a kernel on a blocking stream waiting for this message would): the copy out of the eager
    // buffer does not queue behind it.
    GpuBuffer dst(256);
    uint64_t mr = ep.reg(dst.p, 256);
    std::atomic<bool> received{false};
    cudaHostFn_t hold = [](void* flag) {
      const auto t0 = std::chrono::steady_clock::now();
      while (!static_cast<std::atomic<bool>*>(flag)->load() && std::chrono::steady_clock::now() - t0 < kHoldBound)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    CHILD_CHECK(cudaLaunchHostFunc(cudaStreamLegacy, hold, &received) == cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    ep.recv(conn, mr, dst.p, 256);
    const auto took = std::chrono::steady_clock::now() - t0;
    received = true;
    CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHILD_CHECK(took < kHoldBound / 2);
    CHILD_CHECK(mismatchOnGpu(dst.p, 256, 77) == -1);
    ep.dereg(mr);
  }
  // Quarters: 0 written over the transport, 1 written over IPC, 2 read over the transport, 3 read over IPC.
  GpuBuffer region(kRegion);
  CHILD_CHECK(cudaMemset(region.p, 0x5A, 2 * kQuarter) == cudaSuccess);
  landed();
  upload(region.at(2 * kQuarter), kQuarter, 12);
  upload(region.at(3 * kQuarter), kQuarter, 13);
  uint64_t mr = ep.reg(region.p, kRegion);
  sendBlob(ep, conn, ep.advertise(conn, mr, region.p, kRegion));
  sendBlob(ep, conn, ep.advertiseIpc(mr, region.p, kRegion));
  CHILD_CHECK(recvBlob(ep, conn) == "written");
  CHILD_CHECK(mismatchOnGpu(region.at(0), kQuarter, 10) == -1);
  CHILD_CHECK(mismatchOnGpu(region.at(kQuarter), kQuarter, 11) == -1);
  CHILD_CHECK(recvBlob(ep, conn) == "bye");  // the client's IPC mapping is closed only after its reads
  return 0;
}

int clientMain(int gpu, int port) {
  CHILD_CHECK(cudaSetDevice(gpu) == cudaSuccess);
  p2p::EndpointOptions o = loopbackEndpoint(0);
  o.localGpu = gpu;
  Endpoint ep(o);
  uint64_t conn = ep.connect("127.0.0.1", -1, port);
  for (size_t n : kSizes) {
    GpuBuffer src(n);
    upload(src.p, n, 1000 + n);
    uint64_t mr = ep.reg(src.p, n);
    ep.send(conn, mr, src.p, n);
    ep.dereg(mr);
  }
  {
    GpuBuffer src(256);
    upload(src.p, 256, 77);
    uint64_t mr = ep.reg(src.p, 256);
    ep.send(conn, mr, src.p, 256);
    ep.dereg(mr);
  }
  const std::string desc = recvBlob(ep, conn), ipcDesc = recvBlob(ep, conn);
  GpuBuffer mine(kRegion);
  upload(mine.at(0), kQuarter, 10);
  upload(mine.at(kQuarter), kQuarter, 11);
  CHILD_CHECK(cudaMemset(mine.at(2 * kQuarter), 0xCC, 2 * kQuarter) == cudaSuccess);
  landed();
  uint64_t mr = ep.reg(mine.p, kRegion);
  ep.write(conn, mr, mine.at(0), kQuarter, desc, 0);
  ep.writeIpc(mine.at(kQuarter), kQuarter, ipcDesc, kQuarter);
  ep.read(conn, mr, mine.at(2 * kQuarter), kQuarter, desc, 2 * kQuarter);
  ep.readIpc(mine.at(3 * kQuarter), kQuarter, ipcDesc, 3 * kQuarter);
  CHILD_CHECK(mismatchOnGpu(mine.at(2 * kQuarter), kQuarter, 12) == -1);
  CHILD_CHECK(mismatchOnGpu(mine.at(3 * kQuarter), kQuarter, 13) == -1);
  // Misuse: past the advertised range, a damaged descriptor, host memory advertised for IPC. Nothing is copied, so
  // the server's check of quarters 0 and 1 after "written" sees only the legal writes.
  CHILD_CHECK(errorCodeOf([&] { ep.writeIpc(mine.p, 16, ipcDesc, kRegion - 8); }) == ErrorCode::kInvalidArgument);
  std::string damaged = ipcDesc;
  damaged[30] ^= 1;
  CHILD_CHECK(errorCodeOf([&] { ep.writeIpc(mine.p, 16, damaged, 0); }) == ErrorCode::kInvalidArgument);
  std::vector<char> host(64);
  uint64_t hmr = ep.reg(host.data(), host.size());
  CHILD_CHECK(errorCodeOf([&] { ep.advertiseIpc(hmr, host.data(), host.size()); }) == ErrorCode::kInvalidArgument);
  sendBlob(ep, conn, "written");
  sendBlob(ep, conn, "bye");
  return 0;
}

TEST(P2pGpuChild, Run) {
  const char* role = std::getenv("GDX_P2P_GPU_CHILD");
  if (!role) GTEST_SKIP() << "runs only as a child of P2pGpu.* (GDX_P2P_GPU_CHILD)";
  const int gpu = std::atoi(std::getenv("GDX_CUDA_DEVICE"));
  const int port = std::atoi(std::getenv("GDX_P2P_GPU_PORT"));
  const int rc = std::string(role) == "server" ? serverMain(gpu, port) : clientMain(gpu, port);
  EXPECT_EQ(rc, 0);
}

TEST(P2pGpu, CudaMallocRegionsOverTcpAndTheIpcFormsBetweenTwoProcesses) {
  GDX_SKIP_WITHOUT_GPU();
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const std::string port = std::to_string(freePort());
  spawnRanks(2, "P2pGpuChild.Run", "p2p-gpu-test", [&](int r) {
    return std::vector<std::string>{"GDX_P2P_GPU_CHILD=" + std::string(r == 0 ? "server" : "client"),
                                    "GDX_CUDA_DEVICE=" + std::to_string(gpus > 1 ? r : 0), "GDX_P2P_GPU_PORT=" + port,
                                    "GDX_TRANSPORT=tcp"};
  });
}

}  // namespace
}  // namespace gdx::test
