// The CUDA IPC forms of the endpoint: a descriptor that names a range of a GPU allocation by its IPC handle, and
// the copies a process on the same host makes into or out of it (cudaMemcpyAsync between the mapped allocation and
// local memory, over NVLink where the GPUs have it), bounded by GDX_TIMEOUT_MS. Opened handles are cached per
// (owner process, allocation) and closed with the endpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gdx/types.hpp"

namespace gdx::p2p {

class IpcPeers {
 public:
  explicit IpcPeers(int localGpu, uint64_t timeoutNs) : localGpu_(localGpu), timeoutNs_(timeoutNs) {}
  ~IpcPeers();
  /// A descriptor for [ptr, ptr + size) of GPU memory; throws kInvalidArgument for host memory or without CUDA.
  std::string advertise(const void* ptr, size_t size, const std::string& who);
  /// Copies between local memory and the advertised range at `offset`; `toRemote`: local -> remote.
  void copy(void* local, size_t size, const std::string& descriptor, uint64_t offset, bool toRemote,
            const std::string& who);

 private:
  void* open(const std::string& who, const void* handle, uint64_t pid, uint64_t allocBase);
  /// The copy stream of `device` (made on first use, kept: making and destroying one costs microseconds a call).
  void* streamFor(int device);
  const int localGpu_;
  const uint64_t timeoutNs_;
  std::mutex mutex_;
  std::map<std::pair<uint64_t, uint64_t>, void*> opened_;  ///< (owner pid, allocation base) -> mapping
  std::map<int, void*> streams_;                           ///< device -> its cudaStream_t
};

}  // namespace gdx::p2p
