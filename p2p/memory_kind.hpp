// Where a pointer handed to reg() lives: host memory, or device memory of a GPU (cudaPointerGetAttributes in a CUDA
// build). Managed memory counts as host memory: the CPU may touch it, so the transports copy it like host memory.
#pragma once

#include "gdx/types.hpp"

namespace gdx::p2p {

MemoryKind pointerKind(const void* p);

}  // namespace gdx::p2p
