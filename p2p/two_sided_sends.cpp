// TwoSided, the sender's side (two_sided.hpp). Sends are numbered in the order they are posted and leave in that
// order, the n-th into the peer's n-th receive: a large one once that receive's clear-to-send said where it lands, a
// small one at once into the next slot of the peer's eager buffer while credits last. A send fails by name wherever
// it is when the peer says its receive failed or was too small.
#include <algorithm>

#include "gdx/error.hpp"
#include "p2p/two_sided.hpp"

namespace gdx::p2p {

void TwoSided::send(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces, Actions& out) {
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
      post(out, rts);
    }
  }
  t->setWaiting("a matching receive posted by the peer");
  trySends(out);
}

void TwoSided::trySends(Actions& out) {
  moreToSend_ = false;
  while (!sends_.empty()) {
    PendingSend& s = sends_.front();
    auto it = cts_.find(s.seq);
    const bool eager = s.piece.size <= kEagerBytes;
    if (it == cts_.end() && !eager) return;  // waits for its receive's clear-to-send
    if (s.t->finished()) {  // failed on this side (another buffer of its vector): no receive may take it
      if (it != cts_.end()) cts_.erase(it);
      withdrawSend(s.seq, s.t->failureCode(), out);
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
      post(out, no);
      s.t->fail(ErrorCode::kInvalidArgument, which() + bufferTooSmall(it->second.bytes) + " (nothing was sent)");
      cts_.erase(it);
      sends_.pop_front();
      continue;
    }
    if (eager) {  // a clear-to-send for it names a larger receive, which takes it from the eager buffer all the same
      if (!postEager(s, out)) return;  // no credit or no key yet: later sends wait behind it
      cts_.erase(s.seq);
      sends_.pop_front();
      moreToSend_ = true;  // its write is posted before the next send takes a slot
      return;
    }
    const ControlMsg cts = it->second;
    cts_.erase(it);
    const std::string what = which();
    PendingSend send = s;
    sends_.pop_front();
    if (!keys_.known(cts.window)) {
      const Error e(ErrorCode::kProtocol, what + ": the peer's clear-to-send names window " +
                                              std::to_string(cts.window) + ", whose key never arrived");
      send.t->fail(e.code(), e.what());
      withdrawSend(send.seq, e.code(), out);
      continue;
    }
    Action w = write(send.t, send.seq, send.piece, cts.window, cts.offset, static_cast<uint32_t>(send.seq) & kSeqMask);
    writes_[w.write.cookie] = PostedSend{send.t, send.seq, false};
    send.t->setWaiting("the transport's completion of " + what);
    out.push_back(std::move(w));
    moreToSend_ = true;
    return;
  }
}

bool TwoSided::postEager(const PendingSend& s, Actions& out) {
  if (!keys_.known(kEagerWindow)) {
    // The peer sends its buffer's key before its first small receive's clear-to-send; ask when the send came first.
    const std::string waiting = "the key of the peer's eager buffer";
    if (!eagerKeyAsked_) {
      eagerKeyAsked_ = true;
      Action await;
      await.kind = Action::Kind::kAwaitKey;
      await.t = s.t;
      await.why = waiting;
      out.push_back(std::move(await));
    }
    s.t->setWaiting(waiting);
    return false;
  }
  if (eagerCredits_ == 0) {
    s.t->setWaiting("room in the peer's eager buffer (all " + std::to_string(kEagerSlots) +
                    " slots hold data its receives have not taken yet)");
    return false;
  }
  const uint32_t credits = takeCredits();  // ride along: the peer's sends this side took since the last report
  Action w = write(s.t, s.seq, s.piece, kEagerWindow, (eagerSent_ % kEagerSlots) * kEagerBytes,
                   kEagerImm | (credits << kEagerCreditShift) | (static_cast<uint32_t>(s.seq) & kEagerSeqBits));
  // Counted as posted; notPosted() takes it back if the post throws.
  --eagerCredits_;
  ++eagerSent_;
  // Done once the write completed and the peer's receive took it (its credit came back).
  eagerSends_[s.seq] = EagerSend{s.t, s.piece.size};
  eagerOrder_.push_back(s.seq);
  eagerCookies_[w.write.cookie] = s.seq;
  s.t->setWaiting("the peer's receive to take it (the send left eagerly; its credit confirms it)");
  out.push_back(std::move(w));
  return true;
}

