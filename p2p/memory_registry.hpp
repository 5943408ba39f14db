// The process-wide table behind RegisteredMemory (gdx/p2p/url_transport.hpp): every live registration's region and
// key secret under its id, and every live UrlTransport connection, on which a registration that goes away is
// forgotten. A peer that writes into a registration names its id (its window); the connection registers it with its
// transport on first use, after resolve() found the secret of the peer's key to be the registration's.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>

#include "p2p/connection.hpp"

namespace gdx::p2p {

class MemoryRegistry {
 public:
  static MemoryRegistry& get();

  /// Registers `r` (its window is set to the new id) with a fresh 64-bit key secret; returns the id.
  uint32_t add(MemoryRegion r);
  /// Forgets registration `id` here and on every live connection (returns once no transport reads it).
  void remove(uint32_t id);
  /// The key secret of registration `id` (0 when it is gone).
  uint64_t secret(uint32_t id);
  /// The region of live registration `id`; false when it is gone.
  bool find(uint32_t id, MemoryRegion* out);
  /// A connection's WindowResolver: the region of `window` when `secret` is its key's secret.
  bool resolve(uint32_t window, uint64_t secret, MemoryRegion* out);
  void addConnection(Connection* c);
  void removeConnection(Connection* c);

 private:
  std::mutex mutex_;
  std::map<uint32_t, MemoryRegion> regions_;
  std::map<uint32_t, uint64_t> secrets_;
  std::set<Connection*> conns_;
  uint32_t next_ = 1;
};

}  // namespace gdx::p2p
