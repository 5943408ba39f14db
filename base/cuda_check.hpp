// GDX_CUDA_CHECK: throws gdx::CudaError naming the call, the status and file:line. Needs the CUDA runtime
// header, so it lives apart from error.hpp, which plain C++ code includes.
#pragma once

#include <cuda_runtime_api.h>

#include "gdx/error.hpp"

#define GDX_CUDA_CHECK(expr)                                                                                    \
  do {                                                                                                          \
    cudaError_t gdx_cuda_rc_ = (expr);                                                                          \
    if (gdx_cuda_rc_ != cudaSuccess)                                                                            \
      throw ::gdx::CudaError(#expr, static_cast<int>(gdx_cuda_rc_), cudaGetErrorString(gdx_cuda_rc_), __FILE__, \
                             __LINE__);                                                                         \
  } while (0)
