// Receive side of the verbs transport: the receives kept posted on every QP, the one receiver thread that polls
// the shared receive CQ (busy for a while, then blocking on the completion channel), and what it does with each
// completion: an immediate is announced, a SEND is a control record (software atomic, staged chunk) or a message.
#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <shared_mutex>
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

void VerbsTransport::postReceive(int lane, int peer, uint32_t slot) {
  const size_t qpIndex = static_cast<size_t>(lane) * world_ + peer;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(recvBuffer_.get() + (qpIndex * recvDepth_ + slot) * kRecvSlotBytes);
  sge.length = kRecvSlotBytes;
  sge.lkey = recvMr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = (static_cast<uint64_t>(qpIndex) << 32) | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  GDX_IBV_CHECK(ibv_post_recv(lanes_[lane]->qp(peer), &wr, &bad));
}

namespace {

/// How long the receiver thread polls its CQ after the last receive before it sleeps on the completion channel: a
/// reply to a small message comes within this on a real NIC, and polling longer only takes CPU from the threads
/// (and, on Soft-RoCE, the kernel) that produce the next one.
constexpr uint64_t kReceiveSpinNs = 50 * 1000;
/// Polls of the receive CQ between two looks at the completion channel while the thread does not sleep.
constexpr uint64_t kChannelLookTurns = 64;
/// Longest sleep on the completion channel, so that rxStop_ is seen within it.
constexpr int kReceiveSleepMs = 20;

}  // namespace

void VerbsTransport::takeChannelEvents(bool* recvArmed) {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  // The channel's fd is non-blocking (constructor): this returns once no event is left.
  while (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    if (cq == recvCq_.get()) {
      *recvArmed = false;
    } else if (ctx != nullptr && completionHandler_) {
      completionHandler_(static_cast<VerbsLane*>(ctx)->index());
    }
  }
}

void VerbsTransport::receiverLoop() {
  ibv_wc wc[32];
  bool armed = false;
  uint64_t activeNs = nowNs();
  for (uint64_t turn = 0; !rxStop_.load(std::memory_order_acquire); ++turn) {
    // While receives keep this thread polling, a send CQ event (a caller sleeping on its completions) would wait for
    // the next quiet spell: look at the channel now and then (it is non-blocking), not only when about to sleep.
    if (turn % kChannelLookTurns == kChannelLookTurns - 1) takeChannelEvents(&armed);
    int n = ibv_poll_cq(recvCq_.get(), 32, wc);
    if (n < 0) {
      GDX_ERROR(who() << ": ibv_poll_cq (receive) failed; receiver stops");
      for (int p = 0; p < world_; ++p) failPeer(p, "polling the receive completion queue failed");
      return;
    }
    for (int i = 0; i < n; ++i) onReceive(wc[i]);
    if (n > 0) {
      activeNs = nowNs();
      continue;
    }
    if (nowNs() - activeNs < kReceiveSpinNs) continue;
    if (!armed) {
      if (ibv_req_notify_cq(recvCq_.get(), 0) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      armed = true;
      continue;  // poll once more: a completion may have arrived before the CQ was armed
    }
    pollfd pfd{channel_->fd, POLLIN, 0};
    if (::poll(&pfd, 1, kReceiveSleepMs) > 0) takeChannelEvents(&armed);
    // A receive event (armed now false) starts a new spell of polling; a send CQ's event alone does not.
    if (!armed) activeNs = nowNs();
  }
}

void VerbsTransport::onReceive(const ibv_wc& wc) {
  const size_t qpIndex = wc.wr_id >> 32;
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffffffffu);
  const int lane = static_cast<int>(qpIndex / world_), peer = static_cast<int>(qpIndex % world_);
  if (wc.status != IBV_WC_SUCCESS) {
    if (!stopping_.load())
      failPeer(peer, "lane " + std::to_string(lane) + ": a receive from rank " + std::to_string(peer) +
                         " completed with status '" + ibv_wc_status_str(wc.status) + "' (vendor error " +
                         std::to_string(wc.vendor_err) + ")");
    return;
  }
  if (failed(peer)) return;
  heardNs_[peer].store(nowNs(), std::memory_order_relaxed);  // it is alive, whatever its heartbeat says
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    common::announce(immHandler_, RemoteWrite{peer, kUnknownRemoteWindow, 0, wc.byte_len, ntohl(wc.imm_data)},
                     [this] { return who(); });
  } else {
    const char* data = recvBuffer_.get() + (qpIndex * recvDepth_ + slot) * kRecvSlotBytes;
    std::string bad = wc.opcode == IBV_WC_RECV ? applySend(lane, peer, data, wc.byte_len) : "an unexpected opcode";
    if (!bad.empty()) {
      failPeer(peer, "lane " + std::to_string(lane) + ": rank " + std::to_string(peer) +
                         " sent an unexpected message (opcode " + std::to_string(wc.opcode) + ", " +
                         std::to_string(wc.byte_len) + " bytes): " + bad);
      return;
    }
  }
  try {
    postReceive(lane, peer, slot);
  } catch (const Error& e) {
    if (!stopping_.load()) failPeer(peer, std::string("reposting a receive: ") + e.what());
  }
}

std::string VerbsTransport::applySend(int lane, int peer, const char* data, uint32_t bytes) {
  SendRecord r;
  std::string bad = decodeSend(data, bytes, &r);
  if (!bad.empty()) return bad;
  if (r.kind == SendRecord::Kind::kMessage)
    deliver(peer, r.message);
  else if (r.kind == SendRecord::Kind::kStaged)
    applyStaged(lane, peer, r.control);
  else
    applyControl(peer, r.control);
  return "";
}

void VerbsTransport::deliver(int peer, const MessageRecord& r) {
  RemoteMessage m;
  m.peer = peer;
  m.bytes = r.bytes;
  std::memcpy(m.data, r.data, r.bytes);
  common::deliverMessage(messageHandler_, m, [this] { return who(); });
}

void VerbsTransport::applyControl(int peer, const ControlRecord& r) {
  std::string bad;
  uint64_t* word = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(windows_.mutex());
    const LocalWindow* w = windows_.local(r.window);
    if (r.kind > static_cast<uint32_t>(SignalOp::kSet)) {
      bad = "unknown atomic kind " + std::to_string(r.kind);
    } else if (w == nullptr) {
      bad = "window " + std::to_string(r.window) + " is not registered here";
    } else if (w->access != RemoteAccess::kWrite) {  // an atomic carries no immediate
      bad = "window " + std::to_string(r.window) + " may not be changed by peers (nothing was changed)";
    } else if (w->kind != MemoryKind::kHost) {
      bad = "window " + std::to_string(r.window) + " is GPU memory";
    } else {
      bad = common::checkRange(r.offset, common::kAtomicWordBytes, w->bytes);
      // The address is formed only once the range is known to lie in the window.
      if (bad.empty() && reinterpret_cast<uintptr_t>(w->base + r.offset) % common::kAtomicWordBytes != 0)
        bad = "the word is not 8-byte aligned";
      if (bad.empty()) word = reinterpret_cast<uint64_t*>(w->base + r.offset);
    }
    if (word) {
      // Performed under the shared lock so the window cannot be deregistered meanwhile.
      if (r.kind == static_cast<uint32_t>(SignalOp::kAdd))
        atomicFetchAdd(word, r.value, kRelease);
      else
        atomicStore(word, r.value, kRelease);
      return;
    }
  }
  failPeer(peer, "rank " + std::to_string(peer) + " sent a malformed atomic: " + bad);
}

}  // namespace gdx::verbs
