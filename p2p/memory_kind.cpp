#include "p2p/memory_kind.hpp"

#include <cstring>
#include <string>

#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace gdx::p2p {

MemoryKind pointerKind(const void* p) {
#if defined(GDX_HAVE_CUDA)
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on older runtimes, or no GPU: not an error worth keeping
    return MemoryKind::kHost;
  }
  return a.type == cudaMemoryTypeDevice ? MemoryKind::kCuda : MemoryKind::kHost;
#else
  (void)p;
  return MemoryKind::kHost;
#endif
}

void copyFromHost(void* dst, MemoryKind dstKind, const void* src, size_t n, const char* what) {
  if (dstKind != MemoryKind::kCuda) {
    std::memcpy(dst, src, n);
    return;
  }
#if defined(GDX_HAVE_CUDA)
  // cudaMemcpyDefault: unified addressing finds the GPU the region lives on, whichever device is current.
  const cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  if (e != cudaSuccess)
    throw Error(ErrorCode::kCuda, std::string(what) + ": copying " + std::to_string(n) +
                                      " bytes into GPU memory: " + cudaGetErrorString(e));
#else
  throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": GPU memory in a build without CUDA");
#endif
}

}  // namespace gdx::p2p
