// The batched peer-copy kernel (include/gdx/peer_copy.hpp). Descriptors travel in the kernel's parameters,
// up to kBatch per launch; each descriptor is cut into chunks and the blocks walk the chunks of the whole
// batch grid-stride, each chunk copied by one block with device::copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "gdx/device/impl/copy.hpp"
#include "gdx/device/impl/ptx.hpp"
#include "gdx/peer_copy.hpp"

namespace gdx {
namespace {

constexpr int kBatch = 64;
constexpr int kThreads = 512;

struct Batch {
  PeerCopyDesc d[kBatch];
  uint64_t firstChunk[kBatch + 1];  // prefix sums of the chunk counts
  uint64_t chunkBytes;
  int n;
};

template <int kUnroll>
__global__ void __launch_bounds__(kThreads) peerCopyKernel(const __grid_constant__ Batch b) {
  const uint64_t total = b.firstChunk[b.n];
  int desc = 0;
  for (uint64_t c = blockIdx.x; c < total; c += gridDim.x) {
    while (b.firstChunk[desc + 1] <= c) ++desc;  // chunks are visited in increasing order
    const uint64_t off = (c - b.firstChunk[desc]) * b.chunkBytes;
    const uint64_t left = b.d[desc].bytes - off;
    device::copy<kUnroll>(device::Group{threadIdx.x, blockDim.x}, static_cast<char*>(b.d[desc].dst) + off,
                          static_cast<const char*>(b.d[desc].src) + off, left < b.chunkBytes ? left : b.chunkBytes);
  }
}

// Bulk mode: the body of each chunk (16-byte aligned on both sides) moves through shared memory with TMA bulk
// copies driven by thread 0 (kStages buffers of kStage bytes, loads completing on mbarriers, stores in bulk
// groups); heads, tails and chunks whose sides disagree modulo 16 are copied by the whole block.
constexpr int kBulkThreads = 128;
constexpr int kStages = 4;
constexpr uint32_t kStage = 16 * 1024;

__global__ void __launch_bounds__(kBulkThreads) peerCopyBulkKernel(const __grid_constant__ Batch b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kStages];
  if (threadIdx.x == 0)
    for (int i = 0; i < kStages; ++i) ptx::mbarrierInit(&bars[i], 1);
  __syncthreads();
  uint32_t parity = 0;  // bit i: the phase stage i waits for next
  uint64_t issued = 0;  // pieces issued by this block so far
  const uint64_t total = b.firstChunk[b.n];
  int desc = 0;
  for (uint64_t c = blockIdx.x; c < total; c += gridDim.x) {
    while (b.firstChunk[desc + 1] <= c) ++desc;
    const uint64_t off = (c - b.firstChunk[desc]) * b.chunkBytes;
    const uint64_t left = b.d[desc].bytes - off;
    const uint64_t n = left < b.chunkBytes ? left : b.chunkBytes;
    char* dst = static_cast<char*>(b.d[desc].dst) + off;
    const char* src = static_cast<const char*>(b.d[desc].src) + off;
    if (((reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 15) != 0 || n < 256) {
      device::copy<4>(device::Group{threadIdx.x, blockDim.x}, dst, src, n);
      continue;
    }
    const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    const uint64_t body = (n - head) & ~uint64_t{15};
    for (uint64_t i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
    for (uint64_t i = head + body + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    if (threadIdx.x == 0) {
      for (uint64_t p = 0; p < body; p += kStage, ++issued) {
        const uint32_t bytes = static_cast<uint32_t>(body - p < kStage ? body - p : kStage);
        const int s = static_cast<int>(issued % kStages);
        unsigned char* buf = smem + size_t(s) * kStage;
        if (issued >= kStages) ptx::bulkWaitRead<kStages - 1>();  // the store that last read `buf` is done reading
        ptx::bulkLoad(buf, src + head + p, bytes, &bars[s]);
        ptx::mbarrierWait(&bars[s], (parity >> s) & 1);
        parity ^= 1u << s;
        ptx::bulkStore(dst + head + p, buf, bytes);
      }
    }
  }
  if (threadIdx.x == 0) ptx::bulkWaitAll();
#endif
}

int smCount() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 132;
  return sms;
}

}  // namespace

cudaError_t peerCopy(const PeerCopyDesc* descs, size_t n, cudaStream_t stream, const PeerCopyOptions& options) {
  if (options.copyEngineFrom > 0) {
    // Large descriptors to the copy engines, the rest (in order) to the kernel.
    std::vector<PeerCopyDesc> small;
    for (size_t i = 0; i < n; ++i) {
      if (descs[i].bytes >= options.copyEngineFrom) {
        cudaError_t rc = cudaMemcpyAsync(descs[i].dst, descs[i].src, descs[i].bytes, cudaMemcpyDefault, stream);
        if (rc != cudaSuccess) return rc;
      } else {
        small.push_back(descs[i]);
      }
    }
    PeerCopyOptions kernelOnly = options;
    kernelOnly.copyEngineFrom = 0;
    return small.empty() ? cudaSuccess : peerCopy(small.data(), small.size(), stream, kernelOnly);
  }
  const int sms = smCount();
  for (size_t first = 0; first < n; first += kBatch) {
    Batch b{};
    b.n = static_cast<int>(std::min<size_t>(kBatch, n - first));
    uint64_t bytes = 0;
    for (int i = 0; i < b.n; ++i) bytes += descs[first + i].bytes;
    // About one chunk per block for small batches (at least 8 KiB), at most maxChunkBytes for large ones
    // (balance), a multiple of 16 so every chunk keeps the descriptor's alignment.
    // Bulk mode keeps kStages x kStage bytes of shared memory per block: at most 3 blocks per SM.
    const unsigned perSm =
        options.bulk ? std::min(3u, std::max(1u, options.blocksPerSm)) : std::max(1u, options.blocksPerSm);
    uint64_t maxBlocks = uint64_t(sms) * perSm;
    if (options.maxBlocks > 0) maxBlocks = std::min<uint64_t>(maxBlocks, options.maxBlocks);
    uint64_t chunk = bytes / maxBlocks;
    chunk = std::min<uint64_t>(std::max<uint64_t>(chunk, 8192), std::max<uint64_t>(options.maxChunkBytes, 8192)) &
            ~uint64_t{15};
    b.chunkBytes = chunk;
    b.firstChunk[0] = 0;
    for (int i = 0; i < b.n; ++i) {
      b.d[i] = descs[first + i];
      b.firstChunk[i + 1] = b.firstChunk[i] + (b.d[i].bytes + chunk - 1) / chunk;
    }
    const uint64_t chunks = b.firstChunk[b.n];
    if (chunks == 0) continue;
    const unsigned grid = static_cast<unsigned>(std::min<uint64_t>(chunks, maxBlocks));
    if (options.bulk) {
      // The shared-memory limit is set per device, once.
      static std::atomic<uint64_t> configured{0};
      int dev = 0;
      cudaGetDevice(&dev);
      const uint64_t bit = uint64_t{1} << (dev & 63);
      if (!(configured.load() & bit)) {
        cudaError_t rc =
            cudaFuncSetAttribute(peerCopyBulkKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kStages * kStage);
        if (rc != cudaSuccess) return rc;
        configured.fetch_or(bit);
      }
      peerCopyBulkKernel<<<grid, kBulkThreads, kStages * kStage, stream>>>(b);
    } else if (options.unroll >= 8)
      peerCopyKernel<8><<<grid, kThreads, 0, stream>>>(b);
    else
      peerCopyKernel<4><<<grid, kThreads, 0, stream>>>(b);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
  }
  return cudaSuccess;
}

bool enablePeerAccess(int peerDevice) {
  int dev = 0, can = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev == peerDevice) return true;
  if (cudaDeviceCanAccessPeer(&can, dev, peerDevice) != cudaSuccess || !can) {
    cudaGetLastError();
    return false;
  }
  cudaError_t rc = cudaDeviceEnablePeerAccess(peerDevice, 0);
  if (rc == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return true;
  }
  return rc == cudaSuccess;
}

}  // namespace gdx
