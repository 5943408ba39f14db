#include "transport/verbs/heartbeat_clock.hpp"

namespace gdx::verbs {

void HeartbeatClock::start(uint64_t nowNs) {
  active_ = true;
  lastLookNs_ = nowNs;
  silentNs_ = 0;
}

uint64_t HeartbeatClock::look(uint64_t nowNs, uint64_t heardNs) {
  if (!active_) return 0;
  const uint64_t since = nowNs > lastLookNs_ ? nowNs - lastLookNs_ : 0;
  const bool heard = heardNs > lastLookNs_;
  if (since > kMaxLookGapNs)
    silentNs_ = heard ? 0 : silentNs_;  // a gap in watching (this thread or the machine stalled): nothing counted
  else if (heard)
    silentNs_ = nowNs > heardNs ? nowNs - heardNs : 0;  // alive then: only the silence after it counts
  else
    silentNs_ += since;
  lastLookNs_ = nowNs;
  return silentNs_;
}

}  // namespace gdx::verbs