void TwoSided::notPosted(const Action& w, const Error& e, bool registered, Actions& out) {
  auto eager = eagerCookies_.find(w.write.cookie);
  if (eager != eagerCookies_.end()) {  // the last write returned (trySends() stops after each): its slot is unused
    eagerCookies_.erase(eager);
    eagerSends_.erase(w.seq);
    eagerOrder_.pop_back();
    ++eagerCredits_;
    --eagerSent_;
    creditsFreed_ += (w.write.imm >> kEagerCreditShift) & kEagerCreditMask;  // not sent: still owed
  } else if (!registered) {
    writes_.erase(w.write.cookie);  // its source was refused before the transport saw it
  } else if (auto posted = writes_.find(w.write.cookie); posted != writes_.end()) {
    posted->second.withdrawn = true;  // withdrawn just below
  }
  w.t->fail(e.code(), e.what());
  withdrawSend(w.seq, e.code(), out);
}

void TwoSided::onWriteDone(const Completion& c, const std::string& failure) {
  auto eager = eagerCookies_.find(c.cookie);
  if (eager != eagerCookies_.end()) {
    auto it = eagerSends_.find(eager->second);
    eagerCookies_.erase(eager);
    if (it == eagerSends_.end()) return;  // failed already (its clear-to-send named another size)
    if (c.status != Status::kOk) {
      it->second.t->fail(errorCodeFor(c.status), std::string("the transport failed the eager write: ") +
                                                     statusName(c.status) + " (" + failure + ")");
    } else {
      it->second.written = true;
      if (!it->second.matched) return;
      it->second.t->finishPart();
    }
    eagerSends_.erase(it);
    return;
  }
  auto it = writes_.find(c.cookie);
  if (it == writes_.end()) return;
  if (c.status == Status::kOk)
    it->second.t->finishPart();
  else
    it->second.t->fail(errorCodeFor(c.status),
                       std::string("the transport failed the write: ") + statusName(c.status) + " (" + failure + ")");
  writes_.erase(it);
}

void TwoSided::onClearToSend(const ControlMsg& m, Actions& out) {
  onCredits(m.credits, out);
  if (m.type == MsgType::kClearToSend) {
    if (eagerSends_.count(m.id))
      matchEager(m);
    else if (m.id >= nextSendSeq_ || (!sends_.empty() && m.id >= sends_.front().seq))
      cts_[m.id] = m;  // else its send is gone (withdrawn, or failed by the peer's notice): nothing waits for it
  }
  trySends(out);
}

void TwoSided::matchEager(const ControlMsg& cts) {
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

void TwoSided::onCredits(uint32_t n, Actions& out) {
  if (n == 0) return;
  if (n > kEagerSlots - eagerCredits_)
    return fail(out, ErrorCode::kProtocol,
                "the peer returned " + std::to_string(n) + " eager credits; only " +
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

bool TwoSided::failUnsentSend(uint64_t seq, ErrorCode code, const std::string& why, Actions& out) {
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
  if (head) trySends(out);
  return true;
}

void TwoSided::onReceiveFailed(const ControlMsg& m, Actions& out) {
  if (failUnsentSend(m.id, ErrorCode::kPeerFailed, receiveFailed(m.code), out)) return;
  for (auto it = writes_.begin(); it != writes_.end(); ++it) {
    if (it->second.seq != m.id) continue;
    // Its write left before this notice came: it may land in the peer's buffer all the same.
    it->second.t->fail(ErrorCode::kPeerFailed,
                       "send #" + std::to_string(m.id) + receiveFailed(m.code) +
                           ", but this send's data was on its way already and may have been written into its buffer");
    writes_.erase(it);
    return;
  }
  if (m.id < nextSendSeq_) return;  // done already, or failed on this side
  failedAhead_[m.id] = m.code;      // not posted yet: it fails when it is
  cts_.erase(m.id);                 // a clear-to-send the receive sent before it failed
}

}  // namespace gdx::p2p
