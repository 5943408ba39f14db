// The relay (internal to the Context): how a rank reaches a GPU of another host through a rank on that host, in one
// unit — the sender's checks, the forward request it sends, and the relay rank's receive side.
//
//  sender:  Context::relayChannel(destination, relay) checks the route (checkRoute). Each relayed command (a relayPut
//           pair, a putWithSignal or a signal whose signal slot names the destination; command.hpp) is checked by the
//           proxy through check() and becomes: the data written into the relay's copy of the destination window (same
//           id, same offset; no immediate), then the forward request of request() as a transport control message on
//           the same lane, which the relay therefore handles only once that data is in place.
//  relay:   onMessage() decodes the request, resolves it against the direct path (this GPU must reach the destination's
//           GPU directly, the window must be a GPU window on both) and submits it to the forwarder, a PeerCopyQueue
//           that copies over NVLink and then raises the destination's device signal, in submission order.
// A request the relay cannot serve is logged and dropped; the destination's wait then times out naming the signal.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/gpu.hpp"
#include "base/window_registry.hpp"
#include "bootstrap/bootstrap.hpp"
#include "gdx/peer_copy_queue.hpp"
#include "proxy/proxy.hpp"
#include "runtime/forward_request.hpp"
#include "transport/transport.hpp"

namespace gdx {

class DirectPaths;

class Relay final : public RelayRequests {
 public:
  Relay(const Bootstrap& bootstrap, const WindowRegistry& registry, const DirectPaths& direct, const GpuInfo& gpu,
        uint64_t timeoutNs);
  ~Relay() override;
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  /// Sender side: throws gdx::Error(kInvalidArgument) unless `relay` can forward this rank's data to `destination`
  /// (both exist, three distinct ranks, one host).
  void checkRoute(int destination, int relay) const;
  std::string check(const Command& first, const Command& second) const override;
  MessageOp request(const Command& first, const Command& second) const override;

  /// Relay side: one forward request from `m.peer` (called from transport threads).
  void onMessage(const RemoteMessage& m);
  /// The forwarding queue, created by the first request this rank relays; null until then.
  PeerCopyQueue* forwarder();

 private:
  /// Where a forwarded range goes (resolveForward()); empty when the direct path serves it, else why not.
  std::string resolve(const ForwardRequest& f, ForwardTarget* out) const;

  const Bootstrap& bootstrap_;
  const WindowRegistry& registry_;
  const DirectPaths& direct_;
  int device_;
  uint64_t timeoutNs_;
  std::mutex mutex_;
  std::unique_ptr<PeerCopyQueue> queue_;
};

}  // namespace gdx
