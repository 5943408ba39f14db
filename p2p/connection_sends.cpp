// Connection, the sender's side of sends and receives (connection.hpp). Sends are numbered in the order they are
// posted and leave in that order, the n-th into the peer's n-th receive: a large one once that receive's
// clear-to-send said where it lands, a small one at once into the next slot of the peer's eager buffer while credits
// last. A send fails by name wherever it is when the peer says its receive failed or was too small.
#include <algorithm>

#include "gdx/error.hpp"
#include "p2p/connection.hpp"
#include "p2p/two_sided.hpp"

namespace gdx::p2p {

void Connection::runSend(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces) {
  track(t);
  for (const Piece& p : pieces) {
    const uint64_t seq = nextSendSeq_++;
    if (!failedAhead_.empty()) {
      auto failed = failedAhead_.find(seq);
      if (failed != failedAhead_.end()) {  // the peer's receive for it failed before it was posted
        t->fail(ErrorCode::kPeerFailed, "send #" + std::to_string(seq) + " of " + std::to_string(p.size) + " bytes" +
                                            receiveFailed(failed->second) + " (nothing was sent)");
        failedAhead_.erase(failed);
        continue;
      }
    }
    sends_.push_back(PendingSend{seq, t, p});
    if (p.size > kEagerBytes) {
      // Its receive tells where it goes (clear-to-send) if it is as large; a small receive, which sends nothing,
      // learns from this that the sizes differ.
      ControlMsg rts;
      rts.type = MsgType::kRequestToSend;
      rts.id = seq;
      rts.bytes = p.size;
      postControl(rts);
    }
  }
  t->setWaiting("a matching receive posted by the peer");
  trySends();
}

void Connection::trySends() {
  while (!sends_.empty()) {
    PendingSend& s = sends_.front();
    auto it = cts_.find(s.seq);
    const bool eager = s.piece.size <= kEagerBytes;
    if (it == cts_.end() && !eager) return;  // waits for its receive's clear-to-send
    if (s.t->finished()) {  // failed on this side (another buffer of its vector): no receive may take it
      if (it != cts_.end()) cts_.erase(it);
      withdrawSend(s.seq, s.t->failureCode());
      sends_.pop_front();
      continue;
    }
    // Built only off the eager path: a small send's hot path makes no strings.
    auto which = [&s] { return "send #" + std::to_string(s.seq) + " of " + std::to_string(s.piece.size) + " bytes"; };
    if (it != cts_.end() && s.piece.size > it->second.bytes) {
      ControlMsg no;
      no.type = MsgType::kSendRefused;
      no.id = s.seq;
      no.bytes = s.piece.size;
      postControl(no);
      s.t->fail(ErrorCode::kInvalidArgument, which() + bufferTooSmall(it->second.bytes) + " (nothing was sent)");
      cts_.erase(it);
      sends_.pop_front();
      continue;
    }
    if (eager) {  // a clear-to-send for it names a larger receive, which takes it from the eager buffer all the same
      if (!postEager(s.t, s.seq, s.piece)) return;  // no credit or no key yet: later sends wait behind it
      cts_.erase(s.seq);
      sends_.pop_front();
      continue;
    }
    const ControlMsg cts = it->second;
    cts_.erase(it);
    const std::string what = which();
    PendingSend send = s;
    sends_.pop_front();
    try {
      if (!keys_.known(cts.window))
        throw Error(ErrorCode::kProtocol, what + ": the peer's clear-to-send names window " +
                                              std::to_string(cts.window) + ", whose key never arrived");
      windows_.registerRegion(send.piece.region, nullptr, true);
      WriteOp op;
      op.peer = link_.peer();
      op.localWindow = send.piece.region.window;
      op.localOffset = send.piece.offset;
      op.remoteWindow = cts.window;
      op.remoteOffset = cts.offset;
      op.bytes = send.piece.size;
      op.withImm = true;
      op.imm = static_cast<uint32_t>(send.seq) & kSeqMask;
      op.cookie = nextId_++;
      cookies_[op.cookie] = PostedWrite{send.t, send.seq};
      send.t->setWaiting("the transport's completion of " + what);
      postReading(op);
    } catch (const Error& e) {
      send.t->fail(e.code(), e.what());
      withdrawSend(send.seq, e.code());
    }
  }
}

bool Connection::postEager(const std::shared_ptr<Transfer>& t, uint64_t seq, const Piece& piece) {
  if (!keys_.known(kEagerWindow)) {
    // The peer sends its buffer's key before its first small receive's clear-to-send; ask when the send came first.
    if (!eagerKeyAsked_) {
      eagerKeyAsked_ = true;
      whenKnown(kEagerWindow, t, [this] { trySends(); });
    }
    t->setWaiting("the key of the peer's eager buffer");
    return false;
  }
  if (eagerCredits_ == 0) {
    t->setWaiting("room in the peer's eager buffer (all " + std::to_string(kEagerSlots) +
                  " slots hold data its receives have not taken yet)");
    return false;
  }
  const uint32_t credits = takeCredits();  // ride along: the peer's sends this side took since the last report
  try {
    windows_.registerRegion(piece.region, nullptr, true);
    WriteOp op;
    op.peer = link_.peer();
    op.localWindow = piece.region.window;
    op.localOffset = piece.offset;
    op.remoteWindow = kEagerWindow;
    op.remoteOffset = (eagerSent_ % kEagerSlots) * kEagerBytes;
    op.bytes = piece.size;
    op.withImm = true;
    op.imm = kEagerImm | (credits << kEagerCreditShift) | (static_cast<uint32_t>(seq) & kEagerSeqBits);
    op.cookie = nextId_++;
    postReading(op);
    --eagerCredits_;
    ++eagerSent_;
    // Done once the write completed and the peer's receive took it (its credit came back).
    eagerSends_[seq] = EagerSend{t, piece.size};
    eagerOrder_.push_back(seq);
    eagerCookies_[op.cookie] = seq;
    t->setWaiting("the peer's receive to take it (the send left eagerly; its credit confirms it)");
  } catch (const Error& e) {
    creditsFreed_ += credits;  // not sent: still owed
    t->fail(e.code(), e.what());
    withdrawSend(seq, e.code());
  }
  return true;
}

void Connection::matchEager(const ControlMsg& cts) {
  auto it = eagerSends_.find(cts.id);
  if (it == eagerSends_.end()) return;
  EagerSend& e = it->second;
  // The receive is at least as large (more than kEagerBytes): it takes the data from the eager buffer, and the slot's
  // credit confirms the send as for any other eager send (a clear-to-send says only that the receive is posted).
  if (e.bytes <= cts.bytes) return;
  e.t->fail(ErrorCode::kInvalidArgument, "send #" + std::to_string(cts.id) + " of " + std::to_string(e.bytes) +
                                             " bytes" + bufferTooSmall(cts.bytes) + " (the peer dropped the data)");
  eagerSends_.erase(it);
}

void Connection::onCredits(uint32_t n) {
  if (n == 0) return;
  if (n > kEagerSlots - eagerCredits_)
    return failAll(ErrorCode::kProtocol, "the peer returned " + std::to_string(n) + " eager credits; only " +
                                             std::to_string(kEagerSlots - eagerCredits_) + " were out");
  eagerCredits_ += n;
  // The peer takes eager data in the order it was sent, so these credits confirm the oldest eager sends: their
  // receives took them (a receive that refused one said so before, kReceiveRefused).
  for (uint32_t i = 0; i < n && !eagerOrder_.empty(); ++i) {
    auto it = eagerSends_.find(eagerOrder_.front());
    eagerOrder_.pop_front();
    if (it == eagerSends_.end()) continue;
    it->second.matched = true;
    if (!it->second.written) continue;
    it->second.t->finishPart();
    eagerSends_.erase(it);
  }
}

bool Connection::failUnsentSend(uint64_t seq, ErrorCode code, const std::string& why) {
  auto eager = eagerSends_.find(seq);
  if (eager != eagerSends_.end()) {  // it left eagerly; its slot's credit still comes, and is skipped
    eager->second.t->fail(code, "send #" + std::to_string(seq) + " of " + std::to_string(eager->second.bytes) +
                                    " bytes" + why + " (the peer dropped the data)");
    eagerSends_.erase(eager);
    return true;
  }
  // Waiting for its clear-to-send or for credits: at the head of sends_, or behind sends that wait for credits (a
  // small receive refuses a large send as soon as its announcement arrives, long before it leaves).
  auto waiting = std::find_if(sends_.begin(), sends_.end(), [&](const PendingSend& s) { return s.seq == seq; });
  if (waiting == sends_.end()) return false;
  waiting->t->fail(code, "send #" + std::to_string(seq) + " of " + std::to_string(waiting->piece.size) + " bytes" +
                             why + " (nothing was sent)");
  cts_.erase(seq);
  const bool head = waiting == sends_.begin();
  sends_.erase(waiting);
  if (head) trySends();
  return true;
}

void Connection::onReceiveFailed(const ControlMsg& m) {
  if (failUnsentSend(m.id, ErrorCode::kPeerFailed, receiveFailed(m.code))) return;
  for (auto it = cookies_.begin(); it != cookies_.end(); ++it) {
    if (it->second.sendSeq != m.id) continue;
    // Its write left before this notice came: it may land in the peer's buffer all the same.
    it->second.t->fail(ErrorCode::kPeerFailed,
                       "send #" + std::to_string(m.id) + receiveFailed(m.code) +
                           ", but this send's data was on its way already and may have been written into its buffer");
    cookies_.erase(it);
    return;
  }
  if (m.id < nextSendSeq_) return;  // done already, or failed on this side
  failedAhead_[m.id] = m.code;      // not posted yet: it fails when it is
  cts_.erase(m.id);                 // a clear-to-send the receive sent before it failed
}

}  // namespace gdx::p2p
