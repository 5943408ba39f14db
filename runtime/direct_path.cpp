#include "runtime/direct_path.hpp"

#include <algorithm>
#include <cstring>

#include "base/gpu.hpp"
#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda.h>  // types only: the driver is reached through cudaGetDriverEntryPointByVersion, never linked
#include <cuda_runtime_api.h>

#include "base/cuda_check.hpp"
#include "base/device_guard.hpp"
#endif

namespace gdx {

namespace {
CollectiveTag directPathTag() {
  CollectiveTag tag;
  tag.kind = "Context: direct path";
  return tag;
}
}  // namespace

#if defined(GDX_HAVE_CUDA)
namespace {

struct SetupRecord {
  uint8_t hasGpu;
  char busId[32];
  uint32_t numSignals;
  cudaIpcMemHandle_t signals;
};

struct WindowBlob {
  cudaIpcMemHandle_t
      handle;       // of the allocation: identifies it (a new allocation at a freed one's address has a new one)
  uint64_t offset;  // of the window inside the allocation
};

}  // namespace
#endif

DirectPaths::DirectPaths(Bootstrap& bootstrap, const GpuInfo& gpu, uint32_t numSignals)
    : rank_(bootstrap.rank()), device_(gpu.device), numSignals_(numSignals) {
#if defined(GDX_HAVE_CUDA)
  SetupRecord mine{};
  if (gpu.present()) {
    DeviceGuard guard(device_);
    GDX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&deviceSignals_), size_t{numSignals} * 8));
    GDX_CUDA_CHECK(cudaMemset(deviceSignals_, 0, size_t{numSignals} * 8));
    cudaStream_t s = nullptr;
    GDX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = s;
    GDX_CUDA_CHECK(cudaDeviceSynchronize());
    mine.hasGpu = 1;
    std::strncpy(mine.busId, gpu.pciBusId.c_str(), sizeof mine.busId - 1);
    mine.numSignals = numSignals;
    if (cudaIpcGetMemHandle(&mine.signals, deviceSignals_) != cudaSuccess) {
      cudaGetLastError();
      mine.hasGpu = 0;  // no IPC (e.g. a GPU that does not support it): nobody reaches this rank directly
    }
  }
  std::vector<std::string> all =
      bootstrap.allGather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine), directPathTag());
  if (!gpu.present()) return;
  const bool enabled = envBool("GDX_DIRECT", true);
  DeviceGuard guard(device_);
  for (int p : bootstrap.hostRanks()) {
    if (p == rank_) continue;
    SetupRecord r{};
    if (all[p].size() != sizeof r)
      throw Error(ErrorCode::kProtocol, "direct-path record from rank " + std::to_string(p) + " is truncated");
    std::memcpy(&r, all[p].data(), sizeof r);
    // The bus id is read as a C string (CUDA, the log): a record without its terminator must not run past it.
    r.busId[sizeof r.busId - 1] = '\0';
    if (!r.hasGpu) {
      GDX_INFO("peer " << p << ": proxy path (no GPU reachable through CUDA IPC there)");
      continue;
    }
    mayReceive_ = true;
    if (!enabled) {
      GDX_INFO("peer " << p << ": proxy path (GDX_DIRECT=0)");
      continue;
    }
    int peerDev = -1, can = 0;
    if (cudaDeviceGetByPCIBusId(&peerDev, r.busId) != cudaSuccess) {
      cudaGetLastError();
      GDX_INFO("peer " << p << ": proxy path (its GPU " << r.busId << " is not visible here)");
      continue;
    }
    if (peerDev != device_ && (cudaDeviceCanAccessPeer(&can, device_, peerDev) != cudaSuccess || !can)) {
      cudaGetLastError();
      GDX_INFO("peer " << p << ": proxy path (GPU " << device_ << " cannot access GPU " << peerDev << ")");
      continue;
    }
    void* mapped = nullptr;
    cudaError_t rc = cudaIpcOpenMemHandle(&mapped, r.signals, cudaIpcMemLazyEnablePeerAccess);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      GDX_WARN("peer " << p << ": proxy path (cudaIpcOpenMemHandle of its signals: " << cudaGetErrorString(rc) << ")");
      continue;
    }
    Peer& peer = peers_[p];
    peer.signalMapping = mapped;
    peer.host.peerSignals = static_cast<uint64_t*>(mapped);
    peer.host.peerNumSignals = r.numSignals;
    peer.windowKey.assign(kMaxWindows, std::string());
    GDX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&peer.device), sizeof(DirectPeer)));
    upload(peer);
    GDX_INFO("peer " << p << ": direct path over "
                     << (peerDev == device_ ? "the same GPU" : "peer access (NVLink/PCIe)") << ", GPU " << device_
                     << " -> GPU " << peerDev << " (" << r.busId << ")");
  }
