#include "base/host_buffer.hpp"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/log.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx {

int currentNumaNode() {
  if (numa_available() < 0) return 0;
  int cpu = sched_getcpu();
  int node = cpu >= 0 ? numa_node_of_cpu(cpu) : 0;
  return node >= 0 ? node : 0;
}

HostBuffer::HostBuffer(size_t bytes, int numaNode, bool mapForGpu) {
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "HostBuffer of 0 bytes");
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  bytes_ = bytes;
  if (numa_available() >= 0) {
    node_ = numaNode >= 0 ? numaNode : currentNumaNode();
    if (node_ > numa_max_node())
      throw Error(ErrorCode::kInvalidArgument, "NUMA node " + std::to_string(node_) + " does not exist (max " +
                                                   std::to_string(numa_max_node()) + ")");
    data_ = numa_alloc_onnode(mapped_, node_);
    if (!data_) throw SystemError("numa_alloc_onnode(" + std::to_string(mapped_) + ")", ENOMEM, __FILE__, __LINE__);
    numaAllocated_ = true;
  } else {
    data_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      throw SystemError("mmap(" + std::to_string(mapped_) + ")", errno, __FILE__, __LINE__);
    }
  }
  // Touch every page now so that it is placed (first touch) before any device maps it.
  std::memset(data_, 0, mapped_);
#if defined(GDX_HAVE_CUDA)
  if (mapForGpu) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      cudaError_t rc = cudaHostRegister(data_, mapped_, cudaHostRegisterMapped | cudaHostRegisterPortable);
      if (rc == cudaSuccess) {
        rc = cudaHostGetDevicePointer(&devicePtr_, data_, 0);
        if (rc != cudaSuccess) {
          cudaHostUnregister(data_);
          devicePtr_ = nullptr;
        }
      }
      if (rc != cudaSuccess) {
        GDX_WARN("cudaHostRegister of " << mapped_ << " bytes failed (" << cudaGetErrorString(rc)
                                        << "); the buffer is host-only");
        cudaGetLastError();
      }
    } else {
      cudaGetLastError();  // no GPU: clear the sticky "no device" error and stay host-only
    }
  }
#else
  (void)mapForGpu;
#endif
}

void HostBuffer::release() noexcept {
  if (!data_) return;
#if defined(GDX_HAVE_CUDA)
  if (devicePtr_) cudaHostUnregister(data_);
#endif
  if (numaAllocated_)
    numa_free(data_, mapped_);
  else
    munmap(data_, mapped_);
  data_ = nullptr;
  devicePtr_ = nullptr;
}

HostBuffer::~HostBuffer() {
  release();
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept {
  *this = std::move(o);
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    devicePtr_ = std::exchange(o.devicePtr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    node_ = o.node_;
    numaAllocated_ = o.numaAllocated_;
  }
  return *this;
}

}  // namespace gdx
