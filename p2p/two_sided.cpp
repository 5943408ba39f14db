// TwoSided (two_sided.hpp): what the peer's two-sided messages do, the actions the connection carries out, and what
// a failure leaves. The sender's side is in two_sided_sends.cpp, the receiver's in two_sided_receives.cpp, withdrawn
// sends in send_withdrawal.cpp.
#include "p2p/two_sided.hpp"

namespace gdx::p2p {

TwoSided::TwoSided(LocalWindows& windows, WindowKeys& keys, int peer, const std::string& name)
    : windows_(windows), keys_(keys), peer_(peer), name_(name) {}

void TwoSided::post(Actions& out, const ControlMsg& m) {
  out.emplace_back();  // an Action is kPost unless told otherwise
  out.back().msg = m;
}

void TwoSided::tell(Actions& out, MsgType type, uint64_t seq, ErrorCode code, const std::string& what) {
  Action a;
  a.kind = Action::Kind::kTell;
  a.msg.type = type;
  a.msg.id = seq;
  a.msg.code = code == ErrorCode::kOk ? ErrorCode::kInternal : code;
  a.why = what;
  out.push_back(std::move(a));
}

void TwoSided::fail(Actions& out, ErrorCode code, const std::string& why) {
  clear();
  Action a;
  a.kind = Action::Kind::kFail;
  a.code = code;
  a.why = why;
  out.push_back(std::move(a));
}

TwoSided::Action TwoSided::write(const std::shared_ptr<Transfer>& t, uint64_t seq, const Piece& piece, uint32_t window,
                                 uint64_t offset, uint32_t imm) {
  Action a;
  a.kind = Action::Kind::kWrite;
  a.t = t;
  a.seq = seq;
  a.region = piece.region;
  a.write.peer = peer_;
  a.write.localWindow = piece.region.window;
  a.write.localOffset = piece.offset;
  a.write.remoteWindow = window;
  a.write.remoteOffset = offset;
  a.write.bytes = piece.size;
  a.write.withImm = true;
  a.write.imm = imm;
  a.write.cookie = nextCookie_++;
  return a;
}

void TwoSided::onMessage(const ControlMsg& m, Actions& out) {
  switch (m.type) {
    case MsgType::kClearToSend:
    case MsgType::kCredit: return onClearToSend(m, out);
    case MsgType::kRequestToSend: return onRequestToSend(m, out);
    case MsgType::kReceiveRefused:
      failUnsentSend(m.id, ErrorCode::kInvalidArgument, bufferTooSmall(m.bytes), out);
      return;
    case MsgType::kReceiveFailed: return onReceiveFailed(m, out);
    case MsgType::kSendWithdrawn: return onSendWithdrawn(m, out);
    case MsgType::kWithdrawTooLate: return onWithdrawTooLate(m, out);
    case MsgType::kSendRefused: return onSendRefused(m, out);
    default: return;  // not two-sided: the connection routes those elsewhere
  }
}

void TwoSided::abandonFailed(Actions& out) {
  abandonFailedRecvs(out);   // receives among them take nothing that still comes
  withdrawFailedSends(out);  // and no receive of the peer takes the sends among them
}

void TwoSided::clear() {
  sends_.clear();
  recvs_.clear();
  writes_.clear();
  eagerSends_.clear();
  eagerOrder_.clear();
  eagerCookies_.clear();
  early_.clear();
  rts_.clear();
  failedRecvs_.clear();
  failedAhead_.clear();
  moreToSend_ = false;
}

}  // namespace gdx::p2p
