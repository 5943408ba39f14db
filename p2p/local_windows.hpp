// This side's memory as one connection exposes it to its peer: the windows registered with the connection's transport
// (each with the key the peer needs to reach it), the ranges advertised for one-sided writes and reads, the windows
// granted for one transfer (a receive's buffer, a read's destination) until that transfer's data is in place, the
// eager buffer, and the regions forgotten (deregistered by the application), which nothing registers again.
// Every window is registered with what the peer may do to it decided from its kind, so that the transport refuses
// anything else: the peer can write only what was advertised or granted, and a grant only until it is revoked.
//
// The application's threads (advertise, forget) and the thread running the connection both use it: one mutex guards
// all of it, so that a region is either forgotten or counted as read by a posted write, never neither (forget() on
// the connection waits for those writes).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "gdx/types.hpp"
#include "transport/transport.hpp"

namespace gdx::p2p {

/// Memory as a connection registers it with its transport: window `window` = [base, base + bytes).
struct MemoryRegion {
  uint32_t window = 0;
  char* base = nullptr;
  uint64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
};

/// `size` bytes at `offset` of a local region.
struct Piece {
  MemoryRegion region;
  uint64_t offset = 0;
  uint64_t size = 0;
};

/// Windows a peer may ask for besides the advertised ones (the URL transport's registered memory): true and *out
/// when `window` is one and `secret` is its key's.
using WindowResolver = std::function<bool(uint32_t window, uint64_t secret, MemoryRegion* out)>;

/// Windows of advertised ranges; windows below are endpoint memory regions (window = mrId).
constexpr uint32_t kAdvertisedWindowBase = 0x80000000u;
/// Windows granted for one transfer (a receive's range, a read's destination): kGrantWindows ids from here, just
/// below the eager window, reused once revoked. Memory region ids stay below them.
constexpr uint32_t kGrantWindowBase = 0x7fff0000u;
constexpr uint32_t kGrantWindows = 0xffffu;

class LocalWindows {
 public:
  /// What a granted window lets the peer write: a receive's buffer or a read's destination.
  enum class GrantFor { kReceive, kRead };

  /// `name` (the connection's, which outlives this) starts the errors; `transport` registers the windows.
  LocalWindows(Transport& transport, const std::string& name);
  LocalWindows(const LocalWindows&) = delete;
  LocalWindows& operator=(const LocalWindows&) = delete;

  void setResolver(WindowResolver r);

  /// Makes `size` bytes at `offset` of `region` a window of its own the peer may write and read; returns its id.
  /// Advertising the same range again returns the same window. Throws for a forgotten region.
  uint32_t advertise(const MemoryRegion& region, uint64_t offset, uint64_t size);
  /// Marks `gone` (one window; the windows advertised in it are added) forgotten, revokes the grants in it and
  /// deregisters them all from the transport.
  void forget(std::vector<uint32_t>& gone);
  /// true once forget() named `window`.
  bool forgotten(uint32_t window) const;

  /// Registers `r` with the transport once; with `key`, its key goes there. `reading`: a write from it is about to be
  /// posted, counted until doneReading(), which the connection's forget() waits for. Throws for a forgotten region.
  void registerRegion(const MemoryRegion& r, std::string* key = nullptr, bool reading = false);
  /// registerRegion() for a caller that hands the key to the peer.
  std::string keyOf(const MemoryRegion& r);
  /// A write that read `window` completed (or was never posted).
  void doneReading(uint32_t window);
  /// How many posted writes still read any of `windows`.
  int readersOf(const std::vector<uint32_t>& windows) const;

  /// The region behind `window` if the peer may ask for it: the eager buffer (made on first use), an advertised
  /// range, or what the resolver gives for `secret`.
  bool resolve(uint32_t window, MemoryRegion* out, uint64_t secret = 0);
  /// Slot `slot` of the eager buffer. Only the thread running the connection uses the buffer, once resolve() made it.
  const char* eagerSlot(uint32_t slot) const;
  bool eagerBufferMade() const { return !eagerBuffer_.empty(); }

  /// Registers exactly `p`'s range as a window of its own for transfer `id` (`what` it is for); returns the window
  /// and its key in *key. Throws for a forgotten region, or when every grant window is in use.
  uint32_t grant(const Piece& p, GrantFor what, uint64_t id, std::string* key);
  /// Revokes the grants of receives numbered below `seq` (their data arrived, or will never come).
  void revokeReceivesBefore(uint64_t seq);
  /// Revokes the grant of read `id`, if any.
  void revokeRead(uint64_t id);
  /// How many windows are granted right now.
  size_t grantsOpen() const;

 private:
  struct Advertised {
    MemoryRegion region;  ///< the advertised range, as a window of its own
    uint32_t parent = 0;  ///< the endpoint region it lies in
  };
  /// A window that lets the peer write one transfer's range: a receive's, until the data of its send (or of a later
  /// one) arrived; a read's destination, until its kReadDone.
  struct Grant {
    GrantFor what = GrantFor::kReceive;
    uint64_t id = 0;      ///< the receive's number or the read's id
    uint32_t parent = 0;  ///< the endpoint region it lies in
  };

  /// Deregisters grant window `w` from the transport (mutex_ held).
  void dropGrantLocked(uint32_t w);

  Transport& transport_;
  const std::string& name_;

  mutable std::mutex mutex_;
  std::unordered_map<uint32_t, std::string> keys_;  ///< windows registered with the transport, and their keys
  std::set<uint32_t> forgotten_;
  std::map<uint32_t, Advertised> advertised_;
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, uint32_t> advertisedRanges_;
  uint32_t nextAdvertised_ = kAdvertisedWindowBase;
  std::map<uint32_t, Grant> grants_;
  uint32_t nextGrant_ = 0;
  WindowResolver resolver_;
  std::unordered_map<uint32_t, int> readers_;  ///< windows the transport reads for posted writes, and how many
  std::vector<char> eagerBuffer_;              ///< this side's eager buffer (kEagerSlots x kEagerBytes)
};

}  // namespace gdx::p2p
