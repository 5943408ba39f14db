// Connection, the receiver's side of sends and receives (connection.hpp). Receives are numbered in the order they are
// posted: a large one grants the sender its buffer (kClearToSend), a small one takes its data from the eager buffer,
// whether the data came first or the receive did, and returns the slot as a credit. A receive that fails takes
// nothing more, and the sender is told.
#include <algorithm>

#include "gdx/detail/clock.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/memory_kind.hpp"
#include "p2p/two_sided.hpp"

namespace gdx::p2p {
namespace {

/// The receiver reports freed eager slots on its own (kCredit) once this many are unreported; fewer ride on the
/// next clear-to-send.
constexpr uint32_t kCreditBatch = kEagerSlots / 2;

}  // namespace

void Connection::runRecv(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces) {
  track(t);
  t->setWaiting("the peer's matching send");
  for (size_t index = 0; index < pieces.size(); ++index) {
    const Piece& p = pieces[index];
    const uint64_t seq = takeRecvSeq();
    const uint32_t key = static_cast<uint32_t>(seq) & kSeqMask;
    const ErrorCode failed = t->failureCode();
    if (failed != ErrorCode::kOk) {  // an earlier buffer of it failed: this one takes nothing either
      abandonRecv(seq, failed);
      continue;
    }
    try {
      PendingRecv r{t, p.size, seq, p, index};
      auto early = early_.find(key);
      auto announced = rts_.find(key);
      const uint64_t largeSend = announced == rts_.end() ? 0 : announced->second;
      if (announced != rts_.end()) rts_.erase(announced);
      if (p.size <= kEagerBytes) {
        // A message that fits comes through the eager buffer and needs nothing from this side but credits: those
        // owed go now (a receive posted after the last one returned means the application reads a stream).
        offerEagerBuffer();
        flushCredits();
        if (early != early_.end()) {  // the data came first: take it now (or fail if it does not fit)
          const EarlyData e = early->second;
          early_.erase(early);
          takeEager(r, e.slot, e.bytes);
        } else if (largeSend) {  // larger than kEagerBytes, so larger than this buffer
          refuseSend(r, largeSend);
        } else {
          recvs_[key] = r;
        }
        continue;
      }
      if (early != early_.end()) {  // a small send's data is here for this large receive: it takes it
        const EarlyData e = early->second;
        early_.erase(early);
        takeEager(r, e.slot, e.bytes);
        continue;
      }
      if (largeSend > p.size) {  // it announced itself too large: refused before any of the buffer is granted
        refuseSend(r, largeSend);
        continue;
      }
      r.sent = largeSend;  // 0 until the send announces itself (onRequestToSend), if it is a large one
      ControlMsg cts;
      cts.type = MsgType::kClearToSend;
      cts.id = seq;
      cts.window =
          grant(p, LocalWindows::GrantFor::kReceive, seq);  // exactly this receive's buffer, until its data arrived
      cts.offset = 0;
      cts.bytes = p.size;
      recvs_[key] = r;
      cts.credits = takeCredits();
      postControl(cts);
    } catch (const Error& e) {
      t->fail(e.code(), std::string("receive #") + std::to_string(seq) + ": " + e.what());
      recvs_.erase(key);
      abandonRecv(seq, e.code());
      abandonFailedRecvs();  // the buffers of it posted before this one
    }
  }
}

std::string Connection::tooLarge(uint64_t seq, uint64_t sendBytes, uint64_t bufferBytes) {
  return "receive #" + std::to_string(seq) + ": the peer's send is " + std::to_string(sendBytes) +
         " bytes, larger than this receive's buffer of " + std::to_string(bufferBytes) + " bytes (nothing was written)";
}

void Connection::refuseSend(const PendingRecv& r, uint64_t sendBytes) {
  r.t->fail(ErrorCode::kInvalidArgument, tooLarge(r.seq, sendBytes, r.bytes));
  noteReceiveFailedTold(r.seq);
  ControlMsg no;
  no.type = MsgType::kReceiveRefused;
  no.id = r.seq;
  no.bytes = r.bytes;
  postControl(no);
  abandonFailedRecvs();  // the receive's other buffers
}

void Connection::abandonRecv(uint64_t seq, ErrorCode code) {
  const uint32_t key = static_cast<uint32_t>(seq) & kSeqMask;
  // The sender hears of it before the credit of its eager data (below), which would otherwise confirm the send.
  tellReceiveFailed(seq, code);
  auto early = early_.find(key);
  if (early != early_.end()) {  // its eager data is here: dropped
    early_.erase(early);
    freeEagerSlot();
    return;
  }
  // A large send that announced itself waits for a clear-to-send that never comes: nothing of it will arrive.
  if (rts_.erase(key)) return;
  failedRecvs_[key] = seq;  // its eager data, or a write after its clear-to-send, may be on the way
}

void Connection::tellReceiveFailed(uint64_t seq, ErrorCode code) {
  noteReceiveFailedTold(seq);
  tellFailure(MsgType::kReceiveFailed, seq, code, "that receive #" + std::to_string(seq) + " failed");
}

void Connection::abandonFailedRecvs() {
  std::vector<std::pair<uint64_t, ErrorCode>> failed;
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    const ErrorCode code = it->second.t->failureCode();
    if (code == ErrorCode::kOk) {
      ++it;
      continue;
    }
    failed.emplace_back(it->second.seq, code);
    it = recvs_.erase(it);
  }
  std::sort(failed.begin(), failed.end());  // the sender hears of them in order
  for (const auto& f : failed) abandonRecv(f.first, f.second);
}

