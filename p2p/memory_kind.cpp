#include "p2p/memory_kind.hpp"

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

}  // namespace gdx::p2p
