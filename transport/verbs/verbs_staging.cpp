// Staged windows of the verbs transport (windows that cannot be registered with the NIC, see verbs_transport.hpp),
// both ends: the sender's send slots, credits and chunks (an RDMA write into the peer's ring and a control SEND
// naming it), and the receiver's staging area and how the receiver thread places a chunk and frees its slot.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <shared_mutex>
#include <string>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "transport/common/delivery.hpp"
#include "transport/common/op_checks.hpp"
#include "transport/common/window_table.hpp"
#include "transport/verbs/verbs_transport.hpp"

namespace gdx::verbs {

// ---- sending ---------------------------------------------------------------------------------------------------

template <class Ready>
bool VerbsLane::progressUntil(int peer, const char* what, Ready ready) {
  const uint64_t start = nowNs();
  for (uint64_t spins = 0;; ++spins) {
    if (ready()) return true;
    if (t_.failed(peer) || t_.stopping_.load(std::memory_order_relaxed)) return false;
    if (nowNs() - start > t_.options_.timeoutNs) {
      t_.failPeer(peer, "lane " + std::to_string(index_) + ": waited " + std::to_string((nowNs() - start) / 1000000) +
                            " ms for " + what + " of rank " + std::to_string(peer) + " (status timeout)");
      return false;
    }
    progress();
    if (spins > 1000) std::this_thread::yield();
  }
}

int32_t VerbsLane::acquireSendSlot(int peer, std::string* why) {
  if (!sendStaging_) {
    const size_t bytes = kStageSlots * kStageSlotBytes;
    AlignedBuffer b = alignedBuffer(bytes);
    UniqueMr mr(ibv_reg_mr(t_.pd_.get(), b.get(), bytes, IBV_ACCESS_LOCAL_WRITE));
    if (!mr) {
      *why = std::string("ibv_reg_mr (staging send slots): ") + std::strerror(errno);
      return -1;
    }
    sendStaging_ = std::move(b);
    sendStagingMr_ = std::move(mr);
  }
  auto freeSlot = [&] {
    for (uint32_t k = 0; k < kStageSlots; ++k)
      if (!sendSlotBusy_[(sendSlotNext_ + k) % kStageSlots]) return true;
    return false;
  };
  if (!progressUntil(peer, "a free staging send slot", freeSlot)) return -1;
  for (uint32_t k = 0;; ++k) {
    const uint32_t s = (sendSlotNext_ + k) % kStageSlots;
    if (sendSlotBusy_[s]) continue;
    sendSlotBusy_[s] = true;
    sendSlotNext_ = (s + 1) % kStageSlots;
    return static_cast<int32_t>(s);
  }
}

void VerbsLane::postStaged(const WriteOp& op, uint32_t id, const char* localBase, bool localStaged, int localDevice,
                           MemoryKind localKind, uint32_t lkey, const WindowKey& remote) {
  QpSlot& q = qps_[op.peer];
  const uint64_t n = (op.bytes + kStageSlotBytes - 1) / kStageSlotBytes;
  const uint32_t perChunk = remote.staged ? 2 : 1;
  for (uint64_t c = 0; c < n; ++c) {
    const uint64_t off = c * kStageSlotBytes;
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(kStageSlotBytes, op.bytes - off));
    const bool last = c + 1 == n;
    std::string why;
    PendingWr w;
    w.op = id;
    w.local = ibv_sge{reinterpret_cast<uint64_t>(localBase + off), len, lkey};
    if (localStaged) {
      w.sendSlot = acquireSendSlot(op.peer, &why);
      if (w.sendSlot >= 0) {
        char* slot = sendStaging_.get() + static_cast<size_t>(w.sendSlot) * kStageSlotBytes;
        if (localKind == MemoryKind::kCuda)
          why = copier_.copy(slot, localBase + off, len, localDevice);
        else
          std::memcpy(slot, localBase + off, len);
        w.local.addr = reinterpret_cast<uint64_t>(slot);
        w.local.lkey = sendStagingMr_->lkey;
        if (!why.empty()) {
          sendSlotBusy_[w.sendSlot] = false;
          w.sendSlot = -1;
        }
      }
    }
    uint64_t ringSlot = 0;
    if (why.empty() && (!localStaged || w.sendSlot >= 0) && remote.staged) {
      // A slot of the peer's ring (this lane, this rank) is free once the peer consumed the chunk kStageSlots back.
      auto credit = [&] {
        if (q.stagedSent - q.stagedFreed < kStageSlots) return true;
        if (!q.creditReadPending) {
          PendingWr r;
          r.op = kNoOp;
          r.what = PostedWr::kCreditRead;
          r.opcode = IBV_WR_RDMA_READ;
          r.local = ibv_sge{reinterpret_cast<uint64_t>(creditWord(op.peer)), uint32_t{kWordBytes}, mr_->lkey};
          r.remote = remote.stagingAddr + (static_cast<uint64_t>(index_) * t_.world_ + t_.rank_) * kWordBytes;
          r.rkey = remote.stagingRkey;
          q.creditReadPending = true;
          q.backlog.push_back(r);
          flush(op.peer);
        }
        return false;
      };
      if (progressUntil(op.peer, "a staging credit", credit)) {
        ringSlot = q.stagedSent++ % kStageSlots;
      } else {
        why = "no staging credit";
      }
    }
    if (!why.empty() || (localStaged && w.sendSlot < 0)) {
      if (w.sendSlot >= 0) sendSlotBusy_[w.sendSlot] = false;
      if (!t_.failed(op.peer) && !t_.stopping_.load())
        t_.failPeer(op.peer, "lane " + std::to_string(index_) + ": staging a write to rank " + std::to_string(op.peer) +
                                 ": " + why);
      // The chunks not queued complete with the failure (they were counted in the op).
      const Status s = t_.stopping_.load() ? Status::kShutdown : Status::kPeerFailed;
      for (uint64_t k = c; k < n; ++k)
        for (uint32_t j = 0; j < perChunk; ++j) finishWr(id, s);
      return flush(op.peer);
    }
    if (remote.staged) {
      const uint64_t ring = static_cast<uint64_t>(index_) * t_.world_ + t_.rank_;
      const uint64_t header = stagingHeaderBytes(remote.stagingLanes, static_cast<uint64_t>(t_.world_));
      w.opcode = IBV_WR_RDMA_WRITE;
      w.remote = remote.stagingAddr + header + (ring * kStageSlots + ringSlot) * kStageSlotBytes;
      w.rkey = remote.stagingRkey;
      q.backlog.push_back(w);
      PendingWr ctl;
      ctl.op = id;
      const ControlRecord record{op.remoteWindow,
                                 last && op.withImm ? kControlStagedImm : kControlStaged,
                                 op.remoteOffset + off,
                                 len,
                                 static_cast<uint32_t>(ringSlot),
                                 op.imm};
      setSend(ctl, &record, sizeof record);
      q.backlog.push_back(ctl);
    } else {
      w.opcode = last && op.withImm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      w.imm = op.imm;
      w.remote = remote.addr + op.remoteOffset + off;
      w.rkey = remote.rkey;
      q.backlog.push_back(w);
    }
    flush(op.peer);
  }
}

