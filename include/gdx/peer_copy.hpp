// Batched peer copy: one launch copies a batch of (src, dst, bytes) descriptors (those of 16 MiB and more go to the
// copy engines by default, PeerCopyOptions::copyEngineFrom), typically from this GPU to
// another GPU of the same host over NVLink, with SM loads and stores (16-byte vectors where src and dst agree
// modulo 16, four loads in flight per thread, unaligned heads and tails byte by byte) spread over many blocks.
// dst (or src) on another GPU must be reachable from the current device: peer access enabled
// (gdx::enablePeerAccess) or memory mapped through CUDA IPC. Descriptors must not overlap each other's dst.
// Asynchronous on `stream`; errors of the launch come back as the CUDA status.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx {

struct PeerCopyDesc {
  const void* src;
  void* dst;
  uint64_t bytes;
};

/// How the work is spread; the defaults suit H200 pairs over NVLink (see docs/PERFORMANCE.md).
struct PeerCopyOptions {
  unsigned blocksPerSm = 2;            ///< grid = at most this many blocks per SM (512 threads each)
  uint64_t maxChunkBytes = 64 * 1024;  ///< a block copies chunks of at most this size, grid-stride
  unsigned unroll = 4;                 ///< 16-byte vectors in flight per thread: 4 or 8
  bool bulk = false;                   ///< TMA bulk copies through shared memory (sm_90) instead of SM loads/stores
  unsigned maxBlocks = 0;              ///< cap on the grid (0: blocksPerSm x SMs)
  /// Descriptors of at least this many bytes go to the copy engines (cudaMemcpyAsync on `stream`) instead of the
  /// kernel, which also leaves the SMs free (0: never). On H200 pairs the copy engines move large transfers ~7 %
  /// faster over NVLink than any SM-driven copy, the kernel wins below a few MiB (docs/PERFORMANCE.md).
  uint64_t copyEngineFrom = uint64_t{16} << 20;
};

#if defined(GDX_HAVE_CUDA)
/// Enqueues the copies of `descs[0..n)` (a host array, read before the call returns) on `stream`.
cudaError_t peerCopy(const PeerCopyDesc* descs, size_t n, cudaStream_t stream, const PeerCopyOptions& options = {});
/// Lets the current device address `peerDevice`'s memory (idempotent); false where the hardware cannot.
bool enablePeerAccess(int peerDevice);
#endif

}  // namespace gdx
