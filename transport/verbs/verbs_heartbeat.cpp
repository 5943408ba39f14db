// Liveness of the verbs transport's peers, checked by each lane as it makes progress: a zero-byte RDMA write to every
// QP to another rank that has been idle for kHeartbeatNs, so that a peer that died without a word is noticed (by the
// retry error, or by the heartbeat going unanswered while the peer sends nothing, heartbeat_clock.hpp) even by a rank
// that only waits; and bounded waiting for work the NIC keeps retrying.
#include <algorithm>
#include <shared_mutex>
#include <string>

#include "transport/common/window_table.hpp"
#include "transport/verbs/verbs_transport.hpp"

namespace gdx::verbs {

void VerbsLane::queueHeartbeat(int peer, uint64_t now) {
  QpSlot& q = qps_[peer];
  q.lastPostNs = now;
  PendingWr h;
  {
    // A zero-byte write needs no valid target, but some providers check the rkey anyway: use a window's (or, for a
    // staged one, its staging area's).
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    bool found = false;
    for (const auto& [id, r] : t_.windows_.remotes(peer))
      if (r.key.staged ? r.key.stagingRkey != 0 : r.key.rkey != 0) {
        h.remote = r.key.staged ? r.key.stagingAddr : r.key.addr;
        h.rkey = r.key.staged ? r.key.stagingRkey : r.key.rkey;
        found = true;
        break;
      }
    if (!found) return;
  }
  h.op = kNoOp;
  h.what = PostedWr::kHeartbeat;
  h.opcode = IBV_WR_RDMA_WRITE;
  h.local.length = 0;  // a zero-byte write
  q.heartbeat.start(now);
  q.backlog.push_back(h);
  flush(peer);
}

void VerbsLane::watchPeers(uint64_t now) {
  // Bounded waiting: a peer whose queue pair vanished may leave the NIC retrying for long (Soft-RoCE does not
  // always give up at all), so no completion for timeoutNs while work is outstanding fails the peer; moving
  // the QP to the error state then flushes the outstanding work.
  for (int p = 0; p < t_.world_; ++p) {
    QpSlot& q = qps_[p];
    if (t_.failed(p)) {
      if (!q.backlog.empty()) failBacklog(p);
      continue;
    }
    const uint64_t heartbeatTimeout = std::min(kHeartbeatTimeoutNs, t_.options_.timeoutNs / 4);
    const uint64_t silentNs = q.heartbeat.look(now, t_.heardNs_[p].load(std::memory_order_relaxed));
    if (silentNs > heartbeatTimeout)
      t_.failPeer(p, "lane " + std::to_string(index_) + ": rank " + std::to_string(p) +
                         " did not answer a heartbeat and sent nothing for " + std::to_string(silentNs / 1000000) +
                         " ms (limit " + std::to_string(heartbeatTimeout / 1000000) + " ms; status timeout)");
    else if (!q.posted.empty() && now - q.progressNs > t_.options_.timeoutNs)
      t_.failPeer(p, "lane " + std::to_string(index_) + ": no completion from rank " + std::to_string(p) + " for " +
                         std::to_string((now - q.progressNs) / 1000000) + " ms with " +
                         std::to_string(q.posted.size()) + " work requests outstanding (status timeout)");
    else if (!q.backlog.empty())
      flush(p);
    else if (p != t_.rank_ && q.posted.empty() && now - q.lastPostNs > kHeartbeatNs)
      queueHeartbeat(p, now);
  }
}

}  // namespace gdx::verbs
