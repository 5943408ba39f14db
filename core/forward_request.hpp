// The control message a relay receives for every forwarded operation (a putWithSignal, put or signal sent through
// Context::relayChannel): the sender's proxy writes the data into the relay's copy of the destination window and
// then posts this message on the same lane, so the relay handles it only once that data is in place. The relay
// hands the range on to its PeerCopyQueue, which copies it into the destination rank's window (same id, same
// offset) over NVLink and then updates the destination's signal.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "gdx/transport.hpp"

namespace gdx {

struct ForwardRequest {
  static constexpr uint32_t kMagic = 0x46574431;  // "FWD1"
  static constexpr uint8_t kSignalNone = 0, kSignalAdd = 1, kSignalSet = 2;
  uint32_t magic = kMagic;
  uint32_t window = 0;       ///< window id, at the relay and at the destination
  uint64_t offset = 0;
  uint64_t bytes = 0;        ///< 0: only the signal
  uint64_t value = 0;
  int32_t destination = -1;  ///< the rank the relay forwards to
  uint32_t signalId = 0;
  uint8_t signalOp = kSignalNone;
  uint8_t pad[7] = {};
};
static_assert(sizeof(ForwardRequest) <= kMaxMessageBytes, "a forward request fits in one control message");

inline MessageOp encodeForward(int relay, const ForwardRequest& r, uint64_t cookie) {
  MessageOp m;
  m.peer = relay;
  m.bytes = sizeof r;
  std::memcpy(m.data, &r, sizeof r);
  m.cookie = cookie;
  return m;
}

/// Empty when `m` is a well-formed forward request (then *out holds it), else why not.
inline std::string decodeForward(const RemoteMessage& m, ForwardRequest* out) {
  if (m.bytes != sizeof(ForwardRequest)) return "a control message of " + std::to_string(m.bytes) + " bytes";
  std::memcpy(out, m.data, sizeof *out);
  if (out->magic != ForwardRequest::kMagic) return "a control message of unknown kind";
  if (out->signalOp > ForwardRequest::kSignalSet) return "a forward request with signal operation " + std::to_string(out->signalOp);
  return {};
}

}  // namespace gdx
