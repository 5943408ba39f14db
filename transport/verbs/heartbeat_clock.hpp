// How long an idle peer's heartbeat has gone unanswered, as the verbs transport's liveness check counts it.
//
// A heartbeat (a zero-byte RDMA write to a peer whose queue pair has been idle) is answered by the peer's NIC, or on
// Soft-RoCE by the peer's kernel; when its completion does not come, the peer is presumed dead. Counting from the
// post alone declared a live peer dead whenever the answer was late for reasons of this host: on a loaded Soft-RoCE
// guest the acknowledgement waited seconds behind other work while that same peer's messages kept arriving, and a
// watcher (or the whole machine) that was not running for a while found the heartbeat "old" the moment it looked.
// So the clock counts only silence that the watcher saw: anything received from the peer means it is alive (the
// count restarts from it), and a gap between two looks longer than kMaxLookGapNs is not counted (whoever should
// have answered may not have run either). A peer that is really gone sends nothing and its heartbeat stays
// unanswered, so the count still reaches the limit within about that time of watching. A watcher that looks less
// often than kMaxLookGapNs is covered by the transport's completion timeout (GDX_TIMEOUT_MS) instead.
#pragma once

#include <cstdint>

namespace gdx::verbs {

class HeartbeatClock {
 public:
  /// Longest gap between two looks that counts as watched time (a poll every millisecond is usual).
  static constexpr uint64_t kMaxLookGapNs = 100ull * 1000 * 1000;

  /// A heartbeat was posted at `nowNs`.
  void start(uint64_t nowNs);
  /// Its completion arrived (or the peer failed): nothing is outstanding.
  void stop() { active_ = false; }
  bool active() const { return active_; }
  /// A look at `nowNs`, where `heardNs` is when anything last arrived from the peer (0: never). Returns for how long
  /// the outstanding heartbeat has gone unanswered with the peer silent, in watched time (0 when none is outstanding).
  uint64_t look(uint64_t nowNs, uint64_t heardNs);

 private:
  bool active_ = false;
  uint64_t lastLookNs_ = 0;
  uint64_t silentNs_ = 0;
};

}  // namespace gdx::verbs
