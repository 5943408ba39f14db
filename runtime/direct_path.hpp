// DirectPaths (internal to the Context): the direct path to peer GPUs of the same host. At setup every rank
// publishes its GPU's PCI bus id and a CUDA IPC handle of its device signal array; a peer on the same host
// whose GPU this one can address (the same GPU, or cudaDeviceCanAccessPeer) is reached directly, every other
// peer through the proxy (GDX_DIRECT=0 sends everything through the proxy). GPU windows travel as IPC handles
// of their allocation (found with cuMemGetAddressRange) plus the offset of the window inside it. Builds and
// does nothing without CUDA or without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/gpu.hpp"
#include "bootstrap/bootstrap.hpp"
#include "gdx/device/impl/direct.hpp"
#include "transport/transport.hpp"

namespace gdx {

class DirectPaths {
 public:
  /// Collective (one allGather over the whole job).
  DirectPaths(Bootstrap& bootstrap, const GpuInfo& gpu, uint32_t numSignals);
  ~DirectPaths();
  DirectPaths(const DirectPaths&) = delete;
  DirectPaths& operator=(const DirectPaths&) = delete;

  /// What a window's registration record carries for the direct path (empty: not a GPU window).
  std::string windowBlob(void* base, size_t bytes, MemoryKind kind) const;
  void addLocal(uint32_t id, void* base, size_t bytes, MemoryKind kind);
  void addRemote(int peer, uint32_t id, uint64_t bytes, const std::string& blob);
  /// Forgets window `id`, this rank's and every peer's, and closes the mappings no other window uses. This rank's
  /// kernels must be done with those windows; their owners may free the memory once every peer did this
  /// (Context::deregister).
  void removeWindow(uint32_t id);

  bool isDirect(int peer) const;
  /// The device table for `peer`; null: the proxy path.
  const DirectPeer* deviceTable(int peer) const;
  /// Calls f(table) with the host-side mirror of `peer`'s device table (null when `peer` is not direct), under
  /// the lock that window registration takes, and returns what f returns (the relay resolves requests with it).
  template <typename F>
  auto withPeerTable(int peer, F&& f) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = peers_.find(peer);
    return f(it == peers_.end() ? static_cast<const DirectPeer*>(nullptr) : &it->second.host);
  }
  /// This rank's device signal array (null without a GPU).
  uint64_t* deviceSignals() const { return deviceSignals_; }
  /// True when some peer may update the device signal array (a GPU rank on this host besides this one).
  bool mayReceive() const { return mayReceive_; }
  /// Reads / writes one device signal from the host (through a private non-blocking stream).
  uint64_t readSignal(uint32_t id) const;
  void writeSignal(uint32_t id, uint64_t value);

 private:
  struct Peer {
    DirectPeer host{};             // mirror of the device table
    DirectPeer* device = nullptr;  // the table kernels read
    void* signalMapping = nullptr;
    std::vector<std::string> windowKey;  // per window id: key into mappings_ (the allocation's IPC handle), "": none
  };
  void upload(Peer& p);
  void releaseMapping(int peer, const std::string& key);

  mutable std::mutex mutex_;  // window registration and deregistration may come from different threads
  int rank_ = 0;
  int device_ = -1;
  uint32_t numSignals_ = 0;
  uint64_t* deviceSignals_ = nullptr;
  bool mayReceive_ = false;
  void* stream_ = nullptr;     // cudaStream_t
  std::map<int, Peer> peers_;  // direct peers only
  // (peer, IPC handle of the allocation) -> (mapping, windows using it). Keyed by the handle, not the address: an
  // allocation freed and another made at the same address has a new handle, and must not find the old mapping.
  std::map<std::pair<int, std::string>, std::pair<void*, int>> mappings_;
};

}  // namespace gdx
