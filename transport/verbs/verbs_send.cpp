// Send side of the verbs transport (the lane's thread only): validating and posting writes, atomics and messages as
// work requests on the QP's software backlog, handing the backlog to the QP within its send depth with selective
// signalling, and retiring work requests (and completing ops) as the send CQ reports them.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <shared_mutex>
#include <string>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/common/window_table.hpp"
#include "transport/verbs/verbs_transport.hpp"

namespace gdx::verbs {

void setSend(PendingWr& w, const void* record, uint32_t bytes) {
  w.opcode = IBV_WR_SEND;
  w.sendBytes = bytes;
  std::memcpy(w.send, record, bytes);
}

std::string VerbsLane::who() const {
  return t_.who() + " lane " + std::to_string(index_);
}

uint32_t VerbsLane::newOp(uint64_t cookie, int peer, uint32_t workRequests) {
  uint32_t i;
  if (!freeOps_.empty()) {
    i = freeOps_.back();
    freeOps_.pop_back();
  } else {
    i = static_cast<uint32_t>(ops_.size());
    ops_.emplace_back();
  }
  ops_[i] = OpSlot{cookie, peer, workRequests, Status::kOk};
  inFlight_.fetch_add(1, std::memory_order_relaxed);
  return i;
}

void VerbsLane::failedNow(uint64_t cookie, int peer) {
  inFlight_.fetch_add(1, std::memory_order_relaxed);
  done_.push_back(Completion{cookie, t_.stopping_.load() ? Status::kShutdown : Status::kPeerFailed, peer});
}

bool VerbsLane::injectFault(int peer, uint64_t cookie, common::FaultAction* action) {
  *action = t_.fault_.next(peer);
  if (*action == common::FaultAction::kNone) return false;
  GDX_WARN(who() << ": " << t_.fault_.plan().describe());
  switch (*action) {
    case common::FaultAction::kDrop:
      inFlight_.fetch_add(1, std::memory_order_relaxed);
      done_.push_back(Completion{cookie, Status::kOk, peer});
      return true;
    case common::FaultAction::kDelay:
      t_.fault_.sleepDelay([&] { return t_.stopping_.load(); });  // a shutdown ends the delay; the post goes on
      return false;
    case common::FaultAction::kClose: {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      if (ibv_modify_qp(qps_[peer].qp.get(), &attr, IBV_QP_STATE) != 0)
        GDX_WARN(who() << ": GDX_FAULT could not move the queue pair to peer " << peer << " to the error state");
      return false;  // the operation is posted into the failed queue pair and completes with an error
    }
    default: return false;
  }
}

// A local key no memory region has: the work request fails with a local protection error and takes the queue pair
// to the error state, as a damaged request would.
constexpr uint32_t kCorruptKeyMask = 0x5a5a5a5au;

void VerbsLane::finishWr(uint32_t i, Status status) {
  OpSlot& op = ops_[i];
  if (status != Status::kOk && op.status == Status::kOk) op.status = status;
  if (--op.remaining > 0) return;
  done_.push_back(Completion{op.cookie, op.status, op.peer});
  freeOps_.push_back(i);
}

void VerbsLane::post(const WriteOp& op) {
  std::string bad = common::checkWriteOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseWrite(who(), op, bad);
  uint64_t local = 0, remote = 0;
  uint32_t lkey = 0, rkey = 0;
  bool localStaged = false;
  int localDevice = -1;
  MemoryKind localKind = MemoryKind::kHost;
  WindowKey remoteKey{};
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    const auto ends = t_.windows_.findWrite(op, &bad);
    if (!ends.local) common::refuseWrite(who(), op, bad);
    remoteKey = ends.remote->key;
    if (remoteKey.staged && static_cast<uint32_t>(index_) >= remoteKey.stagingLanes)
      common::refuseWrite(who(), op,
                          "the remote window is staged and peer " + std::to_string(op.peer) +
                              " has no staging ring for lane " + std::to_string(index_));
    local = reinterpret_cast<uint64_t>(ends.local->base) + op.localOffset;
    localStaged = ends.local->staged;
    localDevice = ends.local->device;
    localKind = ends.local->kind;
    lkey = ends.local->mr ? ends.local->mr->lkey : 0;
    remote = remoteKey.addr + op.remoteOffset;
    rkey = remoteKey.rkey;
  }
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  common::FaultAction fault;
  if (injectFault(op.peer, op.cookie, &fault)) return;
  if (fault == common::FaultAction::kCorrupt) lkey ^= kCorruptKeyMask;
  if (localStaged || remoteKey.staged) {
    const uint64_t n = (op.bytes + kStageSlotBytes - 1) / kStageSlotBytes;
    const uint32_t id = newOp(op.cookie, op.peer, static_cast<uint32_t>(n * (remoteKey.staged ? 2 : 1)));
    return postStaged(op, id, reinterpret_cast<const char*>(local), localStaged, localDevice, localKind, lkey,
                      remoteKey);
  }
  const uint32_t chunk = std::min<uint32_t>(kMaxChunk, t_.port_.maxMsgBytes ? t_.port_.maxMsgBytes : kMaxChunk);
  const uint32_t n = static_cast<uint32_t>((op.bytes + chunk - 1) / chunk);
  const uint32_t id = newOp(op.cookie, op.peer, n);
  QpSlot& q = qps_[op.peer];
  for (uint32_t c = 0; c < n; ++c) {
    PendingWr w;
    w.op = id;
    const uint64_t off = uint64_t{c} * chunk;
    w.local = ibv_sge{local + off, static_cast<uint32_t>(std::min<uint64_t>(chunk, op.bytes - off)), lkey};
    w.remote = remote + off;
    w.rkey = rkey;
    const bool last = c + 1 == n;
    w.opcode = last && op.withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    w.imm = op.imm;
    q.backlog.push_back(w);
  }
  flush(op.peer);
}

