#include "rdma/verbs/heartbeat_clock.hpp"

namespace gdx::verbs {

void HeartbeatClock::start(uint64_t nowNs) {
  active_ = true;
  lastLookNs_ = nowNs;
  silentNs_ = 0;
}

uint64_t HeartbeatClock::look(uint64_t nowNs, uint64_t heardNs) {
  if (!active_) return 0;
  const uint64_t since = nowNs > lastLookNs_ ? nowNs - lastLookNs_ : 0;
  if (heardNs > lastLookNs_)
    silentNs_ = nowNs > heardNs ? nowNs - heardNs : 0;  // alive then: only the silence after it counts
  else if (since <= kMaxLookGapNs)
    silentNs_ += since;
  // else: a gap in watching (this thread or the machine stalled); the peer may not have run either
  lastLookNs_ = nowNs;
  return silentNs_;
}

}  // namespace gdx::verbs
