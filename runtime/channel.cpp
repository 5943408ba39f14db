#include "gdx/channel.hpp"

#include <algorithm>

#include "gdx/context.hpp"
#include "gdx/device/impl/put_commands.hpp"
#include "gdx/error.hpp"
#include "runtime/context_impl.hpp"

namespace gdx {
Channel::Channel(std::shared_ptr<detail::ContextLink> link, int peer, int ringIndex, RingDeviceHandle ring,
                 const uint32_t* peerFailure, int forwardTo)
    : link_(std::move(link)),
      peer_(peer),
      ringIndex_(ringIndex),
      forwardTo_(forwardTo),
      ring_(ring),
      peerFailure_(peerFailure),
      positions_(std::make_shared<Positions>()) {
  // Faults of commands other channels put on the ring before this one existed are not this channel's.
  positions_->flushFrom.store(atomicLoad(ring_.head, kAcquire), std::memory_order_relaxed);
}

std::string Channel::describe() const {
  return "channel to peer " + std::to_string(peer_) +
         (forwardTo_ >= 0 ? " (relayed to rank " + std::to_string(forwardTo_) + ")" : std::string()) + " on ring " +
         std::to_string(ringIndex_);
}

// The caller keeps the returned read lock for the whole operation: ~Context waits for it instead of freeing the
// ring under it.
detail::ContextUse Channel::use(const char* operation) const {
  detail::ContextUse u(link_.get());
  if (!u) detail::throwContextGone(*link_, describe() + ": " + operation);
  return u;
}

void Channel::checkWindow(const Window& w, const std::string& where) const {
  if (!w.link_) throw Error(ErrorCode::kInvalidArgument, where + "window is not registered");
  if (w.link_ != link_)
    throw Error(ErrorCode::kInvalidArgument, where + w.describe() +
                                                 " belongs to another Context than this channel's (window ids are "
                                                 "per Context: register the window with the channel's Context)");
}

void Channel::fail(ContextImpl& context, Status status, const char* operation) const {
  std::string msg = "rank " + std::to_string(context.rank()) + ": " + operation + " to peer " + std::to_string(peer_) +
                    " on ring " + std::to_string(ringIndex_) + " returned '" + statusName(status) + "'";
  if (status == Status::kTimeout)
    msg += " after " + std::to_string(ring_.timeoutNs / 1000000) + " ms (ring completed " +
           std::to_string(ring_.completedPositions()) + " of " + std::to_string(atomicLoad(ring_.head, kRelaxed)) +
           " positions, consumed " + std::to_string(atomicLoad(ring_.tail, kAcquire)) + ")";
  // This peer's errors only: another peer's failure is not why this channel failed.
  std::string proxyError = context.proxy().peerError(peer_);
  if (proxyError.empty() && ring_.error && atomicLoad(ring_.error, kAcquire) != 0)
    proxyError = context.proxy().lastError();
  if (!proxyError.empty()) msg += "; proxy: " + proxyError;
  std::string failure = context.failure(peer_);
  if (!failure.empty() && failure != proxyError) msg += "; " + failure;
  throw Error(errorCodeFor(status), msg);
}

void Channel::notePosition(uint64_t pos) {
  // Several threads may share this channel: flush() must cover the highest position any of them used.
  std::atomic<int64_t>& last = positions_->last;
  int64_t prev = last.load(std::memory_order_relaxed);
  while (prev < static_cast<int64_t>(pos) && !last.compare_exchange_weak(prev, static_cast<int64_t>(pos))) {
  }
}

void Channel::push(ContextImpl& context, const Command& c) {
  uint64_t pos = 0;
  Status s = ring_.push(c, &pos);
  if (s != Status::kOk) fail(context, s, opcodeName(c.opcode()));
  notePosition(pos);
}

void Channel::pushPut(ContextImpl& context, const Window& dst, uint64_t dstOffset, const Window& src,
                      uint64_t srcOffset, uint64_t bytes, const SignalUpdateArgs* signal) {
  const PutTarget target{static_cast<uint32_t>(peer_), forwardTo_, dst.id(), dstOffset, src.id(), srcOffset};
  uint64_t pos = ~uint64_t{0};
  Status s = pushPutCommands(ring_, target, bytes, signal, &pos);
  if (pos != ~uint64_t{0}) notePosition(pos);
  if (s != Status::kOk) fail(context, s, signal ? "putWithSignal" : "put");
}

void Channel::checkPut(ContextImpl& context, const Window& dst, uint64_t dstOffset, const Window& src,
                       uint64_t srcOffset, uint64_t bytes) const {
  std::string where = "rank " + std::to_string(context.rank()) + ": put to peer " + std::to_string(peer_) + ": ";
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, where + "zero-byte put");
  checkWindow(src, where + "source ");
  checkWindow(dst, where + "destination ");
  std::string why = context.registry_->checkLocal(src.id(), srcOffset, bytes);
  if (why.empty()) why = context.registry_->checkRemote(peer_, dst.id(), dstOffset, bytes);
  if (why.empty() && forwardTo_ >= 0) why = context.registry_->checkRemote(forwardTo_, dst.id(), dstOffset, bytes);
  if (why.empty() && (srcOffset + bytes - 1 > kMaxWindowOffset || dstOffset + bytes - 1 > kMaxWindowOffset))
    why = "offsets beyond " + std::to_string(kMaxWindowOffset) + " cannot be addressed";
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, where + why);
}