void VerbsLane::postAtomic(const AtomicOp& op) {
  std::string bad = common::checkAtomicOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseAtomic(who(), op, bad);
  PendingWr w;
  {
    std::shared_lock<std::shared_mutex> lock(t_.windows_.mutex());
    const VerbsTransport::RemoteWindow* r = t_.windows_.findAtomicTarget(op, "verbs", &bad);
    if (!r) common::refuseAtomic(who(), op, bad);
    w.remote = r->key.addr + op.remoteOffset;
    w.rkey = r->key.rkey;
    if (t_.nativeAtomics_ && op.kind == SignalOp::kAdd && w.remote % common::kAtomicWordBytes != 0)
      common::refuseAtomic(who(), op,
                           "the word is not 8-byte aligned in memory (the window starts at an unaligned address)");
  }
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  common::FaultAction fault;
  if (injectFault(op.peer, op.cookie, &fault)) return;
  w.op = newOp(op.cookie, op.peer, 1);
  if (t_.nativeAtomics_ && op.kind == SignalOp::kAdd) {
    w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.add = op.value;
    // The scratch word takes the old value.
    w.local = ibv_sge{reinterpret_cast<uint64_t>(buffer_.get()), uint32_t{common::kAtomicWordBytes}, mr_->lkey};
  } else {
    const ControlRecord record{op.remoteWindow, static_cast<uint32_t>(op.kind), op.remoteOffset, op.value, 0, 0};
    setSend(w, &record, sizeof record);
  }
  if (fault == common::FaultAction::kCorrupt) w.local.lkey ^= kCorruptKeyMask;
  qps_[op.peer].backlog.push_back(w);
  flush(op.peer);
}

