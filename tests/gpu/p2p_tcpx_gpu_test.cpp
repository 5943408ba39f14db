// gdx::p2p::TcpxSession with cudaMalloc memory (kPtrCuda) between two processes of one host (GPU 0 and GPU 1, or
// both on GPU 0 where only one is visible): 64 MiB of random data posted as 512 KiB chunks from GPU to GPU over the
// TCP transport (staged through pinned host memory), into a poisoned destination, every byte compared on the host;
// then GPU memory to host memory and back the other way; registrations whose ptrType does not match the memory are
// refused. The test binary re-executes itself per process (CUDA does not survive fork). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/p2p/tcpx_session.hpp"
#include "gpu/gpu_test_support.hpp"
#include "gpu/spawn_ranks.hpp"
#include "support/p2p_helpers.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
namespace {

using p2p::kPtrCuda;
using p2p::kPtrHost;
using p2p::TcpxSession;
using p2p::TcpxSessionOptions;
using p2p::TcpxTransfer;

constexpr size_t kBytes = 64 << 20;
constexpr size_t kChunk = 512 << 10;
constexpr size_t kBack = (8 << 20) + 3;  // GPU -> host, then host -> GPU

/// Random bytes of `seed` into GPU memory, landed before anything reads them (the session's copies run on streams of
/// their own, not after the caller's).
void upload(void* dst, size_t n, uint64_t seed) {
  std::vector<unsigned char> h(n);
  fillRandom(h.data(), n, seed);
  if (cudaMemcpy(dst, h.data(), n, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
    throw Error(ErrorCode::kCuda, "upload to the GPU failed");
}

/// -1 when the `n` GPU bytes at `src` are fillRandom(seed)'s, else the first that differs.
long long mismatchOnGpu(const void* src, size_t n, uint64_t seed) {
  std::vector<unsigned char> got(n), want(n);
  if (cudaMemcpy(got.data(), src, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
  fillRandom(want.data(), n, seed);
  return firstMismatch(got.data(), want.data(), n);
}

TcpxSessionOptions loopback(int gpu) {
  TcpxSessionOptions o = TcpxSessionOptions::fromEnv(gpu);
  o.bindAddress = "127.0.0.1";
  return o;
}

int serverMain(int gpu, const std::string& path) {
  CHILD_CHECK(cudaSetDevice(gpu) == cudaSuccess);
  TcpxSession s(loopback(gpu));
  shipText(path, s.listen());
  s.accept("client");
  GpuBuffer dst(kBytes);
  CHILD_CHECK(cudaMemset(dst.p, 0xA5, kBytes) == cudaSuccess);  // poisoned
  CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<char> host(64);
  CHILD_CHECK(errorCodeOf([&] { s.registerMemory(dst.p, kBytes, kPtrHost, true); }) == ErrorCode::kInvalidArgument);
  CHILD_CHECK(errorCodeOf([&] { s.registerMemory(host.data(), 64, kPtrCuda, true); }) == ErrorCode::kInvalidArgument);
  const uint64_t mem = s.registerMemory(dst.p, kBytes, kPtrCuda, /*isRecv=*/true);
  std::unique_ptr<TcpxTransfer> t(s.createTransfer("client"));
  for (size_t off = 0; off < kBytes; off += kChunk) t->postRecv(mem, off, kChunk);
  t->wait();
  CHILD_CHECK(t->completedChunks() == kBytes / kChunk);
  CHILD_CHECK(mismatchOnGpu(dst.p, kBytes, 21) == -1);
  // GPU memory to the client's host memory, then the client's host memory into GPU memory here.
  GpuBuffer src(kBack), back(kBack);
  upload(src.p, kBack, 22);
  CHILD_CHECK(cudaMemset(back.p, 0x5A, kBack) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
  const uint64_t srcMem = s.registerMemory(src.p, kBack, kPtrCuda, false);
  const uint64_t backMem = s.registerMemory(back.p, kBack, kPtrCuda, true);
  t->release();
  t->postSend(srcMem, 0, kBack);
  t->postRecv(backMem, 0, kBack);
  t->wait();
  CHILD_CHECK(mismatchOnGpu(back.p, kBack, 22) == -1);
  return 0;
}

int clientMain(int gpu, const std::string& path) {
  CHILD_CHECK(cudaSetDevice(gpu) == cudaSuccess);
  TcpxSession s(loopback(gpu));
  const std::string info = awaitText(path, 60000);
  CHILD_CHECK(!info.empty());
  s.loadRemoteConnInfo("server", info);
  s.connect("server");
  GpuBuffer src(kBytes);
  upload(src.p, kBytes, 21);
  const uint64_t mem = s.registerMemory(src.p, kBytes, kPtrCuda, /*isRecv=*/false);
  std::unique_ptr<TcpxTransfer> t(s.createTransfer("server"));
  for (size_t off = 0; off < kBytes; off += kChunk) t->postSend(mem, off, kChunk);
  t->wait();
  // The server's GPU bytes land in host memory here and go back from it.
  std::vector<unsigned char> host(kBack, 0xA5), want(kBack);
  fillRandom(want.data(), kBack, 22);
  const uint64_t in = s.registerMemory(host.data(), kBack, kPtrHost, true);
  const uint64_t out = s.registerMemory(host.data(), kBack, kPtrHost, false);
  t->release();
  t->postRecv(in, 0, kBack);
  t->wait();
  CHILD_CHECK(firstMismatch(host.data(), want.data(), kBack) == -1);
  t->postSend(out, 0, kBack);
  t->wait();
  return 0;
}

TEST(TcpxGpuChild, Run) {
  const char* role = std::getenv("GDX_TCPX_GPU_CHILD");
  if (!role) GTEST_SKIP() << "runs only as a child of TcpxGpu.* (GDX_TCPX_GPU_CHILD)";
  const int gpu = std::atoi(std::getenv("GDX_CUDA_DEVICE"));
  const std::string path = std::getenv("GDX_TCPX_GPU_INFO");
  const int rc = std::string(role) == "server" ? serverMain(gpu, path) : clientMain(gpu, path);
  EXPECT_EQ(rc, 0);
}

TEST(TcpxGpu, SixtyFourMiBGpuToGpuInChunksBetweenTwoProcesses) {
  GDX_SKIP_WITHOUT_GPU();
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const std::string path = scratchPath("tcpx_gpu_info");
  spawnRanks(2, "TcpxGpuChild.Run", "tcpx-gpu-test", [&](int r) {
    return std::vector<std::string>{"GDX_TCPX_GPU_CHILD=" + std::string(r == 0 ? "server" : "client"),
                                    "GDX_CUDA_DEVICE=" + std::to_string(gpus > 1 ? r : 0), "GDX_TCPX_GPU_INFO=" + path};
  });
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gdx::test
