// The memory a benchmark moves data from and into: page-aligned host memory (set to 1s), or cudaMalloc memory with
// --device gpu in a build with CUDA (kInvalidArgument without).
#pragma once

#include <cstdlib>
#include <cstring>

#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx::bench {

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
