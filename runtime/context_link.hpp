// ContextLink: what a Window or a Channel holds of the Context that made it. Windows and Channels may outlive
// their Context (a Window declared before the Context, a Channel kept in a longer-lived object); a raw pointer to
// the Context would then dangle. The link is shared: the Context clears `context` under the write lock when it is
// destroyed, and every use of a Window or Channel holds the read lock while it touches the Context, so a use either
// completes before ~Context goes on or finds the Context gone and throws. The link's address also tells Contexts
// apart: a Window of one Context handed to a Channel of another is refused by comparing links.
#pragma once

#include <atomic>
#include <shared_mutex>
#include <string>

#include "gdx/error.hpp"

namespace gdx {

class Context;
class ContextImpl;

namespace detail {

struct ContextLink {
  std::shared_mutex mutex;
  ContextImpl* context = nullptr;  // null once the Context is destroyed; read and written under `mutex`
  Context* api = nullptr;          // the public object that owns `context` (what ContextRef::use() returns)
  // Set first by ~Context, before it waits for the write lock: new uses fail at once, so threads that keep using a
  // Channel cannot hold the read lock forever (the lock lets readers in while a writer waits).
  std::atomic<bool> closing{false};
  int rank = -1;  // the Context's rank, kept for messages after it is gone
};

/// Throws gdx::Error(kShutdown): `what` (the window or channel and the operation) found its Context gone.
[[noreturn]] inline void throwContextGone(const ContextLink& link, const std::string& what) {
  throw Error(ErrorCode::kShutdown, "rank " + std::to_string(link.rank) + ": " + what +
                                        ": its Context is gone (destroyed or being destroyed)");
}

/// Holds the link's read lock for as long as the caller uses the Context; the Context cannot go away meanwhile.
/// False when the Context is already gone (or there is no link: a default-constructed Window).
class ContextUse {
 public:
  explicit ContextUse(ContextLink* link) {
    if (!link) return;
    lock_ = std::shared_lock<std::shared_mutex>(link->mutex);
    context_ = link->closing.load(std::memory_order_acquire) ? nullptr : link->context;
  }
  explicit operator bool() const { return context_ != nullptr; }
  ContextImpl& operator*() const { return *context_; }
  ContextImpl* operator->() const { return context_; }

 private:
  std::shared_lock<std::shared_mutex> lock_;
  ContextImpl* context_ = nullptr;
};

}  // namespace detail
}  // namespace gdx
