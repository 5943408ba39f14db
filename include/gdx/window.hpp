// Window: memory registered with a Context under an id that is the same on every rank (windows are
// registered collectively, in the same order everywhere). Commands name windows and offsets, never raw
// addresses, so every access is bounds-checked. RAII: destroying the Window deregisters it: locally for host
// memory; for GPU memory in a job with GPUs collectively (every rank destroys its windows in the same order, after
// the kernels using them finished), since same-host peers map the memory for direct stores and must unmap it
// before it may be freed (a mismatched order is logged at ERROR naming both sides; the wait is bounded by
// GDX_TIMEOUT_MS and ends at once when a rank died).
//
// A Window may outlive its Context: it holds a shared link to it (runtime/context_link.hpp), not a raw pointer.
// Once the Context is destroyed, valid() is false, remoteSize() and peerData() throw gdx::Error(kShutdown) naming
// the window, and destroying the Window does nothing (the Context released everything it had registered).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gdx/types.hpp"

namespace gdx {

class Context;
class ContextImpl;
class Channel;
namespace detail {
struct ContextLink;
}

class Window {
 public:
  Window() = default;
  ~Window();
  Window(Window&& other) noexcept;
  Window& operator=(Window&& other) noexcept;
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  uint32_t id() const { return id_; }
  void* data() const { return base_; }
  size_t size() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  /// The name given to registerWindow (empty when none); the ranks check names against each other.
  const std::string& name() const { return name_; }
  /// True while the window is registered and its Context exists.
  bool valid() const;
  /// Bytes of this window on `peer` (windows may differ in size between ranks).
  size_t remoteSize(int peer) const;
  /// `peer`'s copy of this window as kernels of this process address it, for direct stores and loads: the CUDA IPC
  /// mapping when `peer` is reached on the direct path (Context::isDirect) and its window is GPU memory, data() for
  /// this rank's own GPU window, null otherwise (then only the proxy reaches it). Valid while both windows live.
  void* peerData(int peer) const;

 private:
  friend class ContextImpl;
  friend class Channel;
  Window(std::shared_ptr<detail::ContextLink> link, uint32_t id, void* base, size_t bytes, MemoryKind kind,
         std::string name)
      : link_(std::move(link)), id_(id), base_(base), bytes_(bytes), kind_(kind), name_(std::move(name)) {}
  void reset() noexcept;
  /// "window 3 ('name')", for messages.
  std::string describe() const;

  std::shared_ptr<detail::ContextLink> link_;  // null: not registered (default-constructed or moved from)
  uint32_t id_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  std::string name_;
};

}  // namespace gdx
