// The window tables of a transport: the windows it registered and those its peers told it about, under one
// reader-writer lock, with the lookups every backend makes before it moves a byte (the window is known, the range
// lies in it, an atomic's word is not GPU memory). Also the registration steps all backends share, and the text keys
// of the backends that address windows by id (tcp, loopback).
//
// Locking: the table's methods do not lock. Callers hold mutex(): shared to look up (and for as long as they use
// what a lookup returned, since deregistration erases it), exclusive to change. So a backend can guard more of its
// own state with the same lock (verbs: its receive staging area).
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gdx/error.hpp"
#include "gdx/types.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/transport.hpp"

namespace gdx::common {

/// What every backend keeps of a window it registered.
struct LocalWindow {
  char* base = nullptr;
  uint64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;                             ///< kCuda: the GPU it lies on (cudaPointerGetAttributes at registration)
  RemoteAccess access = RemoteAccess::kWrite;  ///< what peers may do to it (Transport::setRemoteAccess())
};

/// What every backend keeps of a peer's window.
struct RemoteWindow {
  uint64_t bytes = 0;
  bool cuda = false;  ///< the peer registered it as GPU memory (its key says so)
  uint8_t skew = 0;   ///< its base address modulo 8 in the peer's memory: offsets that make an atomic word aligned
};

/// Refuses what no backend registers: an unknown memory kind, a null base with bytes. Throws
/// Error(kInvalidArgument) "<w>: ..." where `w` names the window ("TCP transport rank 0: window 3").
void checkWindowArguments(const std::string& w, const void* base, size_t bytes, MemoryKind kind);

/// checkWindowArguments(), then the LocalWindow of a backend that copies with the CPU or CUDA (tcp, loopback): for
/// kCuda the GPU the memory lies on (throws unless it is GPU memory, or when gdx was built without CUDA).
LocalWindow cpuWindow(const std::string& w, void* base, size_t bytes, MemoryKind kind);

/// The key of a window that peers address by id and offset only ("tcp:3:4096", "loopback:3:4096:cuda"): it restates
/// the window for checking, plus whether it is GPU memory (which the sender needs to refuse atomics on it).
/// `base` adds ":skewN" when the base address is N (1..7) bytes past an 8-byte boundary, so that the sender refuses
/// an atomic the receiver could not apply to an aligned word.
std::string windowKey(const char* scheme, uint32_t id, uint64_t bytes, bool cuda, const void* base = nullptr);

/// The RemoteWindow that `key` (made by windowKey() with `scheme`) describes; an empty key (tests, tools) describes a
/// host window. Throws Error(kInvalidArgument) "<who>: key '...' of peer P does not describe window N of B bytes".
RemoteWindow parseWindowKey(const std::string& who, const char* scheme, int peer, uint32_t id, uint64_t bytes,
                            const std::string& key);

/// The windows of one transport. `Local` and `Remote` are LocalWindow and RemoteWindow or extend them.
template <class Local = LocalWindow, class Remote = RemoteWindow>
class WindowTable {
 public:
  /// Both windows of a write, as findWrite() returns them.
  struct WriteEnds {
    const Local* local = nullptr;
    const Remote* remote = nullptr;
  };

  std::shared_mutex& mutex() const { return mutex_; }

  /// Makes room for the windows of `peers` ranks; called once, by the transport's constructor.
  void setPeers(int peers) { remote_.resize(static_cast<size_t>(peers)); }

  /// Adds local window `id` (exclusive lock); throws Error(kInvalidArgument) "<w> is already registered".
  void addLocal(uint32_t id, Local window, const std::string& w) {
    if (!local_.emplace(id, std::move(window)).second)
      throw Error(ErrorCode::kInvalidArgument, w + " is already registered");
  }
  /// Removes local window `id` (exclusive lock); throws Error(kInvalidArgument) "<who>: window N is not registered".
  void removeLocal(uint32_t id, const std::string& who) {
    if (local_.erase(id) == 0)
      throw Error(ErrorCode::kInvalidArgument, who + ": window " + std::to_string(id) + " is not registered");
  }
  /// Removes every local window (exclusive lock).
  void clearLocal() { local_.clear(); }
  /// Adds or replaces window `id` of `peer` (exclusive lock; `peer` is a rank of the table).
  void setRemote(int peer, uint32_t id, Remote window) { remote_[static_cast<size_t>(peer)][id] = std::move(window); }

