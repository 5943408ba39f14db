#include "gdx/channel.hpp"

#include <algorithm>

#include "gdx/context.hpp"
#include "gdx/detail/put_commands.hpp"
#include "gdx/error.hpp"

namespace gdx {
Channel::Channel(Context* context, int peer, int ringIndex, RingDeviceHandle ring, int forwardTo)
    : context_(context),
      peer_(peer),
      ringIndex_(ringIndex),
      forwardTo_(forwardTo),
      ring_(ring),
      lastPosition_(std::make_shared<std::atomic<int64_t>>(-1)) {}

void Channel::fail(Status status, const char* operation) const {
  std::string msg = "rank " + std::to_string(context_->rank()) + ": " + operation + " to peer " +
                    std::to_string(peer_) + " on ring " + std::to_string(ringIndex_) + " returned '" +
                    statusName(status) + "'";
  if (status == Status::kTimeout)
    msg += " after " + std::to_string(ring_.timeoutNs / 1000000) + " ms (ring completed " +
           std::to_string(atomicLoad(ring_.completed, kAcquire)) + " of " +
           std::to_string(atomicLoad(ring_.head, kRelaxed)) + " positions, consumed " +
           std::to_string(atomicLoad(ring_.tail, kAcquire)) + ")";
  std::string proxyError = context_->proxy().lastError();
  if (!proxyError.empty()) msg += "; proxy: " + proxyError;
  std::string failure = context_->failure();
  if (!failure.empty() && failure != proxyError) msg += "; " + failure;
  throw Error(errorCodeFor(status), msg);
}

void Channel::notePosition(uint64_t pos) {
  // Several threads may share this channel: flush() must cover the highest position any of them used.
  int64_t prev = lastPosition_->load(std::memory_order_relaxed);
  while (prev < static_cast<int64_t>(pos) && !lastPosition_->compare_exchange_weak(prev, static_cast<int64_t>(pos))) {
  }
}

void Channel::push(const Command& c) {
  uint64_t pos = 0;
  Status s = ring_.push(c, &pos);
  if (s != Status::kOk) fail(s, opcodeName(c.opcode()));
  notePosition(pos);
}

void Channel::pushPut(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset, uint64_t bytes,
                      const SignalUpdateArgs* signal) {
  const PutTarget target{static_cast<uint32_t>(peer_), forwardTo_, dst.id(), dstOffset, src.id(), srcOffset};
  uint64_t pos = ~uint64_t{0};
  Status s = pushPutCommands(ring_, target, bytes, signal, &pos);
  if (pos != ~uint64_t{0}) notePosition(pos);
  if (s != Status::kOk) fail(s, signal ? "putWithSignal" : "put");
}

void Channel::checkPut(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset,
                       uint64_t bytes) const {
  std::string where = "rank " + std::to_string(context_->rank()) + ": put to peer " + std::to_string(peer_) + ": ";
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, where + "zero-byte put");
  if (!src.valid() || !dst.valid()) throw Error(ErrorCode::kInvalidArgument, where + "window is not registered");
  std::string why = context_->registry_->checkLocal(src.id(), srcOffset, bytes);
  if (why.empty()) why = context_->registry_->checkRemote(peer_, dst.id(), dstOffset, bytes);
  if (why.empty() && forwardTo_ >= 0) why = context_->registry_->checkRemote(forwardTo_, dst.id(), dstOffset, bytes);
  if (why.empty() && (srcOffset + bytes - 1 > kMaxWindowOffset || dstOffset + bytes - 1 > kMaxWindowOffset))
    why = "offsets beyond " + std::to_string(kMaxWindowOffset) + " cannot be addressed";
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, where + why);
}

void Channel::checkSignal(uint32_t signalId) const {
  if (signalId >= context_->numSignals())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(context_->rank()) + ": signal id " +
                                                 std::to_string(signalId) +
                                                 " >= " + std::to_string(context_->numSignals()) + " signals");
}

void Channel::put(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset, uint64_t bytes) {
  if (bytes == 0) return;  // as in NVSHMEM: nothing to move
  checkPut(dst, dstOffset, src, srcOffset, bytes);
  pushPut(dst, dstOffset, src, srcOffset, bytes, nullptr);
}

void Channel::putWithSignal(const Window& dst, uint64_t dstOffset, const Window& src, uint64_t srcOffset,
                            uint64_t bytes, uint32_t signalId, uint64_t value, SignalOp op) {
  if (bytes == 0) return signal(signalId, value, op);  // the signal still matters ("no data for you")
  checkPut(dst, dstOffset, src, srcOffset, bytes);
  checkSignal(signalId);
  const SignalUpdateArgs update{signalId, value, op};
  pushPut(dst, dstOffset, src, srcOffset, bytes, &update);
}

void Channel::signal(uint32_t signalId, uint64_t value, SignalOp op) {
  checkSignal(signalId);
  push(Command::signal(peer_, signalId, value, op, forwardTo_));
}

void Channel::atomicAdd(const Window& dst, uint64_t dstOffset, uint64_t value) {
  std::string where =
      "rank " + std::to_string(context_->rank()) + ": atomicAdd to peer " + std::to_string(peer_) + ": ";
  if (!dst.valid()) throw Error(ErrorCode::kInvalidArgument, where + "window is not registered");
  if (forwardTo_ >= 0) throw Error(ErrorCode::kInvalidArgument, where + "atomics are not relayed");
  if (dstOffset % 8 != 0 || dstOffset > kMaxWindowOffset - 7)
    throw Error(ErrorCode::kInvalidArgument,
                where + "offset " + std::to_string(dstOffset) + " is not 8-byte aligned or cannot be addressed");
  std::string why = context_->registry_->checkRemote(peer_, dst.id(), dstOffset, 8);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, where + why);
  push(Command::atomicAdd(peer_, dst.id(), dstOffset, value));
}

void Channel::flush() {
  int64_t pos = lastPosition_->load(std::memory_order_acquire);
  if (pos < 0) return;
  Status s = ring_.waitCompleted(static_cast<uint64_t>(pos));
  if (s != Status::kOk) fail(s, "flush");
}

}  // namespace gdx
