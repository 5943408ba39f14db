// Connection: windows granted for one transfer. A receive lets the peer write exactly its range, and a read's
// destination exactly the range read, each as a window of its own that is deregistered from the transport once the
// transfer's data is in place: the rest of the region is never registered for the peer, and nothing of it stays
// writable after the transfer.
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"

namespace gdx::p2p {

uint32_t Connection::grant(const Piece& p, Grant::Kind kind, uint64_t id) {
  uint32_t w = 0;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(winMutex_);
    if (forgotten_.count(p.region.window))
      throw Error(ErrorCode::kInvalidArgument, name_ + ": memory region " + std::to_string(p.region.window) +
                                                   " was deregistered while the transfer was queued");
    if (grants_.size() >= kGrantWindows)
      throw Error(ErrorCode::kInvalidArgument, name_ + ": " + std::to_string(grants_.size()) +
                                                   " receives and reads are in flight already (at most " +
                                                   std::to_string(kGrantWindows) + ")");
    do {
      w = kGrantWindowBase + nextGrant_;
      nextGrant_ = (nextGrant_ + 1) % kGrantWindows;
    } while (grants_.count(w));
    key = link_.transport->registerWindow(w, p.region.base + p.offset, p.size, p.region.kind);
    localKeys_[w] = key;
    grants_[w] = Grant{kind, id, p.region.window};
  }
  keysSent_.erase(w);  // a window id used before: the peer gets this grant's key
  sendKey(w, key, p.size);
  return w;
}

void Connection::dropGrantLocked(uint32_t w) {
  grants_.erase(w);
  if (!localKeys_.erase(w)) return;
  try {
    link_.transport->deregisterWindow(w);
  } catch (const Error& e) {
    GDX_WARN(name_ << ": revoking window " << w << ": " << e.what());
  }
}

void Connection::revokeReceivesBefore(uint64_t seq) {
  std::lock_guard<std::mutex> lock(winMutex_);
  for (auto it = grants_.begin(); it != grants_.end();) {
    const uint32_t w = it->first;
    const Grant g = it->second;
    ++it;
    if (g.kind == Grant::kReceive && g.id < seq) dropGrantLocked(w);
  }
}

void Connection::revokeRead(uint64_t id) {
  std::lock_guard<std::mutex> lock(winMutex_);
  for (auto it = grants_.begin(); it != grants_.end(); ++it) {
    if (it->second.kind == Grant::kRead && it->second.id == id) return dropGrantLocked(it->first);
  }
}

size_t Connection::grantsOpen() const {
  std::lock_guard<std::mutex> lock(winMutex_);
  return grants_.size();
}

}  // namespace gdx::p2p