  /// Local window `id`, or null.
  const Local* local(uint32_t id) const {
    auto it = local_.find(id);
    return it == local_.end() ? nullptr : &it->second;
  }
  /// The same, to change (exclusive lock).
  Local* mutableLocal(uint32_t id) {
    auto it = local_.find(id);
    return it == local_.end() ? nullptr : &it->second;
  }
  /// Every window of `peer` by id.
  const std::unordered_map<uint32_t, Remote>& remotes(int peer) const { return remote_[static_cast<size_t>(peer)]; }

  /// Local window `id` when [offset, offset + bytes) lies in it; else null and `*why` says why not.
  const Local* findLocal(uint32_t id, uint64_t offset, uint64_t bytes, std::string* why) const {
    const Local* w = local(id);
    if (w == nullptr) {
      *why = "local window " + std::to_string(id) + " is not registered";
      return nullptr;
    }
    return inRange(w, "local window ", id, offset, bytes, why);
  }
  /// Window `id` of `peer` (a rank of the table) when [offset, offset + bytes) lies in it; else null and `*why`.
  const Remote* findRemote(int peer, uint32_t id, uint64_t offset, uint64_t bytes, std::string* why) const {
    const auto& windows = remotes(peer);
    auto it = windows.find(id);
    if (it == windows.end()) {
      *why = "remote window " + std::to_string(id) + " of peer " + std::to_string(peer) + " is not known";
      return nullptr;
    }
    return inRange(&it->second, "remote window ", id, offset, bytes, why);
  }
  /// Both windows of `op` when its ranges lie in them; else {null, null} and `*why`.
  WriteEnds findWrite(const WriteOp& op, std::string* why) const {
    WriteEnds ends;
    ends.local = findLocal(op.localWindow, op.localOffset, op.bytes, why);
    if (ends.local) ends.remote = findRemote(op.peer, op.remoteWindow, op.remoteOffset, op.bytes, why);
    if (!ends.remote) ends.local = nullptr;
    return ends;
  }
  /// The peer's window that atomic `op` updates, when its word lies in it and it is not GPU memory (which
  /// `transport` refuses, see gpuAtomicRefusal()); else null and `*why`.
  const Remote* findAtomicTarget(const AtomicOp& op, const char* transport, std::string* why) const {
    const Remote* w = findRemote(op.peer, op.remoteWindow, op.remoteOffset, kAtomicWordBytes, why);
    if (w && w->cuda) {
      *why = gpuAtomicRefusal(transport);
      return nullptr;
    }
    if (w && (w->skew + op.remoteOffset) % kAtomicWordBytes != 0) {
      *why = "the word at offset " + std::to_string(op.remoteOffset) + " of remote window " +
             std::to_string(op.remoteWindow) + " is not 8-byte aligned in the peer's memory (the window starts " +
             std::to_string(w->skew) + " bytes past an 8-byte boundary)";
      return nullptr;
    }
    return w;
  }

 private:
  /// `w` when [offset, offset + bytes) lies in it; else null and `*why` ("<what><id>: <range>").
  template <class Window>
  static const Window* inRange(const Window* w, const char* what, uint32_t id, uint64_t offset, uint64_t bytes,
                               std::string* why) {
    std::string bad = checkRange(offset, bytes, w->bytes);
    if (bad.empty()) return w;
    *why = what + std::to_string(id) + ": " + bad;
    return nullptr;
  }

  mutable std::shared_mutex mutex_;
  std::unordered_map<uint32_t, Local> local_;
  std::vector<std::unordered_map<uint32_t, Remote>> remote_;  ///< per peer: id -> window
};

}  // namespace gdx::common