void VerbsLane::postMessage(const MessageOp& op) {
  std::string bad = common::checkMessageOp(op, t_.connected_, t_.world_);
  if (!bad.empty()) common::refuseMessage(who(), op, bad);
  if (t_.failed(op.peer) || t_.stopping_.load(std::memory_order_relaxed)) return failedNow(op.cookie, op.peer);
  MessageRecord record{};
  record.bytes = op.bytes;
  record.kind = kControlMessage;
  std::memcpy(record.data, op.data, op.bytes);
  common::FaultAction fault;
  if (injectFault(op.peer, op.cookie, &fault)) return;
  PendingWr w;
  w.op = newOp(op.cookie, op.peer, 1);
  setSend(w, &record, kMessageHeaderBytes + op.bytes);  // only the message's own bytes travel
  if (fault == common::FaultAction::kCorrupt) w.local.lkey ^= kCorruptKeyMask;
  qps_[op.peer].backlog.push_back(w);
  flush(op.peer);
}

void VerbsLane::abandon() {
  for (QpSlot& q : qps_) {
    q.qp.reset();
    q.backlog.clear();
    q.posted.clear();
  }
  for (bool& b : sendSlotBusy_) b = false;
  for (uint32_t i = 0; i < ops_.size(); ++i)
    if (ops_[i].remaining > 0) {
      ops_[i].remaining = 1;
      finishWr(i, Status::kShutdown);
    }
}

void VerbsLane::failBacklog(int peer) {
  QpSlot& q = qps_[peer];
  while (!q.backlog.empty()) {
    PendingWr p = q.backlog.front();
    q.backlog.pop_front();
    retire(peer, PostedWr{0, p.op, p.sendSlot, p.what}, Status::kPeerFailed);
  }
}

void VerbsLane::retire(int peer, const PostedWr& w, Status status) {
  if (w.sendSlot >= 0) sendSlotBusy_[w.sendSlot] = false;
  QpSlot& q = qps_[peer];
  if (w.what == PostedWr::kHeartbeat) q.heartbeat.stop();
  if (w.what == PostedWr::kCreditRead) creditReadDone(peer, status);
  if (w.op != kNoOp) finishWr(w.op, status);
}

