// What the GPU examples share: choosing this rank's GPU, skipping without one, checking CUDA calls, device buffers
// and the pattern filled and checked by the examples. Not part of gdx; copy what you need.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gdx/gdx.hpp>
#include <string>
#include <vector>

#include "example_util.hpp"

namespace example {

/// CTest's SKIP_RETURN_CODE: the machine has no GPU.
constexpr int kNoGpu = 77;

inline void cudaCheck(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) throw gdx::Error(gdx::ErrorCode::kCuda, std::string(call) + ": " + cudaGetErrorString(rc));
}

/// Number of GPUs, 0 where CUDA finds none (no driver, no device).
inline int gpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return count;
}

/// Selects this rank's GPU before the Context is made (the Context drives the current device): GDX_CUDA_DEVICE
/// when set, else the local rank modulo the GPUs of the host, as torchrun programs do with LOCAL_RANK. So two
/// ranks use two GPUs where there are two, and share GPU 0 where there is one.
inline int selectGpu() {
  const char* localVar = gdx::envFirstSet({"GDX_LOCAL_RANK", "LOCAL_RANK"});
  const int local = localVar ? static_cast<int>(gdx::envInt(localVar, 0)) : 0;
  const int device = static_cast<int>(gdx::envInt("GDX_CUDA_DEVICE", local % gpuCount()));
  cudaCheck(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

/// cudaMalloc'd bytes, freed when it goes out of scope: declare it before the Window that registers it.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { cudaCheck(cudaMalloc(&p_, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(p_); }

 private:
  void* p_ = nullptr;
};

/// Where a kernel reports the first gdx::Status that was not kOk (GPU memory, kOk until then).
class KernelStatus {
 public:
  KernelStatus() : word_(sizeof(gdx::Status)) {
    cudaCheck(cudaMemset(word_.get(), 0, sizeof(gdx::Status)), "cudaMemset");  // gdx::Status::kOk
  }
  gdx::Status* get() const { return reinterpret_cast<gdx::Status*>(word_.get()); }
  /// After the kernel: 0 when it reported nothing, else prints the status and returns 1.
  int report(const char* what, int rank) const {
    gdx::Status s;
    cudaCheck(cudaMemcpy(&s, get(), sizeof s, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (s == gdx::Status::kOk) return 0;
    std::printf("%s: rank %d: the kernel reported %s\n", what, rank, gdx::statusName(s));
    std::fflush(stdout);
    return 1;
  }

 private:
  DeviceBuffer word_;
};

/// run() for the GPU examples: without a GPU it says so and returns kNoGpu.
template <typename Body>
int runWithGpu(const char* name, Body&& body) {
  if (gpuCount() == 0) {
    std::printf("%s: no GPU, skipping\n", name);
    return kNoGpu;
  }
  return run(name, body);
}

__global__ void fillPatternKernel(unsigned char* p, uint64_t bytes, int rank, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = patternByte(rank, seed, i);
}

/// Fills `bytes` of GPU memory with what `rank` sends (patternByte) and waits for it.
inline void fillPatternOnGpu(unsigned char* p, uint64_t bytes, int rank, uint64_t seed) {
  fillPatternKernel<<<128, 256>>>(p, bytes, rank, seed);
  cudaCheck(cudaDeviceSynchronize(), "fillPatternKernel");
}

/// Copies GPU memory back and checks every byte against what `from` sent (checkAndReport).
inline int checkGpuBytes(const char* what, int rank, int from, const unsigned char* got, size_t bytes, uint64_t seed) {
  std::vector<unsigned char> host(bytes);
  cudaCheck(cudaMemcpy(host.data(), got, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return checkAndReport(what, rank, from, host.data(), bytes, seed);
}

}  // namespace example
