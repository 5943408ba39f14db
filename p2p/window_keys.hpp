// The keys of windows on one connection, both ways. This side's: the peer learns the key of a window it may reach
// (an advertised range, a grant, the eager buffer, memory the resolver gives) once per window, in parts (kKeyPart),
// asked for (kKeyRequest) or sent ahead (a grant's key before the message naming the grant). The peer's: a writer
// asks for the key of each window it writes (kKeyRequest), the parts are put back together (KeyAssembly) and the
// whole key goes to the transport, after which the window's size bounds every write into it; transfers that waited
// for the key go on, or fail by name when the peer refuses it.
//
// It posts nothing itself: its methods return the messages the connection is to send, and the operations that
// waited for a key, for the connection to run. Only the thread running the connection uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "p2p/key_assembly.hpp"
#include "p2p/local_windows.hpp"
#include "p2p/protocol.hpp"
#include "p2p/transfer.hpp"

namespace gdx::p2p {

/// `size` bytes at `offset` of a window the peer advertised (or, for the URL transport, registered).
struct RemotePiece {
  uint32_t window = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t secret = 0;  ///< sent with the key request: the URL transport's key secret (0 for advertised windows)
};

class WindowKeys {
 public:
  /// `name` (the connection's, which outlives this) starts the errors; `transport` takes the peer's keys, which
  /// reach `peer`'s windows; `windows` are this side's.
  WindowKeys(Transport& transport, int peer, LocalWindows& windows, const std::string& name);
  WindowKeys(const WindowKeys&) = delete;
  WindowKeys& operator=(const WindowKeys&) = delete;

  // This side's keys.
  /// The answer to the peer's kKeyRequest: the key's parts, or kKeyRefused when the window is not the peer's to ask
  /// for (never advertised, gone, its secret wrong) or its key cannot be had.
  std::vector<ControlMsg> answer(const ControlMsg& request);
  /// Grants the peer exactly `p`'s range for transfer `id` (LocalWindows::grant()) and appends its key's parts to
  /// `out`; returns the window. Throws as LocalWindows::grant() does.
  uint32_t grant(const Piece& p, LocalWindows::GrantFor what, uint64_t id, std::vector<ControlMsg>& out);
  /// Appends the parts of the eager buffer's key to `out` (making the buffer) unless the peer has it already.
  void offerEagerBuffer(std::vector<ControlMsg>& out);

  // The peer's keys.
  /// true once the key of the peer's `window` is with the transport.
  bool known(uint32_t window) const { return known_.count(window) != 0; }
  /// Throws kInvalidArgument, naming both sizes, unless `dst` lies within the peer's window, whose key is known.
  void checkFits(const RemotePiece& dst) const;
  /// true while the key of the peer's `window` was asked for and has not arrived (a transfer waits for it).
  bool asked(uint32_t window) const;
  /// The request for the key of the peer's `window` (kKeyRequest), presenting `secret`.
  static ControlMsg request(uint32_t window, uint64_t secret);
  /// Keeps `op` for when the key of the peer's `window` (not known yet, asked for) arrives, or `t` fails when it is
  /// refused.
  void await(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op);
  /// A part of one of the peer's keys (kKeyPart). "" when it fits, with the operations that waited for the key in
  /// `ready` once it is complete (their transfers failed instead when the transport refused the key); else how the
  /// peer broke the protocol.
  std::string onKeyPart(const ControlMsg& m, std::vector<std::function<void()>>& ready);
  /// The peer refused the key of `window` (kKeyRefused): the transfers waiting for it fail by name.
  void onKeyRefused(uint32_t window);
  /// The connection failed (its transfers fail by name): nothing waits for a key any more.
  void dropWaiters() { waiters_.clear(); }

 private:
  /// Appends the parts of `key` to `out` unless the peer has the key of `window` already.
  void offer(uint32_t window, const std::string& key, uint64_t bytes, std::vector<ControlMsg>& out);
  ControlMsg refusal(uint32_t window) const;

  Transport& transport_;
  const int peer_;
  LocalWindows& windows_;
  const std::string& name_;

  std::set<uint32_t> sent_;                       ///< this side's windows whose key the peer has
  std::unordered_map<uint32_t, uint64_t> known_;  ///< the peer's windows added to the transport, with their size
  KeyAssembly assembly_;                          ///< the peer's keys while their parts arrive
  std::map<uint32_t, std::vector<std::pair<std::shared_ptr<Transfer>, std::function<void()>>>> waiters_;
};

}  // namespace gdx::p2p
