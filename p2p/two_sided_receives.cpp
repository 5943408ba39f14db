// TwoSided, the receiver's side (two_sided.hpp). Receives are numbered in the order they are posted: a large one
// grants the sender its buffer (kClearToSend), a small one takes its data from the eager buffer, whether the data
// came first or the receive did, and returns the slot as a credit. A receive that fails takes nothing more, and the
// sender is told.
#include <algorithm>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/two_sided.hpp"

namespace gdx::p2p {
namespace {

/// The receiver reports freed eager slots on its own (kCredit) once this many are unreported; fewer ride on the
/// next clear-to-send.
constexpr uint32_t kCreditBatch = kEagerSlots / 2;

}  // namespace

void TwoSided::recv(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces, Actions& out) {
  t->setWaiting("the peer's matching send");
  std::vector<ControlMsg> key;
  for (size_t index = 0; index < pieces.size(); ++index) {
    const Piece& p = pieces[index];
    const uint64_t seq = takeRecvSeq();
    const uint32_t low = static_cast<uint32_t>(seq) & kSeqMask;
    const ErrorCode failed = t->failureCode();
    if (failed != ErrorCode::kOk) {  // an earlier buffer of it failed: this one takes nothing either
      abandonRecv(seq, failed, out);
      continue;
    }
    try {
      PendingRecv r{t, p.size, seq, p, index};
      auto early = early_.find(low);
      auto announced = rts_.find(low);
      const uint64_t largeSend = announced == rts_.end() ? 0 : announced->second;
      if (announced != rts_.end()) rts_.erase(announced);
      if (p.size <= kEagerBytes) {
        // A message that fits comes through the eager buffer and needs nothing from this side but credits: those
        // owed go now (a receive posted after the last one returned means the application reads a stream).
        key.clear();
        keys_.offerEagerBuffer(key);
        for (const ControlMsg& part : key) post(out, part);
        flushCredits(out);
        if (early != early_.end()) {  // the data came first: take it now (or fail if it does not fit)
          const EarlyData e = early->second;
          early_.erase(early);
          takeEager(r, e.slot, e.bytes, out);
        } else if (largeSend) {  // larger than kEagerBytes, so larger than this buffer
          refuseSend(r, largeSend, out);
        } else {
          recvs_[low] = r;
        }
        continue;
      }
      if (early != early_.end()) {  // a small send's data is here for this large receive: it takes it
        const EarlyData e = early->second;
        early_.erase(early);
        takeEager(r, e.slot, e.bytes, out);
        continue;
      }
      if (largeSend > p.size) {  // it announced itself too large: refused before any of the buffer is granted
        refuseSend(r, largeSend, out);
        continue;
      }
      r.sent = largeSend;  // 0 until the send announces itself (onRequestToSend), if it is a large one
      ControlMsg cts;
      cts.type = MsgType::kClearToSend;
      cts.id = seq;
      key.clear();
      // Exactly this receive's buffer, until its data arrived; its key goes to the peer before the clear-to-send.
      cts.window = keys_.grant(p, LocalWindows::GrantFor::kReceive, seq, key);
      for (const ControlMsg& part : key) post(out, part);
      cts.offset = 0;
      cts.bytes = p.size;
      recvs_[low] = r;
      cts.credits = takeCredits();
      post(out, cts);
    } catch (const Error& e) {
      t->fail(e.code(), std::string("receive #") + std::to_string(seq) + ": " + e.what());
      recvs_.erase(low);
      abandonRecv(seq, e.code(), out);
      abandonFailedRecvs(out);  // the buffers of it posted before this one
    }
  }
}

std::string TwoSided::tooLarge(uint64_t seq, uint64_t sendBytes, uint64_t bufferBytes) {
  return "receive #" + std::to_string(seq) + ": the peer's send is " + std::to_string(sendBytes) +
         " bytes, larger than this receive's buffer of " + std::to_string(bufferBytes) + " bytes (nothing was written)";
}

void TwoSided::refuseSend(const PendingRecv& r, uint64_t sendBytes, Actions& out) {
  r.t->fail(ErrorCode::kInvalidArgument, tooLarge(r.seq, sendBytes, r.bytes));
  noteReceiveFailedTold(r.seq);
  ControlMsg no;
  no.type = MsgType::kReceiveRefused;
  no.id = r.seq;
  no.bytes = r.bytes;
  post(out, no);
  abandonFailedRecvs(out);  // the receive's other buffers
}

void TwoSided::onSendRefused(const ControlMsg& m, Actions& out) {
  auto it = recvs_.find(static_cast<uint32_t>(m.id) & kSeqMask);
  if (it == recvs_.end()) return;
  it->second.t->fail(ErrorCode::kInvalidArgument, tooLarge(it->second.seq, m.bytes, it->second.bytes));
  recvs_.erase(it);
  abandonFailedRecvs(out);  // the receive's other buffers
}

void TwoSided::abandonRecv(uint64_t seq, ErrorCode code, Actions& out) {
  const uint32_t low = static_cast<uint32_t>(seq) & kSeqMask;
  // The sender hears of it before the credit of its eager data (below), which would otherwise confirm the send.
  tellReceiveFailed(seq, code, out);
  auto early = early_.find(low);
  if (early != early_.end()) {  // its eager data is here: dropped
    early_.erase(early);
    freeEagerSlot(out);
    return;
  }
  // A large send that announced itself waits for a clear-to-send that never comes: nothing of it will arrive.
  if (rts_.erase(low)) return;
  failedRecvs_[low] = seq;  // its eager data, or a write after its clear-to-send, may be on the way
}

void TwoSided::tellReceiveFailed(uint64_t seq, ErrorCode code, Actions& out) {
  noteReceiveFailedTold(seq);
  tell(out, MsgType::kReceiveFailed, seq, code, "that receive #" + std::to_string(seq) + " failed");
}

void TwoSided::abandonFailedRecvs(Actions& out) {
  std::vector<std::pair<uint64_t, ErrorCode>> failed;
  takeFailed(
      recvs_, [](const auto& r) { return r.second.seq; }, failed);
  std::sort(failed.begin(), failed.end());  // the sender hears of them in order
  for (const auto& f : failed) abandonRecv(f.first, f.second, out);
}

bool TwoSided::arrivedForFailedRecv(uint64_t seq) {
  if (failedRecvs_.empty()) return false;
  bool failed = false;
  // Sends arrive in the order of their numbers: those of failed receives before this one will never come.
  for (auto it = failedRecvs_.begin(); it != failedRecvs_.end();) {
    failed |= it->second == seq;
    it = it->second <= seq ? failedRecvs_.erase(it) : std::next(it);
  }
  return failed;
}

void TwoSided::flushCredits(Actions& out) {
  if (creditsFreed_ == 0) return;
  ControlMsg credit;
  credit.type = MsgType::kCredit;
  credit.credits = takeCredits();
  post(out, credit);
}

void TwoSided::onRequestToSend(const ControlMsg& m, Actions& out) {
  const uint32_t low = static_cast<uint32_t>(m.id) & kSeqMask;
  auto it = recvs_.find(low);
  if (it == recvs_.end()) {
    if (failedRecvs_.count(low)) return;  // its receive failed, and the sender was told
    rts_[low] = m.bytes;                  // the receive is not posted yet: it checks when it is
    return;
  }
  if (it->second.bytes > kEagerBytes) {  // a large receive sent its clear-to-send; the sender compares sizes
    it->second.sent = m.bytes;           // the size the receive reports once the data is in place
    return;
  }
  PendingRecv r = it->second;
  recvs_.erase(it);
  refuseSend(r, m.bytes, out);
}

uint32_t TwoSided::takeCredits() {
  const uint32_t n = creditsFreed_;
  creditsFreed_ = 0;
  return n;
}

void TwoSided::takeEager(const PendingRecv& r, uint32_t slot, uint64_t bytes, Actions& out) {
  if (bytes > r.bytes) {
    refuseSend(r, bytes, out);
  } else {
    bool dropped = false;
    try {
      // Never into memory its caller may have taken back: that of a receive that failed already (a receive with a
      // part outstanding is finished only by failing), or of a region deregistered while the receive was pending.
      if (windows_.forgotten(r.piece.region.window))
        throw Error(ErrorCode::kInvalidArgument, "memory region " + std::to_string(r.piece.region.window) +
                                                     " was deregistered while the receive was pending");
      dropped = r.t->finished();
      if (!dropped) {
        copyFromHost(r.piece.region.base + r.piece.offset, r.piece.region.kind, windows_.eagerSlot(slot), bytes,
                     "copying eager data");
        r.t->finishPart(r.index, bytes);
      }
    } catch (const Error& e) {
      r.t->fail(e.code(), "receive #" + std::to_string(r.seq) + ": " + e.message() + " (nothing was written)");
      dropped = true;
    }
    if (dropped) {  // the sender hears of it before the slot's credit, which would otherwise confirm the send
      tellReceiveFailed(r.seq, r.t->failureCode(), out);
      abandonFailedRecvs(out);
    }
  }
  freeEagerSlot(out);
}

void TwoSided::freeEagerSlot(Actions& out) {
  // The freed slot is this side's confirmation that the send arrived whole: it goes back with the next eager write
  // to the peer (a reply), with the next receive posted, or on its own once it is kCreditDelayNs old.
  if (creditsFreed_++ == 0) creditsOwedSinceNs_ = nowNs();
  if (creditsFreed_ >= kCreditBatch) flushCredits(out);
}

void TwoSided::onEagerData(uint32_t imm, uint64_t bytes, Actions& out) {
  onCredits((imm >> kEagerCreditShift) & kEagerCreditMask, out);
  // Sends arrive in the order of their numbers: the full number is the next one at or after the last arrival's
  // successor with these low bits (sends refused before they left leave gaps, never 2^16 of them).
  const uint64_t seq = nextArrival_ + ((static_cast<uint64_t>(imm & kEagerSeqBits) - nextArrival_) & kEagerSeqBits);
  nextArrival_ = seq + 1;
  windows_.revokeReceivesBefore(nextArrival_);
  const uint32_t low = static_cast<uint32_t>(seq) & kSeqMask;
  const uint32_t slot = static_cast<uint32_t>(eagerArrived_++ % kEagerSlots);
  if (bytes == 0 || bytes > kEagerBytes || early_.size() >= kEagerSlots || !windows_.eagerBufferMade())
    return fail(out, ErrorCode::kProtocol,
                "eager data of " + std::to_string(bytes) + " bytes for send #" + std::to_string(low) +
                    " does not fit the eager buffer (" + std::to_string(early_.size()) + " of " +
                    std::to_string(kEagerSlots) + " slots held): the peer ignored its credits");
  if (arrivedForFailedRecv(seq)) return freeEagerSlot(out);  // its receive failed: dropped (the sender was told)
  auto it = recvs_.find(low);
  if (it == recvs_.end()) {
    early_[low] = EarlyData{slot, bytes};  // held until the receive is posted
    return;
  }
  PendingRecv r = it->second;
  recvs_.erase(it);
  takeEager(r, slot, bytes, out);
}

void TwoSided::onWriteArrived(uint32_t imm, Actions& out) {
  auto it = recvs_.find(imm);
  if (it == recvs_.end()) {
    auto failed = failedRecvs_.find(imm);
    if (failed == failedRecvs_.end())
      return fail(out, ErrorCode::kProtocol,
                  "data arrived for receive #" + std::to_string(imm) + ", which was never posted");
    // The write left before the sender heard that its receive failed: the transport placed the data (the region
    // was still registered), which the receive's caller was told it would not get.
    const uint64_t seq = failed->second;
    GDX_WARN(name_ << ": the data of send #" << seq << " arrived after its receive had failed");
    arrivedForFailedRecv(seq);
    nextArrival_ = seq + 1;
    windows_.revokeReceivesBefore(nextArrival_);
    return;
  }
  arrivedForFailedRecv(it->second.seq);  // failed receives before it will see nothing more
  nextArrival_ = it->second.seq + 1;
  windows_.revokeReceivesBefore(nextArrival_);  // the data is in place: the peer may write there no more
  const PendingRecv r = it->second;
  recvs_.erase(it);
  // Its size is the one the send announced before its write (kRequestToSend), which the sender checked against the
  // buffer; the grant kept the write inside the buffer whatever it was.
  if (r.sent == 0 || r.sent > r.bytes)
    return fail(
        out, ErrorCode::kProtocol,
        "the data of send #" + std::to_string(r.seq) + " arrived " +
            (r.sent ? "announced as " + std::to_string(r.sent) + " bytes, larger " : std::string("unannounced, ")) +
            "for a receive of " + std::to_string(r.bytes) + " bytes");
  r.t->finishPart(r.index, r.sent);
}

}  // namespace gdx::p2p
