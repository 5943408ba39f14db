// Window: memory registered with a Context under an id that is the same on every rank (windows are
// registered collectively, in the same order everywhere). Commands name windows and offsets, never raw
// addresses, so every access is bounds-checked. RAII: destroying the Window deregisters it locally.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdx/types.hpp"

namespace gdx {

class Context;

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
  bool valid() const { return context_ != nullptr; }
  /// Bytes of this window on `peer` (windows may differ in size between ranks).
  size_t remoteSize(int peer) const;
  /// `peer`'s copy of this window as kernels of this process address it, for direct stores and loads: the CUDA IPC
  /// mapping when `peer` is reached on the direct path (Context::isDirect) and its window is GPU memory, data() for
  /// this rank's own GPU window, null otherwise (then only the proxy reaches it). Valid while both windows live.
  void* peerData(int peer) const;

 private:
  friend class Context;
  Window(Context* context, uint32_t id, void* base, size_t bytes, MemoryKind kind)
      : context_(context), id_(id), base_(base), bytes_(bytes), kind_(kind) {}
  void reset() noexcept;

  Context* context_ = nullptr;
  uint32_t id_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
};

}  // namespace gdx
