// RegisteredMemory (gdx/p2p/url_transport.hpp) and the MemoryRegistry it lives in.
#include <cstdio>

#include "base/log.hpp"
#include "gdx/error.hpp"
#include "gdx/p2p/url_transport.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/memory_registry.hpp"
#include "p2p/pair_link.hpp"

namespace gdx::p2p {

// ---- MemoryRegistry -------------------------------------------------------------------------------------------

MemoryRegistry& MemoryRegistry::get() {
  static MemoryRegistry r;
  return r;
}

uint32_t MemoryRegistry::add(MemoryRegion r) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (next_ >= kGrantWindowBase) throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory: out of ids");
  const uint32_t id = r.window = next_++;
  regions_[id] = r;
  secrets_[id] = randomU64();
  return id;
}

void MemoryRegistry::remove(uint32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  regions_.erase(id);
  secrets_.erase(id);
  for (Connection* c : conns_) c->forget(id);
}

uint64_t MemoryRegistry::secret(uint32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = secrets_.find(id);
  return it == secrets_.end() ? 0 : it->second;
}

bool MemoryRegistry::find(uint32_t id, MemoryRegion* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end()) return false;
  *out = it->second;
  return true;
}

bool MemoryRegistry::resolve(uint32_t window, uint64_t secret, MemoryRegion* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(window);
  auto known = secrets_.find(window);
  // Only the holder of the key (its 64-bit secret) may have the memory registered for it.
  if (it == regions_.end() || known == secrets_.end() || known->second != secret) return false;
  *out = it->second;
  return true;
}

void MemoryRegistry::addConnection(Connection* c) {
  std::lock_guard<std::mutex> lock(mutex_);
  conns_.insert(c);
}

void MemoryRegistry::removeConnection(Connection* c) {
  std::lock_guard<std::mutex> lock(mutex_);
  conns_.erase(c);
}

// ---- RegisteredMemory -----------------------------------------------------------------------------------------

RegisteredMemory::RegisteredMemory(const void* buf, size_t len, int cudaDev) : buf_(buf), len_(len), device_(cudaDev) {
  if (!buf || len == 0) throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory: null buffer or zero length");
  MemoryRegion r;
  r.base = static_cast<char*>(const_cast<void*>(buf));
  r.bytes = len;
  r.kind = pointerKind(buf);
  if (cudaDev >= 0 && r.kind != MemoryKind::kCuda)
    GDX_INFO("RegisteredMemory: " << len << " bytes for GPU " << cudaDev << " are host memory; registered as such");
  id_ = MemoryRegistry::get().add(r);
}

RegisteredMemory::~RegisteredMemory() {
  MemoryRegistry::get().remove(id_);
}

bool RegisteredMemory::contains(const void* buf, size_t len) const {
  const char* p = static_cast<const char*>(buf);
  const char* b = static_cast<const char*>(buf_);
  return p >= b && p <= b + len_ && len <= static_cast<size_t>(b + len_ - p);
}

RegisteredMemory::View RegisteredMemory::view(size_t offset, size_t length) const {
  if (offset > len_ || length > len_ - offset)
    throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory " + std::to_string(id_) + ": a view of " +
                                                 std::to_string(length) + " bytes at " + std::to_string(offset) +
                                                 " does not fit its " + std::to_string(len_) + " bytes");
  return View(this, static_cast<const char*>(buf_) + offset, length);
}

RegisteredMemory::View RegisteredMemory::viewAt(const void* buf, size_t length) const {
  if (!contains(buf, length))
    throw Error(ErrorCode::kInvalidArgument, "RegisteredMemory " + std::to_string(id_) + ": a view of " +
                                                 std::to_string(length) + " bytes outside its " + std::to_string(len_) +
                                                 " bytes");
  return View(this, buf, length);
}

std::string RegisteredMemory::remoteKey() const {
  char key[128];
  std::snprintf(key, sizeof key, "gdxmem:%u:%llx:%zu:%016llx", id_,
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buf_)), len_,
                static_cast<unsigned long long>(MemoryRegistry::get().secret(id_)));
  return key;
}

}  // namespace gdx::p2p