void Channel::checkSignal(ContextImpl& context, uint32_t signalId) const {
  if (signalId >= context.numSignals())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(context.rank()) + ": signal id " +
                                                 std::to_string(signalId) +
                                                 " >= " + std::to_string(context.numSignals()) + " signals");
}

void Channel::put(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset, uint64_t bytes) {
  detail::ContextUse context = use("put");
  if (bytes == 0) return;  // as in NVSHMEM: nothing to move
  checkPut(*context, dst, dstOffset, src, srcOffset, bytes);
  pushPut(*context, dst, dstOffset, src, srcOffset, bytes, nullptr);
}

void Channel::putWithSignal(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset,
                            uint64_t bytes, uint32_t signalId, uint64_t value, SignalOp op) {
  if (bytes == 0) return signal(signalId, value, op);  // the signal still matters ("no data for you")
  detail::ContextUse context = use("putWithSignal");
  checkPut(*context, dst, dstOffset, src, srcOffset, bytes);
  checkSignal(*context, signalId);
  const SignalUpdateArgs update{signalId, value, op};
  pushPut(*context, dst, dstOffset, src, srcOffset, bytes, &update);
}

void Channel::signal(uint32_t signalId, uint64_t value, SignalOp op) {
  detail::ContextUse context = use("signal");
  checkSignal(*context, signalId);
  push(*context, Command::signal(peer_, signalId, value, op, forwardTo_));
}

void Channel::atomicAdd(const Window& dst, uint64_t dstOffset, uint64_t value) {
  detail::ContextUse context = use("atomicAdd");
  std::string where = "rank " + std::to_string(context->rank()) + ": atomicAdd to peer " + std::to_string(peer_) + ": ";
  checkWindow(dst, where);
  if (forwardTo_ >= 0) throw Error(ErrorCode::kInvalidArgument, where + "atomics are not relayed");
  if (dstOffset % 8 != 0 || dstOffset > kMaxWindowOffset - 7)
    throw Error(ErrorCode::kInvalidArgument,
                where + "offset " + std::to_string(dstOffset) + " is not 8-byte aligned or cannot be addressed");
  std::string why = context->registry_->checkRemote(peer_, dst.id(), dstOffset, 8);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, where + why);
  push(*context, Command::atomicAdd(peer_, dst.id(), dstOffset, value));
}

void Channel::flush() {
  detail::ContextUse context = use("flush");
  const int64_t pos = positions_->last.load(std::memory_order_acquire);
  if (pos < 0) return;
  const uint64_t from = positions_->flushFrom.load(std::memory_order_acquire);
  if (from > static_cast<uint64_t>(pos)) return;  // an earlier flush covered everything
  Status s = ring_.waitCompleted(static_cast<uint64_t>(pos), from, static_cast<uint32_t>(peer_), peerFailure_);
  if (s != Status::kTimeout) {
    // Reported (or found fine) once: the next flush looks at later commands only.
    std::atomic<uint64_t>& f = positions_->flushFrom;
    uint64_t prev = f.load(std::memory_order_relaxed);
    while (prev < static_cast<uint64_t>(pos) + 1 && !f.compare_exchange_weak(prev, static_cast<uint64_t>(pos) + 1)) {
    }
  }
  if (s != Status::kOk) fail(*context, s, "flush");
}

}  // namespace gdx