uint64_t* VerbsLane::creditWord(int peer) const {
  return reinterpret_cast<uint64_t*>(buffer_.get() + 64 + static_cast<size_t>(peer) * kWordBytes);
}

void VerbsLane::creditReadDone(int peer, Status status) {
  QpSlot& q = qps_[peer];
  q.creditReadPending = false;
  if (status != Status::kOk) return;
  const uint64_t consumed = atomicLoad(creditWord(peer), kAcquire);
  q.stagedFreed = std::max(q.stagedFreed, std::min(consumed, q.stagedSent));
}

// ---- receiving -------------------------------------------------------------------------------------------------

void VerbsTransport::ensureStagingArea() {
  if (staging_) return;
  stagingHeader_ = stagingHeaderBytes(static_cast<uint64_t>(options_.lanes), static_cast<uint64_t>(world_));
  const size_t bytes = stagingHeader_ + static_cast<size_t>(options_.lanes) * world_ * kStageSlots * kStageSlotBytes;
  AlignedBuffer b = alignedBuffer(bytes);
  UniqueMr mr(
      ibv_reg_mr(pd_.get(), b.get(), bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  if (!mr)
    throw VerbsError("ibv_reg_mr (receive staging, " + std::to_string(bytes) + " bytes)", errno, __FILE__, __LINE__);
  staging_ = std::move(b);
  stagingMr_ = std::move(mr);
  GDX_INFO(who() << ": receive staging area of " << bytes << " bytes (" << kStageSlots << " slots of "
                 << kStageSlotBytes << " bytes per lane and peer)");
}

void VerbsTransport::applyStaged(int lane, int peer, const ControlRecord& r) {
  std::string bad;
  bool announce = false;
  RemoteWrite announced{};
  {
    std::shared_lock<std::shared_mutex> lock(windows_.mutex());
    const LocalWindow* w = windows_.local(r.window);
    if (w == nullptr || !w->staged) {
      bad = "window " + std::to_string(r.window) + " is not a staged window here";
    } else if (w->access == RemoteAccess::kNone) {
      // The NIC checks a registered window's access; a staged one is written by this copy, which checks it instead.
      bad = "window " + std::to_string(r.window) + " may not be written by peers (nothing was written)";
    } else if (!staging_ || lane >= options_.lanes || r.slot >= kStageSlots || r.value == 0 ||
               r.value > kStageSlotBytes) {
      bad = "slot " + std::to_string(r.slot) + " / " + std::to_string(r.value) + " bytes is not a staging slot";
    } else {
      bad = common::checkRange(r.offset, r.value, w->bytes);
    }
    if (bad.empty()) {
      const size_t ring = static_cast<size_t>(lane) * world_ + peer;
      const char* src = staging_.get() + stagingHeader_ + (ring * kStageSlots + r.slot) * kStageSlotBytes;
      char* dst = w->base + r.offset;
      // Copied under the shared lock so the window cannot be deregistered meanwhile.
      if (w->kind == MemoryKind::kCuda)
        bad = rxCopier_.copy(dst, src, r.value, w->device);
      else
        std::memcpy(dst, src, r.value);
      if (bad.empty()) {
        // The slot may be reused: the sender reads this word (RDMA read) before it writes the slot again.
        atomicFetchAdd(reinterpret_cast<uint64_t*>(staging_.get()) + ring, uint64_t{1}, kRelease);
        announce = r.kind == kControlStagedImm;
        announced = RemoteWrite{peer, r.window, r.offset, r.value, r.imm};
      } else {
        bad = "copying a staged chunk into window " + std::to_string(r.window) + ": " + bad;
      }
    }
  }
  if (!bad.empty()) {
    failPeer(peer, "rank " + std::to_string(peer) + " sent a bad staged chunk: " + bad);
    return;
  }
  if (announce) common::announce(immHandler_, announced, [this] { return who(); });
}

}  // namespace gdx::verbs
