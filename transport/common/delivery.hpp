// Handing results to the transport's user, the same in every backend: finished completions to the lane's poll(),
// immediates to the ImmHandler, control messages to the MessageHandler, failed peers to the PeerFailureHandler; and
// TransportBase, which keeps those handlers for every backend.
// The handlers run on transport threads (or the posting thread, loopback), where an exception would end the process
// or unwind through the transport, so a throwing handler is logged instead.
#pragma once

#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

#include "base/log.hpp"
#include "transport/transport.hpp"

namespace gdx::common {

/// Moves up to `max` completions from the front of `done` into `out` (TransportLane::poll()); returns how many.
/// The caller holds whatever guards `done` and counts them out of its in-flight number.
size_t takeCompletions(std::deque<Completion>& done, Completion* out, size_t max);

/// Hands `w` to `handler`, when one is set. A throwing handler is logged as "<who()>: the immediate handler threw:
/// ..."; `who` (a callable returning the name of the receiving side) is only called then, so the hot path builds
/// no string.
template <class Who>
void announce(const Transport::ImmHandler& handler, const RemoteWrite& w, const Who& who) {
  if (!handler) return;
  try {
    handler(w);
  } catch (const std::exception& e) {
    GDX_ERROR(who() << ": the immediate handler threw: " << e.what());
  }
}

/// Hands `m` to `handler` on a transport thread: a throwing handler is logged, a missing one drops the message with
/// a WARN naming the peer. `who` (a callable returning the name of the receiving transport) is only called then, as
/// for announce(): every control message passes here.
template <class Who>
void deliverMessage(const Transport::MessageHandler& handler, const RemoteMessage& m, const Who& who) {
  if (!handler) {
    GDX_WARN(who() << ": no message handler is set; a message of " << m.bytes << " bytes from peer " << m.peer
                   << " is dropped");
    return;
  }
  try {
    handler(m);
  } catch (const std::exception& e) {
    GDX_ERROR(who() << ": the message handler threw for a message from peer " << m.peer << ": " << e.what());
  }
}

/// A transport's PeerFailureHandler: set by the user at any time, called by whichever thread notices a failure.
class PeerFailureNotifier {
 public:
  void set(Transport::PeerFailureHandler handler);
  /// Calls the handler (when one is set) with `peer` and `why`, outside the lock so that it may call back into the
  /// transport (peerStatus(), even setPeerFailureHandler()).
  void notify(int peer, const std::string& why) const;

 private:
  mutable std::mutex mutex_;
  Transport::PeerFailureHandler handler_;
};

/// The part of a Transport that every backend implements alike: keeping the user's handlers. The immediate, message
/// and completion handlers are set before connect() (transport.hpp), so transport threads read them without a lock; the
/// failure handler may change at any time.
class TransportBase : public Transport {
 public:
  void setImmHandler(ImmHandler handler) override { immHandler_ = std::move(handler); }
  void setMessageHandler(MessageHandler handler) override { messageHandler_ = std::move(handler); }
  void setPeerFailureHandler(PeerFailureHandler handler) override { failureHandler_.set(std::move(handler)); }
  void setCompletionHandler(CompletionHandler handler) override { completionHandler_ = std::move(handler); }

 protected:
  ImmHandler immHandler_;          ///< called through announce()
  MessageHandler messageHandler_;  ///< called through deliverMessage()
  PeerFailureNotifier failureHandler_;
  CompletionHandler completionHandler_;  ///< called by backends whose lanes can arm completions (verbs, TCP)
};

}  // namespace gdx::common