bool Connection::arrivedForFailedRecv(uint64_t seq) {
  if (failedRecvs_.empty()) return false;
  bool failed = false;
  // Sends arrive in the order of their numbers: those of failed receives before this one will never come.
  for (auto it = failedRecvs_.begin(); it != failedRecvs_.end();) {
    failed |= it->second == seq;
    it = it->second <= seq ? failedRecvs_.erase(it) : std::next(it);
  }
  return failed;
}

void Connection::flushCredits() {
  if (creditsFreed_ == 0) return;
  ControlMsg credit;
  credit.type = MsgType::kCredit;
  credit.credits = takeCredits();
  postControl(credit);
}

void Connection::onRequestToSend(const ControlMsg& m) {
  const uint32_t key = static_cast<uint32_t>(m.id) & kSeqMask;
  auto it = recvs_.find(key);
  if (it == recvs_.end()) {
    if (failedRecvs_.count(key)) return;  // its receive failed, and the sender was told
    rts_[key] = m.bytes;                  // the receive is not posted yet: it checks when it is
    return;
  }
  if (it->second.bytes > kEagerBytes) {  // a large receive sent its clear-to-send; the sender compares sizes
    it->second.sent = m.bytes;           // the size the receive reports once the data is in place
    return;
  }
  PendingRecv r = it->second;
  recvs_.erase(it);
  refuseSend(r, m.bytes);
}

void Connection::offerEagerBuffer() {
  std::vector<ControlMsg> key;
  keys_.offerEagerBuffer(key);
  postControls(key);
}

uint32_t Connection::takeCredits() {
  const uint32_t n = creditsFreed_;
  creditsFreed_ = 0;
  return n;
}

void Connection::takeEager(const PendingRecv& r, uint32_t slot, uint64_t bytes) {
  if (bytes > r.bytes) {
    refuseSend(r, bytes);
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
      tellReceiveFailed(r.seq, r.t->failureCode());
      abandonFailedRecvs();
    }
  }
  freeEagerSlot();
}

void Connection::freeEagerSlot() {
  // The freed slot is this side's confirmation that the send arrived whole: it goes back with the next eager write
  // to the peer (a reply), with the next receive posted, or on its own once it is kCreditDelayNs old.
  if (creditsFreed_++ == 0) creditsOwedSinceNs_ = nowNs();
  if (creditsFreed_ >= kCreditBatch) flushCredits();
}

void Connection::onEagerData(uint32_t imm, uint64_t bytes) {
  onCredits((imm >> kEagerCreditShift) & kEagerCreditMask);
  // Sends arrive in the order of their numbers: the full number is the next one at or after the last arrival's
  // successor with these low bits (sends refused before they left leave gaps, never 2^16 of them).
  const uint64_t seq = nextArrival_ + ((static_cast<uint64_t>(imm & kEagerSeqBits) - nextArrival_) & kEagerSeqBits);
  nextArrival_ = seq + 1;
  windows_.revokeReceivesBefore(nextArrival_);
  const uint32_t key = static_cast<uint32_t>(seq) & kSeqMask;
  const uint32_t slot = static_cast<uint32_t>(eagerArrived_++ % kEagerSlots);
  if (bytes == 0 || bytes > kEagerBytes || early_.size() >= kEagerSlots || !windows_.eagerBufferMade())
    return failAll(ErrorCode::kProtocol, "eager data of " + std::to_string(bytes) + " bytes for send #" +
                                             std::to_string(key) + " does not fit the eager buffer (" +
                                             std::to_string(early_.size()) + " of " + std::to_string(kEagerSlots) +
                                             " slots held): the peer ignored its credits");
  if (arrivedForFailedRecv(seq)) return freeEagerSlot();  // its receive failed: dropped (the sender was told)
  auto it = recvs_.find(key);
  if (it == recvs_.end()) {
    early_[key] = EarlyData{slot, bytes};  // held until the receive is posted
    return;
  }
  PendingRecv r = it->second;
  recvs_.erase(it);
  takeEager(r, slot, bytes);
}

}  // namespace gdx::p2p
