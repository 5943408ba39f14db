#include "gdx/window.hpp"

#include <utility>

#include "gdx/context.hpp"

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
    context_ = std::exchange(o.context_, nullptr);
    id_ = o.id_;
    base_ = o.base_;
    bytes_ = o.bytes_;
    kind_ = o.kind_;
  }
  return *this;
}

void Window::reset() noexcept {
  if (context_) context_->deregister(id_);
  context_ = nullptr;
}

size_t Window::remoteSize(int peer) const {
  return context_ ? context_->registry_->remoteBytes(peer, id_) : 0;
}

void* Window::peerData(int peer) const {
  if (!context_) return nullptr;
  if (peer == context_->rank()) return kind_ == MemoryKind::kCuda ? base_ : nullptr;
  return context_->directWindowBase(peer, id_);
}

}  // namespace gdx
