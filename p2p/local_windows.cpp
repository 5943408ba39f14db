// LocalWindows: which of this side's memory the peer may reach, and how. A receive lets the peer write exactly its
// range, and a read's destination exactly the range read, each as a window of its own that is deregistered from the
// transport once the transfer's data is in place: the rest of the region is never registered for the peer, and
// nothing of it stays writable after the transfer.
#include "p2p/local_windows.hpp"

#include "base/log.hpp"
#include "gdx/error.hpp"
#include "p2p/protocol.hpp"

namespace gdx::p2p {

LocalWindows::LocalWindows(Transport& transport, const std::string& name) : transport_(transport), name_(name) {}

void LocalWindows::setResolver(WindowResolver r) {
  std::lock_guard<std::mutex> lock(mutex_);
  resolver_ = std::move(r);
}

// ---- advertised and forgotten regions --------------------------------------------------------------------------

uint32_t LocalWindows::advertise(const MemoryRegion& region, uint64_t offset, uint64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (forgotten_.count(region.window))
    throw Error(ErrorCode::kInvalidArgument,
                name_ + ": memory region " + std::to_string(region.window) + " was deregistered");
  auto key = std::make_tuple(region.window, offset, size);
  auto it = advertisedRanges_.find(key);
  if (it != advertisedRanges_.end()) return it->second;
  if (nextAdvertised_ == UINT32_MAX) throw Error(ErrorCode::kInvalidArgument, name_ + ": too many advertised ranges");
  Advertised a;
  a.region.window = nextAdvertised_++;
  a.region.base = region.base + offset;
  a.region.bytes = size;
  a.region.kind = region.kind;
  a.parent = region.window;
  advertised_[a.region.window] = a;
  advertisedRanges_[key] = a.region.window;
  return a.region.window;
}

void LocalWindows::forget(std::vector<uint32_t>& gone) {
  const uint32_t window = gone.front();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = advertised_.begin(); it != advertised_.end();) {
    if (it->second.parent == window) {
      gone.push_back(it->first);
      it = advertised_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = advertisedRanges_.begin(); it != advertisedRanges_.end();)
    it = std::get<0>(it->first) == window ? advertisedRanges_.erase(it) : std::next(it);
  for (auto it = grants_.begin(); it != grants_.end();) {
    const uint32_t w = it->first;
    const uint32_t parent = it->second.parent;
    ++it;
    if (parent == window) dropGrantLocked(w);
  }
  for (uint32_t w : gone) {
    forgotten_.insert(w);
    if (keys_.erase(w)) {
      try {
        transport_.deregisterWindow(w);
      } catch (const Error& e) {
        GDX_WARN(name_ << ": deregistering window " << w << ": " << e.what());
      }
    }
  }
}

bool LocalWindows::forgotten(uint32_t window) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return forgotten_.count(window) > 0;
}

// ---- registration ----------------------------------------------------------------------------------------------

void LocalWindows::registerRegion(const MemoryRegion& r, std::string* key, bool reading) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (forgotten_.count(r.window))
    throw Error(ErrorCode::kInvalidArgument, name_ + ": memory region " + std::to_string(r.window) +
                                                 " was deregistered while the transfer was queued");
  auto it = keys_.find(r.window);
  if (it == keys_.end()) {
    // What the peer may do to it: write an advertised range, write the eager buffer only with its immediates, and
    // nothing to a region registered as the source of this side's sends and writes (a receive's range is a grant).
    // Decided at registration: a verbs NIC then refuses the writes itself. The memory a resolver gives (the URL
    // transport's) becomes writable once the peer presented its key's secret (the connection's answer to its key
    // request); where the access cannot be widened later (verbs without ibv_rereg_mr) it is writable from the start,
    // for the connected peer only, which the NIC cannot ask for the secret anyway.
    const bool writableLater = resolver_ && transport_.accessFixedAtRegistration();
    const RemoteAccess access = r.window == kEagerWindow                             ? RemoteAccess::kImmediateWrites
                                : r.window >= kAdvertisedWindowBase || writableLater ? RemoteAccess::kWrite
                                                                                     : RemoteAccess::kNone;
    it = keys_.emplace(r.window, transport_.registerWindowFor(r.window, r.base, r.bytes, r.kind, access)).first;
  }
  if (key) *key = it->second;
  if (reading) ++readers_[r.window];  // under the lock that forget() marks it forgotten with: it waits for this one
}

