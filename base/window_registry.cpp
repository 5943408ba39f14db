#include "base/window_registry.hpp"

#include <sstream>

#include "gdx/error.hpp"

namespace gdx {

WindowRegistry::WindowRegistry(int rank, int worldSize, uint32_t maxWindows)
    : rank_(rank),
      worldSize_(worldSize),
      maxWindows_(maxWindows),
      local_(new LocalEntry[maxWindows]),
      remote_(new std::atomic<uint64_t>[size_t(worldSize) * maxWindows]) {
  for (size_t i = 0; i < size_t(worldSize) * maxWindows; ++i) remote_[i].store(0, std::memory_order_relaxed);
}

void WindowRegistry::addLocal(uint32_t id, void* base, size_t bytes, MemoryKind kind) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  if (id >= maxWindows_) throw Error(ErrorCode::kInvalidArgument, "window id " + std::to_string(id) + " out of range");
  if (local_[id].bytes.load(std::memory_order_relaxed) != 0)
    throw Error(ErrorCode::kInvalidArgument, "window id " + std::to_string(id) + " already in use");
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "window " + std::to_string(id) + " of 0 bytes");
  local_[id].base = base;
  local_[id].kind = kind;
  local_[id].bytes.store(bytes, std::memory_order_release);
}

void WindowRegistry::removeLocal(uint32_t id) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  if (id < maxWindows_) local_[id].bytes.store(0, std::memory_order_release);
}

void WindowRegistry::addRemote(int peer, uint32_t id, size_t bytes) {
  std::lock_guard<std::mutex> lock(writeMutex_);
  if (peer < 0 || peer >= worldSize_ || id >= maxWindows_)
    throw Error(ErrorCode::kInvalidArgument,
                "remote window " + std::to_string(id) + " of rank " + std::to_string(peer) + " out of range");
  remote_[size_t(peer) * maxWindows_ + id].store(bytes, std::memory_order_release);
}

std::string WindowRegistry::checkLocal(uint32_t id, uint64_t offset, uint64_t bytes) const {
  if (fitsLocal(id, offset, bytes)) return {};
  uint64_t size = id < maxWindows_ ? local_[id].bytes.load(std::memory_order_acquire) : 0;
  std::ostringstream os;
  if (size == 0)
    os << "local window " << id << " is not registered on rank " << rank_;
  else
    os << "range [" << offset << ", +" << bytes << ") is outside local window " << id << " of " << size
       << " bytes on rank " << rank_;
  return os.str();
}

std::string WindowRegistry::checkRemote(int peer, uint32_t id, uint64_t offset, uint64_t bytes) const {
  if (fitsRemote(peer, id, offset, bytes)) return {};
  uint64_t size = remoteBytes(peer, id);
  std::ostringstream os;
  if (peer < 0 || peer >= worldSize_)
    os << "peer " << peer << " does not exist (world size " << worldSize_ << ")";
  else if (size == 0)
    os << "window " << id << " is not registered on rank " << peer;
  else
    os << "range [" << offset << ", +" << bytes << ") is outside window " << id << " of " << size << " bytes on rank "
       << peer;
  return os.str();
}

WindowInfo WindowRegistry::local(uint32_t id) const {
  if (id >= maxWindows_) return WindowInfo{};
  uint64_t size = local_[id].bytes.load(std::memory_order_acquire);
  return size ? WindowInfo{local_[id].base, size, local_[id].kind, true} : WindowInfo{};
}

}  // namespace gdx
