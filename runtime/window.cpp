#include "gdx/window.hpp"

#include <utility>

#include "gdx/context.hpp"
#include "runtime/context_impl.hpp"

namespace gdx {

Window::~Window() {
  reset();
}

Window::Window(Window&& o) noexcept {
  *this = std::move(o);
}

Window& Window::operator=(Window&& o) noexcept {
  if (this != &o) {
    reset();
    link_ = std::move(o.link_);
    o.link_.reset();
    id_ = o.id_;
    base_ = o.base_;
    bytes_ = o.bytes_;
    kind_ = o.kind_;
    name_ = std::move(o.name_);
  }
  return *this;
}

// After the Context is gone there is nothing left to deregister: ~Context released the transport's registrations
// with everything else, so this is a no-op then.
void Window::reset() noexcept {
  if (!link_) return;
  {
    detail::ContextUse use(link_.get());
    if (use) use->deregister(id_);
  }
  link_.reset();
}

bool Window::valid() const {
  return static_cast<bool>(detail::ContextUse(link_.get()));
}

std::string Window::describe() const {
  return "window " + std::to_string(id_) + (name_.empty() ? std::string() : " ('" + name_ + "')");
}

size_t Window::remoteSize(int peer) const {
  if (!link_) return 0;
  detail::ContextUse use(link_.get());
  if (!use) detail::throwContextGone(*link_, describe() + ": remoteSize");
  return use->registry_->remoteBytes(peer, id_);
}

void* Window::peerData(int peer) const {
  if (!link_) return nullptr;
  detail::ContextUse use(link_.get());
  if (!use) detail::throwContextGone(*link_, describe() + ": peerData");
  if (peer == use->rank()) return kind_ == MemoryKind::kCuda ? base_ : nullptr;
  return use->directWindowBase(peer, id_);
}

}  // namespace gdx
