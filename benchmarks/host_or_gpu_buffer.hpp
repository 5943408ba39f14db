// The memory a benchmark moves data from and into: page-aligned host memory (set to 1s), or cudaMalloc memory with
// --device gpu in a build with CUDA (kInvalidArgument without); and the GPU of each side of a two-process benchmark.
#pragma once

#include <cstdlib>
#include <cstring>

#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx::bench {

/// The GPU of one side of a two-process benchmark with --device gpu, made current: GDX_CUDA_DEVICE, else the server
/// on GPU 0 and the client on GPU 1 where there is one. -1 (no GPU) for --device cpu.
inline int sideGpu(bool gpu, bool client) {
  if (!gpu) return -1;
#if defined(GDX_HAVE_CUDA)
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const char* d = std::getenv("GDX_CUDA_DEVICE");
  const int device = d ? std::atoi(d) : (client && gpus > 1 ? 1 : 0);
  if (cudaSetDevice(device) != cudaSuccess) throw Error(ErrorCode::kCuda, "cudaSetDevice failed");
  return device;
#else
  (void)client;
  throw Error(ErrorCode::kInvalidArgument, "--device gpu: gdx was built without CUDA");
#endif
}

struct HostOrGpuBuffer {
  HostOrGpuBuffer(size_t bytes, bool gpu) : gpu(gpu) {
    if (!gpu) {
      p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
      std::memset(p, 1, bytes);
      return;
    }
#if defined(GDX_HAVE_CUDA)
    if (cudaMalloc(&p, bytes) != cudaSuccess) throw Error(ErrorCode::kCuda, "cudaMalloc failed");
#else
    throw Error(ErrorCode::kInvalidArgument, "--device gpu: gdx was built without CUDA");
#endif
  }
  ~HostOrGpuBuffer() {
#if defined(GDX_HAVE_CUDA)
    if (gpu) {
      cudaFree(p);
      return;
    }
#endif
    std::free(p);
  }
  HostOrGpuBuffer(const HostOrGpuBuffer&) = delete;
  HostOrGpuBuffer& operator=(const HostOrGpuBuffer&) = delete;
  char* at(size_t offset) const {
    return static_cast<char*>(p) + offset;
  }
  void* p = nullptr;
  bool gpu;
};

}  // namespace gdx::bench
