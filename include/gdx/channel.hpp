// Channel: the host-side way to issue one-sided operations to one peer. Every call enqueues commands on a
// command ring (host threads are producers here; kernels use the device handle of the next layer) which a
// proxy thread turns into transport operations. Channels are cheap to copy and safe to use from several
// threads at once. Arguments are checked before anything is enqueued: a bad peer, window, range or signal id
// throws gdx::Error(kInvalidArgument) and nothing is sent.
//
// A relayed channel (Context::relayChannel(destination, relay)) reaches `destination` through `relay`, a rank on
// the destination's host: every put lands first in the relay's copy of the destination window (same id, same
// offset; symmetric windows), the relay's PeerCopyQueue forwards it over NVLink into the destination's window and
// then updates the destination's signal, in the order the channel issued them. atomicAdd is not relayed.
//
// A Channel may outlive its Context (it holds a shared link, runtime/context_link.hpp): every operation on it then
// throws gdx::Error(kShutdown) naming the channel and saying the Context is gone. Windows must belong to the
// Channel's own Context; one of another Context is refused with kInvalidArgument (window ids alone would match).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "gdx/device/impl/ring.hpp"
#include "gdx/window.hpp"

namespace gdx {

class Context;
class ContextImpl;
struct SignalUpdateArgs;
namespace detail {
struct ContextLink;
class ContextUse;
}  // namespace detail

class Channel {
 public:
  /// The rank the commands are sent to: the destination, or the relay of a relayed channel.
  int peer() const { return peer_; }
  /// The rank the data and signals are for.
  int destination() const { return forwardTo_ >= 0 ? forwardTo_ : peer_; }
  /// The relay of a relayed channel, -1 otherwise.
  int relay() const { return forwardTo_ >= 0 ? peer_ : -1; }
  int ringIndex() const { return ringIndex_; }

  /// Copies `bytes` from local window `src` at `srcOffset` into the peer's copy of window `dst` at
  /// `dstOffset`. Returns once enqueued; the source may be modified only after flush(). Zero bytes: no-op.
  void put(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset, uint64_t bytes);
  /// put(), then updates signal `signalId` on the peer; the peer sees the update only after all the data of
  /// this put (and of every earlier operation of this channel) is in place. Zero bytes: only the signal.
  void putWithSignal(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset, uint64_t bytes,
                     uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd);
  /// Updates signal `signalId` on the peer after every earlier operation of this channel is in place.
  void signal(uint32_t signalId, uint64_t value, SignalOp op = SignalOp::kAdd);
  /// Adds `value` to the 64-bit word at `dstOffset` (8-byte aligned) of the peer's window `dst`.
  void atomicAdd(const Window& dst, uint64_t dstOffset, uint64_t value);
  /// Waits (bounded) until every operation issued through this channel so far completed at the source;
  /// throws gdx::Error naming the rank, peer and the proxy's error when one of them (since the channel's last
  /// flush) was refused or failed, and kPeerFailed at once, with the peer's first failure, when the peer failed.
  /// Errors are per channel and command: a flush after a failed one covers only later operations, which succeed
  /// when they are valid; channels to other peers never see this peer's errors.
  void flush();

 private:
  friend class ContextImpl;
  Channel(std::shared_ptr<detail::ContextLink> link, int peer, int ringIndex, RingDeviceHandle ring,
          const uint32_t* peerFailure, int forwardTo = -1);
  /// "channel to peer 1 on ring 0", for messages.
  std::string describe() const;
  /// The Context, held for the caller's operation; throws kShutdown naming the channel when it is gone.
  detail::ContextUse use(const char* operation) const;
  void pushPut(ContextImpl& context, const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset,
               uint64_t bytes, const SignalUpdateArgs* signal);
  void push(ContextImpl& context, const Command& c);
  void notePosition(uint64_t pos);
  void checkPut(ContextImpl& context, const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset,
                uint64_t bytes) const;
  void checkSignal(ContextImpl& context, uint32_t signalId) const;
  /// Throws when `w` is not registered or belongs to another Context.
  void checkWindow(const Window& w, const std::string& where) const;
  [[noreturn]] void fail(ContextImpl& context, Status status, const char* operation) const;

  std::shared_ptr<detail::ContextLink> link_;
  int peer_;
  int ringIndex_;
  int forwardTo_;  // a relayed channel's destination (the relay is peer_); -1: not relayed
  RingDeviceHandle ring_;
  const uint32_t* peerFailure_;  // the peer's failure word (the Context's host memory)
  /// Shared by the copies of the channel (and the threads using them).
  struct Positions {
    std::atomic<int64_t> last{-1};       ///< highest ring position this channel used; -1: none
    std::atomic<uint64_t> flushFrom{0};  ///< positions below were covered by a flush: their faults were reported
  };
  std::shared_ptr<Positions> positions_;
};

}  // namespace gdx
