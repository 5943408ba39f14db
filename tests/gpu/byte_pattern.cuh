// Test helpers shared by the multi-GPU tests: a skip for machines without two peer GPUs, and deterministic
// random bytes that kernels fill and check on the GPU (so gigabytes are compared without host copies).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "gpu_test_support.hpp"

namespace gdx {
namespace {

#define GDX_SKIP_WITHOUT_TWO_PEER_GPUS()                                 \
  do {                                                                   \
    GDX_SKIP_WITHOUT_GPU();                                              \
    int n_ = 0, can_ = 0;                                                \
    cudaGetDeviceCount(&n_);                                             \
    if (n_ < 2) GTEST_SKIP() << "needs two GPUs, " << n_ << " here";     \
    cudaDeviceCanAccessPeer(&can_, 0, 1);                                \
    if (!can_) GTEST_SKIP() << "GPUs 0 and 1 cannot address each other"; \
  } while (0)

// Deterministic random bytes from (seed, index): both processes can compute what the other put.
__host__ __device__ inline unsigned char byteAt(uint64_t seed, uint64_t i) {
  uint64_t x = (i >> 3) * 0x9E3779B97F4A7C15ull ^ seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x >> (8 * (i & 7)));
}

__global__ void fillKernel(unsigned char* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = byteAt(seed, i);
}

// Counts bytes of got[0..n) that differ from byteAt(seed, srcOffset + i) (a copy of the filled source).
__global__ void checkKernel(const unsigned char* got, uint64_t n, uint64_t seed, uint64_t srcOffset,
                            unsigned long long* bad) {
  unsigned long long mine = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    mine += got[i] != byteAt(seed, srcOffset + i);
  if (mine) atomicAdd(bad, mine);
}

__global__ void checkValueKernel(const unsigned char* got, uint64_t n, unsigned char v, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    mine += got[i] != v;
  if (mine) atomicAdd(bad, mine);
}

inline unsigned long long countBad(const unsigned char* got, uint64_t n, uint64_t seed, uint64_t srcOffset) {
  unsigned long long* bad = nullptr;
  cudaHostAlloc(&bad, 8, cudaHostAllocMapped);
  *bad = 0;
  checkKernel<<<264, 512>>>(got, n, seed, srcOffset, bad);
  cudaDeviceSynchronize();
  unsigned long long b = *bad;
  cudaFreeHost(bad);
  return b;
}
inline unsigned long long countNot(const unsigned char* got, uint64_t n, unsigned char v) {
  unsigned long long* bad = nullptr;
  cudaHostAlloc(&bad, 8, cudaHostAllocMapped);
  *bad = 0;
  if (n) checkValueKernel<<<264, 512>>>(got, n, v, bad);
  cudaDeviceSynchronize();
  unsigned long long b = *bad;
  cudaFreeHost(bad);
  return b;
}

}  // namespace
}  // namespace gdx
