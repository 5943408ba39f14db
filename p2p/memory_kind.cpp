#include "p2p/memory_kind.hpp"

#include <cstring>
#include <memory>
#include <string>

#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "transport/common/cuda_staging.hpp"

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
  // On a stream of the copier's own with a bounded wait, not cudaMemcpy on the legacy default stream: that one waits
  // for every kernel of the blocking streams (a kernel spinning until this very message arrives, say) with no bound,
  // and the connection's driver, which makes the copy, would wait with it. A copier owns its streams and is used by
  // one thread at a time: one per thread; one whose copy timed out is left for a new one.
  thread_local std::unique_ptr<common::CudaCopier> copier;
  if (!copier || !copier->usable()) copier = std::make_unique<common::CudaCopier>(defaultTimeoutNs());
  const int device = common::cudaWindowDevice(dst, n, what);
  const std::string why = copier->copy(dst, src, n, device);
  if (!why.empty())
    throw Error(ErrorCode::kCuda,
                std::string(what) + ": copying " + std::to_string(n) + " bytes into GPU memory: " + why);
#else
  throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": GPU memory in a build without CUDA");
#endif
}

}  // namespace gdx::p2p