#else
  (void)gpu;
  (void)numSignals;
  bootstrap.allGather(std::string(), directPathTag());
#endif
}

DirectPaths::~DirectPaths() {
#if defined(GDX_HAVE_CUDA)
  if (device_ < 0) return;
  DeviceGuard guard(device_);
  for (auto& m : mappings_) cudaIpcCloseMemHandle(m.second.first);
  for (auto& p : peers_) {
    if (p.second.signalMapping) cudaIpcCloseMemHandle(p.second.signalMapping);
    cudaFree(p.second.device);
  }
  if (deviceSignals_) cudaFree(deviceSignals_);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaGetLastError();
#endif
}

std::string DirectPaths::windowBlob(void* base, size_t bytes, MemoryKind kind) const {
#if defined(GDX_HAVE_CUDA)
  // No GPU rank on this host besides this one: nobody could map the window (and its destruction need not wait).
  if (device_ < 0 || kind != MemoryKind::kCuda || !mayReceive_) return {};
  DeviceGuard guard(device_);
  uintptr_t allocBase = 0;
  size_t allocBytes = 0;
  if (!cudaAllocationRange(base, &allocBase, &allocBytes)) return {};
  WindowBlob b{};
  if (cudaIpcGetMemHandle(&b.handle, reinterpret_cast<void*>(allocBase)) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  b.offset = reinterpret_cast<uintptr_t>(base) - allocBase;
  if (b.offset + bytes > allocBytes) return {};
  return std::string(reinterpret_cast<const char*>(&b), sizeof b);
#else
  (void)base, (void)bytes, (void)kind;
  return {};
#endif
}

void DirectPaths::addLocal(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
#if defined(GDX_HAVE_CUDA)
  if (peers_.empty() || id >= kMaxWindows) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // A source must be addressable by kernels: device memory, or host memory CUDA mapped.
  char* dev = nullptr;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, base) == cudaSuccess) {
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
      dev = static_cast<char*>(base);
    else if (a.type == cudaMemoryTypeHost && a.devicePointer)
      dev = static_cast<char*>(a.devicePointer);
  }
  cudaGetLastError();
  (void)kind;
  for (auto& p : peers_) {
    p.second.host.localBase[id] = dev;
    p.second.host.localBytes[id] = dev ? bytes : 0;
    upload(p.second);
  }
#else
  (void)id, (void)base, (void)bytes, (void)kind;
#endif
}

