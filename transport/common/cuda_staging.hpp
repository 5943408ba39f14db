// GPU windows for the transports, shared by all three: checking that a window really is CUDA memory (tcp, loopback,
// verbs), and copying chunks between it and host memory on a thread's own streams, with every wait bounded (tcp and
// loopback for every GPU window, verbs for the GPU windows it stages through registered host memory).
//
// The interface is plain C++ (no CUDA header), so the transports that use it stay plain C++; the CUDA code is in
// cuda_staging.cpp behind GDX_HAVE_CUDA. Built without CUDA, cudaWindowDevice() refuses every window and the
// copiers report that CUDA is missing (they are never reached then, since no GPU window can exist).
//
// Error convention: cudaWindowDevice() runs where throwing is fine (registration) and throws gdx::Error. The
// copiers run on transport threads and in post(), where a CUDA failure must become a failed peer or op rather
// than an exception, so they return "" on success and otherwise a message naming the call and the CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdx::common {

/// True when gdx was built with CUDA, i.e. GPU windows can be registered at all.
bool cudaStagingBuiltIn();

/// Checks that [base, base + bytes) is CUDA device memory (or managed memory) and returns the id of the device it
/// belongs to. Throws gdx::Error(kInvalidArgument) whose message starts with `who` when it is not (host memory,
/// the two ends on different devices, no CUDA device) or when gdx was built without CUDA.
int cudaWindowDevice(const void* base, size_t bytes, const std::string& who);

/// Copies between host and GPU memory with cudaMemcpyAsync on non-blocking streams it owns (one per device,
/// created on first use with that device current) and waits for each copy, bounded by `timeoutNs`. Owned and used
/// by one thread. A copy that does not finish in time may still be writing, so after a timeout the copier
/// refuses further copies and never frees its streams (nor CudaStaging its buffer).
class CudaCopier {
 public:
  explicit CudaCopier(uint64_t timeoutNs) : timeoutNs_(timeoutNs) {}
  ~CudaCopier();
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  /// Copies `bytes` from `src` to `dst` (device, managed or host memory in any combination: cudaMemcpyDefault
  /// with unified addressing) on the stream of `device` and waits until the copy finished. Returns "" or why it
  /// failed. The calling thread's current device is the same afterwards; a thread that had none keeps `device`.
  std::string copy(void* dst, const void* src, size_t bytes, int device);
  /// False after a copy timed out (see above).
  bool usable() const { return !wedged_; }

 private:
  const uint64_t timeoutNs_;
  std::vector<void*> streams_;  ///< index: device id; a cudaStream_t, or null until first used
  bool wedged_ = false;
};

/// A pinned host buffer of `chunkBytes` (cudaHostAlloc, portable, allocated on first use so that a transport
/// thread that never meets a GPU window pins nothing) and a CudaCopier: a transport thread stages one chunk at a
/// time through it between a GPU window and its socket. Owned and used by one thread.
class CudaStaging {
 public:
  CudaStaging(size_t chunkBytes, uint64_t timeoutNs) : chunkBytes_(chunkBytes), copier_(timeoutNs) {}
  ~CudaStaging();
  CudaStaging(const CudaStaging&) = delete;
  CudaStaging& operator=(const CudaStaging&) = delete;

  /// The staging buffer (chunkBytes long), allocated by the first call; null with `*why` set when that failed. A
  /// thread without a CUDA context selects `device` (the GPU of the window it stages for) before pinning.
  char* buffer(std::string* why, int device);
  /// Copies `bytes` (<= chunkBytes) from GPU memory `src` of `device` into the buffer and waits; "" or why not.
  std::string fromDevice(const void* src, size_t bytes, int device);
  /// Copies the first `bytes` of the buffer to GPU memory `dst` of `device` and waits; "" or why not.
  std::string toDevice(void* dst, size_t bytes, int device);

 private:
  const size_t chunkBytes_;
  char* buffer_ = nullptr;
  CudaCopier copier_;
};

}  // namespace gdx::common
