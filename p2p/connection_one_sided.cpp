// Connection, one-sided writes and reads (connection.hpp): OneSided decides, the connection carries out what it
// returns, in order: messages to the peer, the writes of this side's writes and of its answers to the peer's reads,
// the wait for the peer's key of a window (WindowKeys: asked for with kKeyRequest, answered in parts, kKeyPart).
#include "base/log.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"

namespace gdx::p2p {

uint32_t Connection::advertise(const MemoryRegion& region, uint64_t offset, uint64_t size) {
  return windows_.advertise(region, offset, size);
}

void Connection::forget(uint32_t window) {
  std::vector<uint32_t> gone{window};
  forgetWindows(gone);
  waitForReaders(gone);
}

void Connection::forgetWindows(std::vector<uint32_t>& gone) {
  windows_.forget(gone);
}

size_t Connection::grantsOpen() const {
  return windows_.grantsOpen();
}

void Connection::whenKnown(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op,
                           uint64_t secret) {
  if (keys_.known(window)) return op();
  if (!keys_.asked(window)) postControl(WindowKeys::request(window, secret));
  keys_.await(window, t, std::move(op));
}

void Connection::write(std::shared_ptr<Transfer> t, std::vector<Piece> src, std::vector<RemotePiece> dst, bool notify) {
  auto w = std::make_shared<OneSided::PendingWrite>(
      OneSided::PendingWrite{std::move(t), std::move(src), std::move(dst), notify});
  queue([this, w] {
    track(w->t);
    decide<OneSided>([&](OneSided::Actions& out) { oneSided_.write(w, out); });
  });
}

void Connection::read(std::shared_ptr<Transfer> t, std::vector<Piece> dst, std::vector<RemotePiece> src) {
  queue([this, t, dst = std::move(dst), src = std::move(src)] {
    track(t);
    decide<OneSided>([&](OneSided::Actions& out) { oneSided_.read(t, dst, src, out); });
  });
}

void Connection::carryOut(OneSided::Actions& actions) {
  using Kind = OneSided::Action::Kind;
  for (const OneSided::Action& a : actions) {
    switch (a.kind) {
      case Kind::kPost: postControl(a.msg); break;
      case Kind::kAwaitKey: {
        // The waiter is all that holds the write until its key comes, so that it is let go once posted or failed.
        std::shared_ptr<OneSided::PendingWrite> w = a.pending;
        whenKnown(
            a.window, a.t, [this, w] { decide<OneSided>([&](OneSided::Actions& out) { oneSided_.write(w, out); }); },
            a.secret);
        break;
      }
      case Kind::kWrite: {
        OneSided::Actions instead;
        if (postOneSidedWrite(a, instead)) break;
        return carryOut(instead);  // what its call returned after it is not done
      }
    }
  }
}

bool Connection::postOneSidedWrite(const OneSided::Action& a, OneSided::Actions& instead) {
  try {
    windows_.registerRegion(a.region, nullptr, true);
  } catch (const Error& e) {
    oneSided_.notPosted(a, e, false, instead);
    return false;
  }
  try {
    postReading(a.write);
  } catch (const Error& e) {
    oneSided_.notPosted(a, e, true, instead);
    return false;
  }
  return true;
}

void Connection::onKeyPart(const ControlMsg& m) {
  std::vector<std::function<void()>> ready;
  const std::string bad = keys_.onKeyPart(m, ready);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, bad);
  for (auto& op : ready) op();
}

}  // namespace gdx::p2p
