#include "gdx/window_registry.hpp"

#include <mutex>
#include <sstream>

#include "gdx/error.hpp"

namespace gdx {

WindowRegistry::WindowRegistry(int rank, int worldSize, uint32_t maxWindows)
    : rank_(rank), worldSize_(worldSize), maxWindows_(maxWindows), local_(maxWindows),
      remote_(worldSize, std::vector<size_t>(maxWindows, 0)) {}

void WindowRegistry::addLocal(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
  std::unique_lock lock(mutex_);
  if (id >= maxWindows_) throw Error(ErrorCode::kInvalidArgument, "window id " + std::to_string(id) + " out of range");
  if (local_[id].valid) throw Error(ErrorCode::kInvalidArgument, "window id " + std::to_string(id) + " already in use");
  local_[id] = WindowInfo{base, bytes, kind, true};
}

void WindowRegistry::removeLocal(uint32_t id) {
  std::unique_lock lock(mutex_);
  if (id < maxWindows_) local_[id] = WindowInfo{};
}

void WindowRegistry::addRemote(int peer, uint32_t id, size_t bytes) {
  std::unique_lock lock(mutex_);
  if (peer < 0 || peer >= worldSize_ || id >= maxWindows_)
    throw Error(ErrorCode::kInvalidArgument,
                "remote window " + std::to_string(id) + " of rank " + std::to_string(peer) + " out of range");
  remote_[peer][id] = bytes;
}

std::string WindowRegistry::checkLocal(uint32_t id, uint64_t offset, uint64_t bytes) const {
  std::shared_lock lock(mutex_);
  std::ostringstream os;
  if (id >= maxWindows_ || !local_[id].valid) {
    os << "local window " << id << " is not registered on rank " << rank_;
  } else if (!rangeFits(offset, bytes, local_[id].bytes)) {
    os << "range [" << offset << ", +" << bytes << ") is outside local window " << id << " of " << local_[id].bytes
       << " bytes on rank " << rank_;
  }
  return os.str();
}

std::string WindowRegistry::checkRemote(int peer, uint32_t id, uint64_t offset, uint64_t bytes) const {
  std::shared_lock lock(mutex_);
  std::ostringstream os;
  if (peer < 0 || peer >= worldSize_) {
    os << "peer " << peer << " does not exist (world size " << worldSize_ << ")";
  } else if (id >= maxWindows_ || remote_[peer][id] == 0) {
    os << "window " << id << " is not registered on rank " << peer;
  } else if (!rangeFits(offset, bytes, remote_[peer][id])) {
    os << "range [" << offset << ", +" << bytes << ") is outside window " << id << " of " << remote_[peer][id]
       << " bytes on rank " << peer;
  }
  return os.str();
}

WindowInfo WindowRegistry::local(uint32_t id) const {
  std::shared_lock lock(mutex_);
  return id < maxWindows_ ? local_[id] : WindowInfo{};
}

size_t WindowRegistry::remoteBytes(int peer, uint32_t id) const {
  std::shared_lock lock(mutex_);
  if (peer < 0 || peer >= worldSize_ || id >= maxWindows_) return 0;
  return remote_[peer][id];
}

}  // namespace gdx
