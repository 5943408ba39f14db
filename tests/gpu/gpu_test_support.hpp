// Shared by the GPU tests: skip cleanly without a GPU, check CUDA calls.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#define GDX_SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                         \
    int gdx_n_ = 0;                                                                            \
    cudaError_t gdx_rc_ = cudaGetDeviceCount(&gdx_n_);                                         \
    if (gdx_rc_ != cudaSuccess || gdx_n_ == 0) {                                               \
      cudaGetLastError();                                                                      \
      GTEST_SKIP() << "no GPU here (" << cudaGetErrorString(gdx_rc_) << "); GPU tests run on " \
                   << "an H100/H200 machine";                                                  \
    }                                                                                          \
  } while (0)

#include <cstdlib>
#include <string>

#include "gdx/error.hpp"
#include "support/test_support.hpp"

namespace gdx::test {
/// cudaMalloc memory of `bytes` on the current GPU, freed with the object.
struct GpuBuffer {
  explicit GpuBuffer(size_t bytes) : bytes(bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) throw Error(ErrorCode::kCuda, "cudaMalloc failed");
  }
  ~GpuBuffer() { cudaFree(p); }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
  void* p = nullptr;
  size_t bytes;
};

/// Makes this process a world of one for a Context (no fork: CUDA does not survive one).
inline void soloJobEnv() {
  setenv("GDX_RANK", "0", 1);
  setenv("GDX_WORLD_SIZE", "1", 1);
  setenv("GDX_LOCAL_RANK", "0", 1);
  setenv("GDX_MASTER_ADDR", "127.0.0.1", 1);
  setenv("GDX_MASTER_PORT", std::to_string(freePort()).c_str(), 1);
  setenv("GDX_JOB_SECRET", "gpu-test", 1);
}
}  // namespace gdx::test

/// Asserts that a CUDA call succeeded, naming the call and the error it returned. The message takes that error, not
/// a fresh cudaGetLastError(): after a failed launch checked with GDX_TEST_CUDA(cudaGetLastError()), that second call
/// read cudaSuccess and the message said "no error".
#define GDX_TEST_CUDA(expr)                                                                              \
  do {                                                                                                   \
    const cudaError_t gdxTestCudaStatus = (expr);                                                        \
    ASSERT_EQ(gdxTestCudaStatus, cudaSuccess) << #expr << ": " << cudaGetErrorString(gdxTestCudaStatus); \
  } while (0)
