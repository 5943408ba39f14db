#include "p2p/ipc.hpp"

#include <unistd.h>

#include <cstring>

#include "base/gpu.hpp"
#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/protocol.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "base/cuda_check.hpp"
#include "base/device_guard.hpp"
#endif

namespace gdx::p2p {

#if defined(GDX_HAVE_CUDA)

namespace {

/// Names this host for IPC descriptors: a handle opens only on the host that made it. Computed once: every copy
/// checks it, and a system call per copy is part of the fixed cost a small copy pays.
uint64_t hostId() {
  static const uint64_t id = [] {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return checksum(name, std::strlen(name));
  }();
  return id;
}

}  // namespace

IpcPeers::~IpcPeers() {
  for (auto& s : streams_) {
    DeviceGuard guard(s.first);
    cudaStreamDestroy(static_cast<cudaStream_t>(s.second));
  }
  for (auto& o : opened_) cudaIpcCloseMemHandle(o.second);
}

void* IpcPeers::streamFor(int device) {
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  cudaStream_t stream = nullptr;
  GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  streams_[device] = stream;
  return stream;
}

std::string IpcPeers::advertise(const void* ptr, size_t size, const std::string& who) {
  uintptr_t base = 0;
  size_t allocBytes = 0;
  if (!cudaAllocationRange(ptr, &base, &allocBytes))
    throw Error(ErrorCode::kInvalidArgument, who + ": advertiseIpc: the range is not GPU memory from cudaMalloc");
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    throw Error(ErrorCode::kInvalidArgument, who + ": advertiseIpc: the range is not device memory");
  }
  DeviceGuard guard(a.device);
  cudaIpcMemHandle_t h;
  cudaError_t rc = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kInvalidArgument, who + ": advertiseIpc: cudaIpcGetMemHandle: " + cudaGetErrorString(rc));
  }
  IpcDescriptor d;
  d.host = hostId();
  d.pid = static_cast<uint64_t>(getpid());
  d.device = a.device;
  static_assert(sizeof h == IpcDescriptor::kHandleBytes, "an IPC handle fills the descriptor's handle field");
  std::memcpy(d.handle, &h, sizeof h);
  d.allocBase = base;
  d.offset = reinterpret_cast<uintptr_t>(ptr) - base;
  d.bytes = size;
  return encodeIpc(d);
}

void* IpcPeers::open(const std::string& who, const void* handle, uint64_t pid, uint64_t allocBase) {
  auto key = std::make_pair(pid, allocBase);
  auto it = opened_.find(key);
  if (it != opened_.end()) return it->second;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof h);
  void* mapped = nullptr;
  cudaError_t rc = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kInvalidArgument,
                who + ": cudaIpcOpenMemHandle: " + cudaGetErrorString(rc) + " (the owner gone, or the same process)");
  }
  opened_[key] = mapped;
  return mapped;
}

void IpcPeers::copy(void* local, size_t size, const std::string& descriptor, uint64_t offset, bool toRemote,
                    const std::string& who) {
  IpcDescriptor d;
  std::string bad = decodeIpc(descriptor, &d);
  if (!bad.empty()) throw Error(ErrorCode::kInvalidArgument, who + ": " + bad);
  if (d.host != hostId())
    throw Error(ErrorCode::kInvalidArgument,
                who + ": the IPC descriptor comes from another host; IPC works on one host");
  if (size == 0 || offset > d.bytes || size > d.bytes - offset)
    throw Error(ErrorCode::kInvalidArgument, who + ": " + std::to_string(size) + " bytes at offset " +
                                                 std::to_string(offset) + " lie outside the advertised " +
                                                 std::to_string(d.bytes) + " bytes (nothing was copied)");
  std::lock_guard<std::mutex> lock(mutex_);
  const int device = localGpu_ >= 0 ? localGpu_ : d.device;
  DeviceGuard guard(device);
  char* remote = static_cast<char*>(open(who, d.handle, d.pid, d.allocBase)) + d.offset + offset;
  cudaStream_t stream = static_cast<cudaStream_t>(streamFor(device));
  cudaError_t rc = toRemote ? cudaMemcpyAsync(remote, local, size, cudaMemcpyDefault, stream)
                            : cudaMemcpyAsync(local, remote, size, cudaMemcpyDefault, stream);
  const uint64_t deadline = nowNs() + timeoutNs_;
  uint64_t spins = 0;
  // Polled until it is no longer "not ready" (the first query that says so ends the loop with that result).
  while (rc == cudaSuccess) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaErrorNotReady) {
      rc = q;
      break;
    }
    if (nowNs() >= deadline) {
      // The stream stays with the stuck copy (destroying it would not stop the copy); the next copy gets a new one.
      streams_.erase(device);
      GDX_ERROR(who << ": the IPC copy of " << size
                    << " bytes did not finish within GDX_TIMEOUT_MS; its stream is leaked");
      throw Error(ErrorCode::kTimeout,
                  who + ": the IPC copy of " + std::to_string(size) + " bytes did not finish within GDX_TIMEOUT_MS");
    }
    spinPause(++spins);
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kCuda, who + ": IPC copy of " + std::to_string(size) + " bytes: " + cudaGetErrorString(rc));
  }
}

#else

IpcPeers::~IpcPeers() = default;

std::string IpcPeers::advertise(const void*, size_t, const std::string& who) {
  throw Error(ErrorCode::kInvalidArgument, who + ": advertiseIpc needs gdx built with CUDA");
}

void IpcPeers::copy(void*, size_t, const std::string& descriptor, uint64_t, bool, const std::string& who) {
  IpcDescriptor d;
  std::string bad = decodeIpc(descriptor, &d);
  if (!bad.empty()) throw Error(ErrorCode::kInvalidArgument, who + ": " + bad);
  throw Error(ErrorCode::kInvalidArgument, who + ": IPC copies need gdx built with CUDA");
}

void* IpcPeers::open(const std::string&, const void*, uint64_t, uint64_t) {
  return nullptr;
}

#endif

}  // namespace gdx::p2p