void DirectPaths::removeWindow(uint32_t id) {
  if (id >= kMaxWindows || peers_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
#if defined(GDX_HAVE_CUDA)
  DeviceGuard guard(device_);
#endif
  for (auto& [peer, p] : peers_) {
    p.host.localBase[id] = nullptr;
    p.host.localBytes[id] = 0;
    p.host.peerBase[id] = nullptr;
    p.host.peerBytes[id] = 0;
    // The table first: a put naming the window now takes the proxy path (which the owner's transport refuses)
    // before the mapping it used goes away.
    upload(p);
    if (!p.windowKey[id].empty()) releaseMapping(peer, p.windowKey[id]);
    p.windowKey[id].clear();
  }
}

void DirectPaths::releaseMapping(int peer, const std::string& key) {
#if defined(GDX_HAVE_CUDA)
  auto it = mappings_.find({peer, key});
  if (it == mappings_.end()) return;
  if (--it->second.second == 0) {
    cudaIpcCloseMemHandle(it->second.first);
    cudaGetLastError();
    mappings_.erase(it);
  }
#else
  (void)peer, (void)key;
#endif
}

void DirectPaths::addRemote(int peer, uint32_t id, uint64_t bytes, const std::string& blob) {
#if defined(GDX_HAVE_CUDA)
  auto pit = peers_.find(peer);
  if (pit == peers_.end() || id >= kMaxWindows) return;
  Peer& p = pit->second;
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceGuard guard(device_);
  if (!p.windowKey[id].empty()) releaseMapping(peer, p.windowKey[id]);
  p.windowKey[id].clear();
  p.host.peerBase[id] = nullptr;
  p.host.peerBytes[id] = 0;
  WindowBlob b{};
  if (blob.size() == sizeof b) {
    std::memcpy(&b, blob.data(), sizeof b);
    auto key = std::make_pair(peer, std::string(reinterpret_cast<const char*>(&b.handle), sizeof b.handle));
    auto it = mappings_.find(key);
    void* mapped = nullptr;
    if (it != mappings_.end()) {
      mapped = it->second.first;
      ++it->second.second;
    } else {
      cudaError_t rc = cudaIpcOpenMemHandle(&mapped, b.handle, cudaIpcMemLazyEnablePeerAccess);
      if (rc != cudaSuccess) {
        cudaGetLastError();
        GDX_WARN("window " << id << " of peer " << peer
                           << " goes through the proxy: cudaIpcOpenMemHandle: " << cudaGetErrorString(rc));
        mapped = nullptr;
      } else {
        mappings_[key] = {mapped, 1};
      }
    }
    if (mapped) {
      p.windowKey[id] = key.second;
      p.host.peerBase[id] = static_cast<char*>(mapped) + b.offset;
      p.host.peerBytes[id] = bytes;
    }
  }
  upload(p);
#else
  (void)peer, (void)id, (void)bytes, (void)blob;
#endif
}

void DirectPaths::upload(Peer& p) {
#if defined(GDX_HAVE_CUDA)
  DeviceGuard guard(device_);
  auto s = static_cast<cudaStream_t>(stream_);
  GDX_CUDA_CHECK(cudaMemcpyAsync(p.device, &p.host, sizeof(DirectPeer), cudaMemcpyHostToDevice, s));
  GDX_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)p;
#endif
}

bool DirectPaths::isDirect(int peer) const {
  return peers_.count(peer) != 0;
}

const DirectPeer* DirectPaths::deviceTable(int peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? nullptr : it->second.device;
}

uint64_t DirectPaths::readSignal(uint32_t id) const {
#if defined(GDX_HAVE_CUDA)
  if (!deviceSignals_ || id >= numSignals_) return 0;
  DeviceGuard guard(device_);
  uint64_t v = 0;
  auto s = static_cast<cudaStream_t>(stream_);
  GDX_CUDA_CHECK(cudaMemcpyAsync(&v, deviceSignals_ + id, 8, cudaMemcpyDeviceToHost, s));
  GDX_CUDA_CHECK(cudaStreamSynchronize(s));
  return v;
#else
  (void)id;
  return 0;
#endif
}

void DirectPaths::writeSignal(uint32_t id, uint64_t value) {
#if defined(GDX_HAVE_CUDA)
  if (!deviceSignals_ || id >= numSignals_) return;
  DeviceGuard guard(device_);
  auto s = static_cast<cudaStream_t>(stream_);
  GDX_CUDA_CHECK(cudaMemcpyAsync(deviceSignals_ + id, &value, 8, cudaMemcpyHostToDevice, s));
  GDX_CUDA_CHECK(cudaStreamSynchronize(s));
#else
  (void)id, (void)value;
#endif
}

}  // namespace gdx
