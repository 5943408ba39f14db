#include "runtime/forward_request.hpp"

#include <algorithm>
#include <cstring>

namespace gdx {

std::string decodeForward(const RemoteMessage& m, ForwardRequest* out) {
  if (m.bytes != sizeof(ForwardRequest)) return "a control message of " + std::to_string(m.bytes) + " bytes";
  std::memcpy(out, m.data, sizeof *out);
  if (out->magic != ForwardRequest::kMagic) return "a control message of unknown kind";
  if (out->hasSignal > 1 || out->signalOp > static_cast<uint8_t>(SignalOp::kSet))
    return "a forward request with signal operation " + std::to_string(out->hasSignal) + "/" +
           std::to_string(out->signalOp);
  return {};
}

std::string resolveForward(const ForwardRequest& f, const DirectPeer* d, ForwardTarget* out) {
  if (!d) return "rank " + std::to_string(f.destination) + " is not reached directly from this GPU";
  if (f.bytes == 0 && !f.hasSignal) return "a forward request with neither data nor a signal";
  if (f.hasSignal && f.signalId >= d->peerNumSignals) return "signal id out of range";
  out->signal = f.hasSignal ? d->peerSignals + f.signalId : nullptr;
  out->src = nullptr;
  out->dst = nullptr;
  // A signal alone (a relayed signal, a put of no bytes) names no window: the request's window field is then
  // whatever the sender left there, and need not be a GPU window on either rank.
  if (f.bytes == 0) return {};
  if (f.window >= kMaxWindows || !d->localBase[f.window] || !d->peerBase[f.window])
    return "window " + std::to_string(f.window) + " is not a GPU window on both ranks";
  const uint64_t limit = std::min(d->localBytes[f.window], d->peerBytes[f.window]);
  if (f.offset > limit || f.bytes > limit - f.offset)
    return "range past the end of the window (" + std::to_string(limit) + " bytes)";
  out->src = d->localBase[f.window] + f.offset;
  out->dst = d->peerBase[f.window] + f.offset;
  return {};
}

}  // namespace gdx
