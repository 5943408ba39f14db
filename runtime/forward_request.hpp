// The forward request of a relayed operation (runtime/relay.hpp): the control message the sender's proxy sends after
// the data, and what the relay checks of it before its copy queue acts on it. Free of CUDA and of the transports, so
// that the decoding can be fuzzed on its own.
#pragma once

#include <cstdint>
#include <string>

#include "gdx/device/impl/direct.hpp"
#include "transport/transport.hpp"

namespace gdx {

/// The control message a relay receives for every forwarded operation.
struct ForwardRequest {
  static constexpr uint32_t kMagic = 0x46574431;  // "FWD1"
  uint32_t magic = kMagic;
  uint32_t window = 0;  ///< window id, at the relay and at the destination
  uint64_t offset = 0;
  uint64_t bytes = 0;  ///< 0: only the signal
  uint64_t value = 0;
  int32_t destination = -1;  ///< the rank the relay forwards to
  uint32_t signalId = 0;
  uint8_t hasSignal = 0;  ///< 1: raise signalId at the destination after the data
  uint8_t signalOp = 0;   ///< a SignalOp
  uint8_t pad[6] = {};
};
static_assert(sizeof(ForwardRequest) <= kMaxMessageBytes, "a forward request fits in one control message");

/// Empty when `m` is a well-formed forward request (then *out holds it), else why not.
std::string decodeForward(const RemoteMessage& m, ForwardRequest* out);

/// Where a forwarded range goes: this rank's window as the GPU addresses it, the destination's mapped window, and the
/// destination's device signal word.
struct ForwardTarget {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t* signal = nullptr;
};
/// Empty when `d` (this GPU's table of the destination; null: not reached directly) serves `f`: a GPU window on both
/// ranks, the range within both, a signal id the destination has; then *out holds the addresses. Else why not.
std::string resolveForward(const ForwardRequest& f, const DirectPeer* d, ForwardTarget* out);

}  // namespace gdx
