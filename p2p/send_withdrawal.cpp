// Sends that failed on the sender's side (their deadline passed, their memory was deregistered, a buffer of the same
// vector failed) after they got their number: the peer is told (kSendWithdrawn), so that no receive takes them and
// the receives posted after them pair with the sends posted after them. A receive already posted for one fails by
// name and takes nothing; one not posted yet skips its number. Eager data of one that already reached a receive
// cannot be taken back: then the two sides no longer agree on what was delivered, and the connection fails on both
// sides (kWithdrawTooLate) with an error saying so.
#include <algorithm>

#include "gdx/error.hpp"
#include "p2p/two_sided.hpp"

namespace gdx::p2p {
namespace {

/// Receive numbers the sender was told failed, kept for a withdrawal that crosses the notice.
constexpr size_t kToldFailedKept = 4096;

std::string withdrawnWhy(uint64_t seq, ErrorCode code) {
  return "the peer's send #" + std::to_string(seq) + " failed on the peer's side (" + errorCodeName(code) +
         ") and was withdrawn";
}

}  // namespace

void TwoSided::withdrawFailedSends(Actions& out) {
  std::vector<std::pair<uint64_t, ErrorCode>> gone;
  bool head = false;
  for (auto it = sends_.begin(); it != sends_.end();) {
    const ErrorCode code = it->t->failureCode();
    if (code == ErrorCode::kOk) {
      ++it;
      continue;
    }
    head |= it == sends_.begin();
    gone.emplace_back(it->seq, code);
    cts_.erase(it->seq);
    it = sends_.erase(it);
  }
  takeFailed(
      eagerSends_, [](const auto& e) { return e.first; }, gone);  // left; their slots' credits still come
  // Written already: the data may have landed. One whose post the transport refused was withdrawn then (notPosted()).
  for (auto it = writes_.begin(); it != writes_.end();) {
    const ErrorCode code = it->second.t->failureCode();
    if (code == ErrorCode::kOk) {
      ++it;
      continue;
    }
    if (!it->second.withdrawn) gone.emplace_back(it->second.seq, code);
    it = writes_.erase(it);
  }
  std::sort(gone.begin(), gone.end());
  for (const auto& g : gone) withdrawSend(g.first, g.second, out);
  if (head) trySends(out);
}

void TwoSided::withdrawSend(uint64_t seq, ErrorCode code, Actions& out) {
  tell(out, MsgType::kSendWithdrawn, seq, code, "that send #" + std::to_string(seq) + " was withdrawn");
}

void TwoSided::noteReceiveFailedTold(uint64_t seq) {
  toldFailed_.insert(seq);
  if (toldFailed_.size() > kToldFailedKept) toldFailed_.erase(toldFailed_.begin());
}

uint64_t TwoSided::takeRecvSeq() {
  while (!voided_.empty() && *voided_.begin() <= nextRecvSeq_) {
    if (*voided_.begin() == nextRecvSeq_) ++nextRecvSeq_;
    voided_.erase(voided_.begin());
  }
  return nextRecvSeq_++;
}

void TwoSided::onSendWithdrawn(const ControlMsg& m, Actions& out) {
  const uint64_t seq = m.id;
  const uint32_t key = static_cast<uint32_t>(seq) & kSeqMask;
  auto early = early_.find(key);
  if (early != early_.end()) {  // its eager data waits for a receive not posted yet: dropped, and the number skipped
    early_.erase(early);
    freeEagerSlot(out);
    voided_.insert(seq);
    return;
  }
  if (rts_.erase(key)) {  // a large send announced before its receive was posted
    voided_.insert(seq);
    return;
  }
  auto posted = recvs_.find(key);
  if (posted != recvs_.end()) {  // posted, and nothing arrived for it: it fails, and takes nothing
    PendingRecv r = posted->second;
    recvs_.erase(posted);
    r.t->fail(ErrorCode::kPeerFailed,
              "receive #" + std::to_string(r.seq) + ": " + withdrawnWhy(seq, m.code) + " (nothing was written)");
    abandonFailedRecvs(out);  // the receive's other buffers
    return;
  }
  if (failedRecvs_.erase(key) || toldFailed_.erase(seq)) return;  // its receive failed too: both sides agree
  if (seq >= nextRecvSeq_) {  // neither its receive nor its data is here: the receive posted next skips it
    voided_.insert(seq);
    return;
  }
  // Its receive took the data before the withdrawal came: the peer's caller was told the send failed, this side's
  // that its receive succeeded. Going on would deliver the caller's retry as a second copy.
  ControlMsg late;
  late.type = MsgType::kWithdrawTooLate;
  late.id = seq;
  late.code = m.code;
  Action tellLate;
  tellLate.kind = Action::Kind::kTell;  // best effort: the connection fails here either way
  tellLate.msg = late;
  out.push_back(std::move(tellLate));
  fail(out, ErrorCode::kProtocol,
       withdrawnWhy(seq, m.code) + " after this side's receive #" + std::to_string(seq) +
           " had taken its data: the two sides no longer agree on what was delivered, so the connection is closed");
}

void TwoSided::onWithdrawTooLate(const ControlMsg& m, Actions& out) {
  fail(out, ErrorCode::kProtocol,
       "send #" + std::to_string(m.id) + ", reported failed on this side (" + errorCodeName(m.code) +
           "), had been taken by the peer's receive before the withdrawal reached it: the two sides no longer "
           "agree on what was delivered, so the connection is closed");
}

}  // namespace gdx::p2p
