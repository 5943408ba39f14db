// How a put becomes commands on a ring, shared by the host Channel and the device handle so that both cut puts the
// same way: pieces of at most kMaxCommandBytes, in order; on a relayed channel every piece is a relayPut pair whose
// second slot names the destination; a putWithSignal sends every piece but the last as plain (or relayed) puts and
// the last one as a putWithSignal pair, so the signal rides on the last piece and the ordering of the ring and the
// lane (and of the relay's copy queue) makes it visible only after all of them.
#pragma once

#include <cstdint>

#include "gdx/device.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/ring.hpp"
#include "gdx/status.hpp"
#include "gdx/types.hpp"

namespace gdx {

/// The fields every command of one put shares.
struct PutTarget {
  uint32_t peer;      ///< the rank the commands go to (the relay of a relayed channel)
  int32_t forwardTo;  ///< the relayed channel's destination; -1: not relayed
  uint32_t dstWindow;
  uint64_t dstOffset;
  uint32_t srcWindow;
  uint64_t srcOffset;
};

/// The signal a putWithSignal raises at the destination.
struct SignalUpdateArgs {
  uint32_t id;
  uint64_t value;
  SignalOp op;
};

/// Pushes the commands of a put of `bytes` (bytes > 0) onto `ring`, with `signal` on the last piece when given.
/// *lastPos is set to the ring position of every command pushed, so on an error it names the last one that was;
/// *firstPos (when given), if still ~0, to the first one (pieces are reserved one by one, so other producers'
/// commands may lie between them: the first position cannot be computed from the last).
GDX_HOST_DEVICE_INLINE Status pushPutCommands(const RingDeviceHandle& ring, const PutTarget& t, uint64_t bytes,
                                              const SignalUpdateArgs* signal, uint64_t* lastPos,
                                              uint64_t* firstPos = nullptr) {
  const uint64_t signalled = signal ? lastCommandOffset(bytes) : bytes;  // bytes sent before the signalled piece
  const bool relayed = t.forwardTo >= 0;
  for (uint64_t done = 0; done < signalled;) {
    const uint64_t n = bytes - done < kMaxCommandBytes ? bytes - done : kMaxCommandBytes;
    const Command put = Command::put(t.peer, t.srcWindow, t.srcOffset + done, t.dstWindow, t.dstOffset + done, n,
                                     relayed ? Opcode::kRelayPut : Opcode::kPut);
    const Status s =
        relayed ? ring.pushPair(put, Command::relayTo(t.peer, t.forwardTo), lastPos) : ring.push(put, lastPos);
    if (s != Status::kOk) return s;
    if (firstPos && *firstPos == ~uint64_t{0}) *firstPos = *lastPos - (relayed ? 1 : 0);
    done += n;
  }
  if (!signal) return Status::kOk;
  const Status s = ring.pushPair(Command::put(t.peer, t.srcWindow, t.srcOffset + signalled, t.dstWindow,
                                              t.dstOffset + signalled, bytes - signalled, Opcode::kPutWithSignal),
                                 Command::signal(t.peer, signal->id, signal->value, signal->op, t.forwardTo), lastPos);
  if (s == Status::kOk && firstPos && *firstPos == ~uint64_t{0}) *firstPos = *lastPos - 1;
  return s;
}

}  // namespace gdx
