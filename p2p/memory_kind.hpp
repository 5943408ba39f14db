// Where a pointer handed to reg() lives: host memory, or device memory of a GPU (cudaPointerGetAttributes in a CUDA
// build). Managed memory counts as host memory: the CPU may touch it, so the transports copy it like host memory.
#pragma once

#include <cstddef>

#include "gdx/types.hpp"

namespace gdx::p2p {

MemoryKind pointerKind(const void* p);

/// Copies `n` bytes of host memory `src` to `dst`, which lies in memory of `dstKind` (a plain memcpy for host memory,
/// for GPU memory a copy on a non-blocking stream waited for at most GDX_TIMEOUT_MS). Throws gdx::Error(kCuda) naming
/// `what` when the copy fails or does not finish in time.
void copyFromHost(void* dst, MemoryKind dstKind, const void* src, size_t n, const char* what);

}  // namespace gdx::p2p
