// WindowRegistry: the windows this rank registered and the windows each peer registered, by id. The proxy
// checks every command against it before anything is posted, so a bad window id or an offset past the end is
// rejected with a message instead of reaching the wire. Proxy threads check every command, so lookups take no
// lock: sizes are atomics (0 = not registered) written after the rest of an entry.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdx/types.hpp"

namespace gdx {

struct WindowInfo {
  void* base = nullptr;
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  bool valid = false;
};

/// True when [offset, offset + bytes) fits in a window of `windowBytes`, without overflow.
inline bool rangeFits(uint64_t offset, uint64_t bytes, uint64_t windowBytes) {
  return offset <= windowBytes && bytes <= windowBytes - offset;
}

class WindowRegistry {
 public:
  WindowRegistry(int rank, int worldSize, uint32_t maxWindows);

  void addLocal(uint32_t id, void* base, size_t bytes, MemoryKind kind);
  void removeLocal(uint32_t id);
  void addRemote(int peer, uint32_t id, size_t bytes);

  /// Empty when [offset, offset + bytes) lies inside local window `id`; otherwise why not.
  std::string checkLocal(uint32_t id, uint64_t offset, uint64_t bytes) const;
  /// Same for window `id` of `peer` (also checks that the peer exists).
  std::string checkRemote(int peer, uint32_t id, uint64_t offset, uint64_t bytes) const;
  /// The checks above without the message, inline for the proxy's per-command fast path.
  bool fitsLocal(uint32_t id, uint64_t offset, uint64_t bytes) const {
    const uint64_t size = id < maxWindows_ ? local_[id].bytes.load(std::memory_order_acquire) : 0;
    return size != 0 && rangeFits(offset, bytes, size);
  }
  bool fitsRemote(int peer, uint32_t id, uint64_t offset, uint64_t bytes) const {
    const uint64_t size = remoteBytes(peer, id);
    return size != 0 && rangeFits(offset, bytes, size);
  }
  WindowInfo local(uint32_t id) const;
  size_t remoteBytes(int peer, uint32_t id) const {
    if (peer < 0 || peer >= worldSize_ || id >= maxWindows_) return 0;
    return remote_[size_t(peer) * maxWindows_ + id].load(std::memory_order_acquire);
  }

  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }

 private:
  int rank_;
  int worldSize_;
  uint32_t maxWindows_;
  struct LocalEntry {
    void* base = nullptr;
    MemoryKind kind = MemoryKind::kHost;
    std::atomic<uint64_t> bytes{0};
  };
  std::mutex writeMutex_;
  std::unique_ptr<LocalEntry[]> local_;
  std::unique_ptr<std::atomic<uint64_t>[]> remote_;  // [peer * maxWindows + id] -> bytes; 0 = not registered
};

}  // namespace gdx