void VerbsLane::flush(int peer) {
  QpSlot& q = qps_[peer];
  if (t_.failed(peer)) return failBacklog(peer);
  constexpr size_t kBatch = 32;
  ibv_send_wr wrs[kBatch];
  ibv_sge sges[kBatch];
  const uint32_t depth = static_cast<uint32_t>(t_.sendDepth_);
  const uint32_t every = static_cast<uint32_t>(std::min(t_.options_.signalEvery, t_.sendDepth_));
  while (!q.backlog.empty() && q.posted.size() < depth) {
    const size_t n = std::min({kBatch, q.backlog.size(), static_cast<size_t>(depth - q.posted.size())});
    const size_t before = q.posted.size();
    const uint32_t sinceSignal = q.sinceSignal;
    for (size_t i = 0; i < n; ++i) {
      const PendingWr& p = q.backlog[i];
      ibv_send_wr& wr = wrs[i];
      wr = ibv_send_wr{};
      const uint64_t seq = q.nextSeq + i;
      wr.wr_id = (static_cast<uint64_t>(peer) << 40) | (seq & kSeqMask);
      wr.next = i + 1 < n ? &wrs[i + 1] : nullptr;
      wr.sg_list = &sges[i];
      wr.num_sge = p.local.length > 0 ? 1 : 0;
      wr.opcode = p.opcode;
      // Selective signalling: every `every`-th, the last of the chain and RDMA reads (their result is awaited).
      if (++q.sinceSignal >= every || i + 1 == n || p.opcode == IBV_WR_RDMA_READ) {
        wr.send_flags = IBV_SEND_SIGNALED;
        q.sinceSignal = 0;
      }
      sges[i] = p.local;
      if (p.sendBytes > 0) {
        char* slot = buffer_.get() + creditEnd_ +
                     (static_cast<size_t>(peer) * t_.sendDepth_ + q.controlNext++ % t_.sendDepth_) * kControlSlotBytes;
        std::memcpy(slot, p.send, p.sendBytes);
        sges[i] = ibv_sge{reinterpret_cast<uint64_t>(slot), p.sendBytes, mr_->lkey};
        wr.num_sge = 1;
        if (p.sendBytes <= maxInline_) wr.send_flags |= IBV_SEND_INLINE;
      } else if (p.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = p.remote;
        wr.wr.atomic.rkey = p.rkey;
        wr.wr.atomic.compare_add = p.add;
      } else {
        wr.wr.rdma.remote_addr = p.remote;
        wr.wr.rdma.rkey = p.rkey;
        if (p.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htonl(p.imm);
        if (p.opcode != IBV_WR_RDMA_READ && p.local.length > 0 && p.local.length <= maxInline_)
          wr.send_flags |= IBV_SEND_INLINE;
      }
      q.posted.push_back(PostedWr{seq, p.op, p.sendSlot, p.what});
    }
    ibv_send_wr* bad = nullptr;
    try {
      GDX_IBV_CHECK(ibv_post_send(q.qp.get(), wrs, &bad));
    } catch (const VerbsError& e) {
      // Work requests before `bad` were posted; the rest were not and stay in the backlog (failed below).
      size_t posted = 0;
      while (posted < n && &wrs[posted] != bad) ++posted;
      q.posted.erase(q.posted.begin() + static_cast<std::ptrdiff_t>(before + posted), q.posted.end());
      q.sinceSignal = sinceSignal;
      q.nextSeq += posted;
      q.backlog.erase(q.backlog.begin(), q.backlog.begin() + static_cast<std::ptrdiff_t>(posted));
      t_.failPeer(peer,
                  "lane " + std::to_string(index_) + ": posting to rank " + std::to_string(peer) + ": " + e.what());
      return failBacklog(peer);
    }
    const uint64_t now = nowNs();
    if (before == 0) q.progressNs = now;
    q.lastPostNs = now;
    q.nextSeq += n;
    q.backlog.erase(q.backlog.begin(), q.backlog.begin() + static_cast<std::ptrdiff_t>(n));
  }
}

void VerbsLane::progress() {
  if (!t_.connected_ || t_.stopping_.load(std::memory_order_relaxed)) return;
  reapSendCq();
  watchPeers(nowNs());
}

void VerbsLane::reapSendCq() {
  ibv_wc wc[32];
  int n;
  while ((n = ibv_poll_cq(sendCq_.get(), 32, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      const int peer = static_cast<int>(wc[i].wr_id >> 40);
      const uint64_t seq = wc[i].wr_id & kSeqMask;
      QpSlot& q = qps_[peer];
      q.progressNs = nowNs();
      Status s = Status::kOk;
      if (wc[i].status != IBV_WC_SUCCESS) {
        s = Status::kPeerFailed;
        t_.failPeer(peer, "lane " + std::to_string(index_) + ": a work request to rank " + std::to_string(peer) +
                              " completed with status '" + ibv_wc_status_str(wc[i].status) + "' (vendor error " +
                              std::to_string(wc[i].vendor_err) + ")");
      }
      // Everything posted before the reported work request is done (and succeeded: RC completes in order).
      bool found = false;
      while (!q.posted.empty() && !found) {
        PostedWr w = q.posted.front();
        q.posted.pop_front();
        found = (w.seq & kSeqMask) == seq;
        retire(peer, w, found ? s : Status::kOk);
      }
      if (!found) GDX_ERROR(who() << ": a completion for an unknown work request to rank " << peer);
    }
    if (n < 32) break;
  }
  if (n < 0) GDX_ERROR(who() << ": ibv_poll_cq (send) failed");
}

bool VerbsLane::armCompletion() {
  if (!t_.connected_ || t_.stopping_.load(std::memory_order_relaxed)) return false;
  return ibv_req_notify_cq(sendCq_.get(), 0) == 0;
}

size_t VerbsLane::poll(Completion* out, size_t max) {
  progress();
  const size_t k = common::takeCompletions(done_, out, max);
  inFlight_.fetch_sub(k, std::memory_order_relaxed);
  return k;
}

}  // namespace gdx::verbs
