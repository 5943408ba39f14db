// CUDA side of cuda_staging.hpp. Without GDX_HAVE_CUDA only the refusals are compiled.
#include "transport/common/cuda_staging.hpp"

#include <sstream>

#include "base/log.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "base/cuda_check.hpp"
#include "base/gpu.hpp"
#include "gdx/device/impl/clock.hpp"
#endif

namespace gdx::common {

#if defined(GDX_HAVE_CUDA)

namespace {

/// "call failed: cudaErrorX (text)"; also clears the thread's last (non-sticky) error, which has been reported.
std::string cudaFailure(const std::string& call, cudaError_t rc) {
  std::ostringstream os;
  os << call << " failed: " << cudaGetErrorName(rc) << " (" << cudaGetErrorString(rc) << ")";
  (void)cudaGetLastError();
  return os.str();
}

const char* memoryTypeName(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "unregistered host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "memory of an unknown type";
}

/// The device that the byte at `p` belongs to; throws kInvalidArgument when it is not device or managed memory.
int deviceOf(const void* p, const std::string& who, const char* which) {
  cudaPointerAttributes attr{};
  cudaError_t rc = cudaPointerGetAttributes(&attr, p);
  if (rc != cudaSuccess)
    throw Error(ErrorCode::kInvalidArgument, who + ": cannot tell which GPU the " + which +
                                                 " byte of the window belongs to (is a GPU visible?): " +
                                                 cudaFailure("cudaPointerGetAttributes", rc));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    throw Error(ErrorCode::kInvalidArgument, who + ": registered as MemoryKind::kCuda, but its " + which + " byte is " +
                                                 memoryTypeName(attr.type) +
                                                 "; register host memory as MemoryKind::kHost");
  return attr.device;
}

}  // namespace

bool cudaStagingBuiltIn() {
  return true;
}

int cudaWindowDevice(const void* base, size_t bytes, const std::string& who) {
  if (bytes == 0) return -1;  // nothing to copy, ever: every access to it fails the range check
  if (base == nullptr) throw Error(ErrorCode::kInvalidArgument, who + ": null base");
  int first = deviceOf(base, who, "first");
  int last = deviceOf(static_cast<const char*>(base) + bytes - 1, who, "last");
  if (first != last)
    throw Error(ErrorCode::kInvalidArgument, who + ": starts on GPU " + std::to_string(first) + " but ends on GPU " +
                                                 std::to_string(last) + "; a window must lie on one GPU");
  return first;
}

CudaCopier::~CudaCopier() {
  if (wedged_) {
    GDX_WARN("GPU staging: a copy did not finish in time; its " << streams_.size()
                                                                << " stream slots are left allocated");
    return;
  }
  for (void* s : streams_) {
    if (s == nullptr) continue;
    cudaError_t rc = cudaStreamDestroy(static_cast<cudaStream_t>(s));
    if (rc != cudaSuccess && rc != cudaErrorCudartUnloading)
      GDX_WARN("GPU staging: " << cudaFailure("cudaStreamDestroy", rc));
  }
}

std::string CudaCopier::copy(void* dst, const void* src, size_t bytes, int device) {
  std::ostringstream what;
  what << "copying " << bytes << " bytes between host memory and GPU " << device;
  if (wedged_) return what.str() + ": an earlier GPU copy of this thread did not finish in time";
  if (device < 0) return what.str() + ": no such GPU";
  // -1: this thread has no CUDA context yet (a transport thread's first copy); it then keeps `device` afterwards
  // instead of "restoring" device 0, which would create a context on GPU 0 (base/gpu.hpp).
  const int current = cudaThreadDevice();
  cudaError_t rc = cudaSuccess;
  if (current != device && (rc = cudaSetDevice(device)) != cudaSuccess)
    return what.str() + ": " + cudaFailure("cudaSetDevice(" + std::to_string(device) + ")", rc);

  std::string why;
  if (static_cast<size_t>(device) >= streams_.size()) streams_.resize(static_cast<size_t>(device) + 1, nullptr);
  if (streams_[device] == nullptr) {
    cudaStream_t s = nullptr;
    rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
      streams_[device] = s;
    else
      why = cudaFailure("cudaStreamCreateWithFlags", rc);
  }
  if (why.empty()) {
    auto stream = static_cast<cudaStream_t>(streams_[device]);
    rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    if (rc != cudaSuccess) why = cudaFailure("cudaMemcpyAsync", rc);
    // Bounded instead of cudaStreamSynchronize: a wedged GPU must fail the operation, not hang the thread.
    const uint64_t deadline = nowNs() + timeoutNs_;
    for (uint64_t spins = 0; why.empty(); ++spins) {
      rc = cudaStreamQuery(stream);
      if (rc == cudaSuccess) break;
      if (rc != cudaErrorNotReady) {
        why = cudaFailure("cudaStreamQuery", rc);
      } else if (nowNs() > deadline) {
        wedged_ = true;
        why = "the copy did not finish within " + std::to_string(timeoutNs_ / 1000000) + " ms";
      }
      spinPause(spins);
    }
  }
  if (current >= 0 && current != device && (rc = cudaSetDevice(current)) != cudaSuccess && why.empty())
    why = cudaFailure("cudaSetDevice(" + std::to_string(current) + ")", rc);
  return why.empty() ? why : what.str() + ": " + why;
}

CudaStaging::~CudaStaging() {
  if (buffer_ == nullptr) return;
  if (!copier_.usable()) {
    GDX_WARN("GPU staging: a copy did not finish in time; its pinned buffer of " << chunkBytes_
                                                                                 << " bytes is left allocated");
    return;
  }
  cudaError_t rc = cudaFreeHost(buffer_);
  if (rc != cudaSuccess && rc != cudaErrorCudartUnloading) GDX_WARN("GPU staging: " << cudaFailure("cudaFreeHost", rc));
}

char* CudaStaging::buffer(std::string* why, int device) {
  if (buffer_ != nullptr) return buffer_;
  // On a transport thread this is the first CUDA call: without a device of its own the runtime would make device 0's
  // context for it, on the GPU of another rank.
  cudaError_t rc = cudaSuccess;
  if (device >= 0 && cudaThreadDevice() < 0 && (rc = cudaSetDevice(device)) != cudaSuccess) {
    *why = "selecting GPU " + std::to_string(device) + " for the staging buffer: " + cudaFailure("cudaSetDevice", rc);
    return nullptr;
  }
  void* p = nullptr;
  rc = cudaHostAlloc(&p, chunkBytes_, cudaHostAllocPortable);
  if (rc != cudaSuccess) {
    *why = "allocating a pinned staging buffer of " + std::to_string(chunkBytes_) +
           " bytes: " + cudaFailure("cudaHostAlloc", rc);
    return nullptr;
  }
  buffer_ = static_cast<char*>(p);
  return buffer_;
}

std::string CudaStaging::fromDevice(const void* src, size_t bytes, int device) {
  std::string why;
  char* b = buffer(&why, device);
  if (b == nullptr) return why;
  if (bytes > chunkBytes_) return "a chunk of " + std::to_string(bytes) + " bytes exceeds the staging buffer";
  return copier_.copy(b, src, bytes, device);
}

std::string CudaStaging::toDevice(void* dst, size_t bytes, int device) {
  if (buffer_ == nullptr) return "the staging buffer was never filled";
  if (bytes > chunkBytes_) return "a chunk of " + std::to_string(bytes) + " bytes exceeds the staging buffer";
  return copier_.copy(dst, buffer_, bytes, device);
}

#else  // !GDX_HAVE_CUDA

namespace {
const char kNoCuda[] = "gdx was built without CUDA";
}

bool cudaStagingBuiltIn() {
  return false;
}

int cudaWindowDevice(const void*, size_t, const std::string& who) {
  throw Error(ErrorCode::kInvalidArgument,
              who + ": CUDA windows are not supported: " + kNoCuda + "; register host memory (MemoryKind::kHost)");
}

CudaCopier::~CudaCopier() = default;
std::string CudaCopier::copy(void*, const void*, size_t, int) {
  return kNoCuda;
}
CudaStaging::~CudaStaging() = default;
char* CudaStaging::buffer(std::string* why, int) {
  *why = kNoCuda;
  return nullptr;
}
std::string CudaStaging::fromDevice(const void*, size_t, int) {
  return kNoCuda;
}
std::string CudaStaging::toDevice(void*, size_t, int) {
  return kNoCuda;
}

#endif  // GDX_HAVE_CUDA

}  // namespace gdx::common
