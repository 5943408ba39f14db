// HostBuffer: page-aligned, zeroed host memory placed on one NUMA node (libnuma) and, when CUDA is present
// and a GPU is visible, registered as mapped pinned memory so that kernels can read and write it. Rings,
// signals and staging buffers are HostBuffers.
#pragma once

#include <cstddef>

namespace gdx {

class HostBuffer {
 public:
  /// numaNode < 0: the node of the calling thread. mapForGpu: register with cudaHostRegister(Mapped) when
  /// possible; where it is not (no CUDA, no GPU) the buffer is still usable from host threads.
  HostBuffer(size_t bytes, int numaNode, bool mapForGpu);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  /// The address kernels use, or nullptr when the buffer is not mapped for the GPU.
  void* devicePtr() const { return devicePtr_; }
  bool gpuMapped() const { return devicePtr_ != nullptr; }
  /// The address kernels use for `hostAddress`, a pointer into this buffer (the buffer must be gpuMapped()).
  template <typename T>
  T* deviceAddressOf(T* hostAddress) const {
    return reinterpret_cast<T*>(static_cast<char*>(devicePtr_) +
                                (reinterpret_cast<char*>(hostAddress) - static_cast<char*>(data_)));
  }
  /// The node the memory was placed on (-1 where NUMA is not available).
  int numaNode() const { return node_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  void* devicePtr_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // bytes actually mmapped (rounded to pages)
  int node_ = -1;
  bool numaAllocated_ = false;
};

/// The NUMA node of the CPU the calling thread runs on (0 where NUMA is not available).
int currentNumaNode();

}  // namespace gdx