std::string LocalWindows::keyOf(const MemoryRegion& r) {
  std::string key;
  registerRegion(r, &key);
  return key;
}

void LocalWindows::doneReading(uint32_t window) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto r = readers_.find(window);
  if (r != readers_.end() && --r->second <= 0) readers_.erase(r);
}

int LocalWindows::readersOf(const std::vector<uint32_t>& windows) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int n = 0;
  for (uint32_t w : windows) {
    auto r = readers_.find(w);
    if (r != readers_.end()) n += r->second;
  }
  return n;
}

bool LocalWindows::resolve(uint32_t window, MemoryRegion* out, uint64_t secret) {
  WindowResolver resolver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (window == kEagerWindow) {  // made on first use: connections that carry no small sends never pay for it
      if (eagerBuffer_.empty()) eagerBuffer_.resize(static_cast<size_t>(kEagerSlots) * kEagerBytes);
      out->window = kEagerWindow;
      out->base = eagerBuffer_.data();
      out->bytes = eagerBuffer_.size();
      out->kind = MemoryKind::kHost;
      return true;
    }
    auto it = advertised_.find(window);
    if (it != advertised_.end()) {
      *out = it->second.region;
      return true;
    }
    resolver = resolver_;
  }
  return resolver && resolver(window, secret, out);
}

const char* LocalWindows::eagerSlot(uint32_t slot) const {
  return eagerBuffer_.data() + static_cast<uint64_t>(slot) * kEagerBytes;
}

// ---- grants ----------------------------------------------------------------------------------------------------

uint32_t LocalWindows::grant(const Piece& p, GrantFor what, uint64_t id, std::string* key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (forgotten_.count(p.region.window))
    throw Error(ErrorCode::kInvalidArgument, name_ + ": memory region " + std::to_string(p.region.window) +
                                                 " was deregistered while the transfer was queued");
  if (grants_.size() >= kGrantWindows)
    throw Error(ErrorCode::kInvalidArgument, name_ + ": " + std::to_string(grants_.size()) +
                                                 " receives and reads are in flight already (at most " +
                                                 std::to_string(kGrantWindows) + ")");
  uint32_t w = 0;
  do {
    w = kGrantWindowBase + nextGrant_;
    nextGrant_ = (nextGrant_ + 1) % kGrantWindows;
  } while (grants_.count(w));
  *key = transport_.registerWindow(w, p.region.base + p.offset, p.size, p.region.kind);
  keys_[w] = *key;
  grants_[w] = Grant{what, id, p.region.window};
  return w;
}

void LocalWindows::dropGrantLocked(uint32_t w) {
  grants_.erase(w);
  if (!keys_.erase(w)) return;
  try {
    transport_.deregisterWindow(w);
  } catch (const Error& e) {
    GDX_WARN(name_ << ": revoking window " << w << ": " << e.what());
  }
}

void LocalWindows::revokeReceivesBefore(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = grants_.begin(); it != grants_.end();) {
    const uint32_t w = it->first;
    const Grant g = it->second;
    ++it;
    if (g.what == GrantFor::kReceive && g.id < seq) dropGrantLocked(w);
  }
}

void LocalWindows::revokeRead(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = grants_.begin(); it != grants_.end(); ++it) {
    if (it->second.what == GrantFor::kRead && it->second.id == id) return dropGrantLocked(it->first);
  }
}

size_t LocalWindows::grantsOpen() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return grants_.size();
}

}  // namespace gdx::p2p
