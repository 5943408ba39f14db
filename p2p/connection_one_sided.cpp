// Connection, one-sided writes and reads (connection.hpp): a write waits for the peer's key of each destination
// window (WindowKeys: asked for with kKeyRequest, answered in parts, kKeyPart) and completes once a fence after it is
// acknowledged; a read grants exactly its destination range and asks the peer to write the source there
// (kReadRequest), which the peer's connection answers here too (onReadRequest).
#include "gdx/detail/log.hpp"
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

uint32_t Connection::grant(const Piece& p, LocalWindows::GrantFor what, uint64_t id) {
  std::vector<ControlMsg> key;
  const uint32_t w = keys_.grant(p, what, id, key);
  postControls(key);
  return w;
}

void Connection::whenKnown(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op,
                           uint64_t secret) {
  if (keys_.known(window)) return op();
  if (!keys_.asked(window)) postControl(WindowKeys::request(window, secret));
  keys_.await(window, t, std::move(op));
}

void Connection::write(std::shared_ptr<Transfer> t, std::vector<Piece> src, std::vector<RemotePiece> dst, bool notify) {
  auto w = std::make_shared<PendingWrite>(PendingWrite{std::move(t), std::move(src), std::move(dst), notify});
  queue([this, w] {
    track(w->t);
    postWrite(w);
  });
}

void Connection::postWrite(const std::shared_ptr<PendingWrite>& w) {
  // Posted once every destination window is known; until then the waiter for the first unknown key is all that
  // holds it, so that it is let go once posted or failed (a retry that held itself kept every write alive).
  for (const RemotePiece& d : w->dst)
    if (!keys_.known(d.window))
      return whenKnown(
          d.window, w->t, [this, w] { postWrite(w); }, d.secret);
  const std::shared_ptr<Transfer>& t = w->t;
  if (t->finished()) return;
  try {
    for (size_t i = 0; i < w->src.size(); ++i) {
      const Piece& src = w->src[i];
      const RemotePiece& dst = w->dst[i];
      keys_.checkFits(dst);
      windows_.registerRegion(src.region, nullptr, true);
      WriteOp op;
      op.peer = link_.peer();
      op.localWindow = src.region.window;
      op.localOffset = src.offset;
      op.remoteWindow = dst.window;
      op.remoteOffset = dst.offset;
      op.bytes = src.size;
      op.withImm = w->notify && i + 1 == w->src.size();
      op.imm = kNotifyImm;
      op.cookie = nextId_++;
      cookies_[op.cookie] = t;
      postReading(op);
    }
    ControlMsg fence;
    fence.type = MsgType::kFence;
    fence.id = nextId_++;
    fences_[fence.id] = t;
    t->setWaiting("the peer's acknowledgement that the data is in place (fence " + std::to_string(fence.id) + ")");
    postControl(fence);
  } catch (const Error& e) {
    t->fail(e.code(), e.what());
  }
}

void Connection::read(std::shared_ptr<Transfer> t, std::vector<Piece> dst, std::vector<RemotePiece> src) {
  queue([this, t, dst = std::move(dst), src = std::move(src)] {
    track(t);
    t->setWaiting("the peer's answer to the read");
    try {
      for (size_t i = 0; i < dst.size(); ++i) {
        ControlMsg req;
        req.type = MsgType::kReadRequest;
        req.id = nextId_++;
        req.window = src[i].window;
        req.offset = src[i].offset;
        req.bytes = src[i].size;
        req.dstWindow =
            grant(dst[i], LocalWindows::GrantFor::kRead, req.id);  // exactly the range read, until kReadDone
        req.dstOffset = 0;
        reads_[req.id] = t;
        postControl(req);
      }
    } catch (const Error& e) {
      t->fail(e.code(), e.what());
    }
  });
}

void Connection::onKeyPart(const ControlMsg& m) {
  std::vector<std::function<void()>> ready;
  const std::string bad = keys_.onKeyPart(m, ready);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, bad);
  for (auto& op : ready) op();
}

void Connection::onReadRequest(const ControlMsg& m) {
  ControlMsg done;
  done.type = MsgType::kReadDone;
  done.id = m.id;
  MemoryRegion src;
  // The eager buffer is written by the peer's small sends, never read: only advertised (or resolved) windows are.
  if (m.window == kEagerWindow || !windows_.resolve(m.window, &src)) {
    done.status = ReadStatus::kUnknownWindow;
  } else if (m.offset > src.bytes || m.bytes > src.bytes - m.offset || m.bytes == 0) {
    done.status = ReadStatus::kOutOfRange;
  } else {
    try {
      windows_.registerRegion(src, nullptr, true);
      WriteOp op;
      op.peer = link_.peer();
      op.localWindow = src.window;
      op.localOffset = m.offset;
      op.remoteWindow = m.dstWindow;
      op.remoteOffset = m.dstOffset;
      op.bytes = m.bytes;
      op.cookie = nextId_++;
      postReading(op);  // the kReadDone below is delivered only after this data is in place
    } catch (const Error& e) {
      GDX_WARN(name_ << ": read request " << m.id << " of window " << m.window << ": " << e.what());
      done.status = ReadStatus::kFailed;
    }
  }
  postControl(done);
}

}  // namespace gdx::p2p
