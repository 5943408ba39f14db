// Connection, sends and receives (connection.hpp): TwoSided decides, the connection carries out what it returns, in
// order: messages to the peer, the writes of sends, the wait for the key of the peer's eager buffer, its own failure.
#include "base/log.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"

namespace gdx::p2p {

void Connection::runSend(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces) {
  track(t);
  decide<TwoSided>([&](TwoSided::Actions& out) { twoSided_.send(t, pieces, out); });
}

void Connection::runRecv(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& pieces) {
  track(t);
  decide<TwoSided>([&](TwoSided::Actions& out) { twoSided_.recv(t, pieces, out); });
}

void Connection::carryOut(TwoSided::Actions& actions) {
  for (;;) {
    for (const TwoSided::Action& a : actions) carryOut(a);
    // A write ends what trySends() returns, so that it is posted (or taken back) before the next send is looked at.
    if (!twoSided_.moreToSend()) return;
    actions.clear();
    twoSided_.trySends(actions);
  }
}

void Connection::carryOut(const TwoSided::Action& a) {
  using Kind = TwoSided::Action::Kind;
  switch (a.kind) {
    case Kind::kPost: return postControl(a.msg);
    case Kind::kTell: try { postControl(a.msg);
      } catch (const Error& e) {  // on failure paths: a transport that cannot carry it fails the peer anyway
        if (a.why.empty())
          GDX_WARN(name_ << ": " << e.what());
        else
          GDX_WARN(name_ << ": telling the peer " << a.why << ": " << e.what());
      }
      return;
    case Kind::kWrite: return postSendWrite(a);
    case Kind::kAwaitKey:
      whenKnown(kEagerWindow, a.t, [this] { trySends(); });
      a.t->setWaiting(a.why);
      return;
    case Kind::kFail: return failAll(a.code, a.why);
  }
}

void Connection::postSendWrite(const TwoSided::Action& a) {
  TwoSided::Actions after;
  try {
    windows_.registerRegion(a.region, nullptr, true);
  } catch (const Error& e) {
    twoSided_.notPosted(a, e, false, after);
    return carryOut(after);
  }
  try {
    postReading(a.write);
  } catch (const Error& e) {
    twoSided_.notPosted(a, e, true, after);
    carryOut(after);
  }
}

void Connection::trySends() {
  decide<TwoSided>([this](TwoSided::Actions& out) { twoSided_.trySends(out); });
}

void Connection::flushCredits() {
  decide<TwoSided>([this](TwoSided::Actions& out) { twoSided_.flushCredits(out); });
}

}  // namespace gdx::p2p
