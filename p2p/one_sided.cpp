// OneSided (one_sided.hpp): this side's writes and reads against the peer's windows, and the answers to the peer's
// fences and reads.
#include "p2p/one_sided.hpp"

#include "base/log.hpp"

namespace gdx::p2p {
namespace {

const char* readStatusText(ReadStatus s) {
  switch (s) {
    case ReadStatus::kOk: return "ok";
    case ReadStatus::kUnknownWindow:
      return "the window was not advertised on this connection (forged or stale descriptor)";
    case ReadStatus::kOutOfRange: return "the range lies outside the advertised region";
    case ReadStatus::kFailed: return "the peer could not write the data back";
  }
  return "?";
}

}  // namespace

OneSided::OneSided(LocalWindows& windows, WindowKeys& keys, int peer, const std::string& name)
    : windows_(windows), keys_(keys), peer_(peer), name_(name) {}

void OneSided::post(Actions& out, const ControlMsg& m) {
  out.emplace_back();  // an Action is kPost unless told otherwise
  out.back().msg = m;
}

void OneSided::write(const std::shared_ptr<PendingWrite>& w, Actions& out) {
  // Posted once every destination window is known; until then the waiter for the first unknown key is all that
  // holds it, so that it is let go once posted or failed (a retry that held itself kept every write alive).
  for (const RemotePiece& d : w->dst) {
    if (keys_.known(d.window)) continue;
    Action await;
    await.kind = Action::Kind::kAwaitKey;
    await.t = w->t;
    await.pending = w;
    await.window = d.window;
    await.secret = d.secret;
    out.push_back(std::move(await));
    return;
  }
  const std::shared_ptr<Transfer>& t = w->t;
  if (t->finished()) return;
  try {
    for (size_t i = 0; i < w->src.size(); ++i) {
      const Piece& src = w->src[i];
      const RemotePiece& dst = w->dst[i];
      keys_.checkFits(dst);
      Action a;
      a.kind = Action::Kind::kWrite;
      a.t = t;
      a.region = src.region;
      a.write.peer = peer_;
      a.write.localWindow = src.region.window;
      a.write.localOffset = src.offset;
      a.write.remoteWindow = dst.window;
      a.write.remoteOffset = dst.offset;
      a.write.bytes = src.size;
      a.write.withImm = w->notify && i + 1 == w->src.size();
      a.write.imm = kNotifyImm;
      a.write.cookie = nextId_++;
      writes_[a.write.cookie] = t;
      out.push_back(std::move(a));
    }
    ControlMsg fence;
    fence.type = MsgType::kFence;
    fence.id = nextId_++;
    fences_[fence.id] = t;
    t->setWaiting("the peer's acknowledgement that the data is in place (fence " + std::to_string(fence.id) + ")");
    post(out, fence);
  } catch (const Error& e) {
    t->fail(e.code(), e.what());
  }
}

void OneSided::read(const std::shared_ptr<Transfer>& t, const std::vector<Piece>& dst,
                    const std::vector<RemotePiece>& src, Actions& out) {
  t->setWaiting("the peer's answer to the read");
  try {
    std::vector<ControlMsg> key;
    for (size_t i = 0; i < dst.size(); ++i) {
      ControlMsg req;
      req.type = MsgType::kReadRequest;
      req.id = nextId_++;
      req.window = src[i].window;
      req.offset = src[i].offset;
      req.bytes = src[i].size;
      key.clear();
      // Exactly the range read, until kReadDone; its key goes to the peer before the request.
      req.dstWindow = keys_.grant(dst[i], LocalWindows::GrantFor::kRead, req.id, key);
      for (const ControlMsg& part : key) post(out, part);
      req.dstOffset = 0;
      reads_[req.id] = t;
      post(out, req);
    }
  } catch (const Error& e) {
    t->fail(e.code(), e.what());
  }
}

void OneSided::notPosted(const Action& w, const Error& e, bool registered, Actions& out) {
  if (!w.t) {  // the answer to the peer's read: it hears that the data could not be written back
    GDX_WARN(name_ << ": read request " << w.readId << " of window " << w.write.localWindow << ": " << e.what());
    ControlMsg done;
    done.type = MsgType::kReadDone;
    done.id = w.readId;
    done.status = ReadStatus::kFailed;
    return post(out, done);
  }
  // The pieces after it and the fence were dropped unposted: nothing completes them.
  for (auto it = writes_.begin(); it != writes_.end();) {
    const bool dropped =
        it->second == w.t && (it->first > w.write.cookie || (it->first == w.write.cookie && !registered));
    it = dropped ? writes_.erase(it) : std::next(it);
  }
  for (auto it = fences_.begin(); it != fences_.end();) it = it->second == w.t ? fences_.erase(it) : std::next(it);
  w.t->fail(e.code(), e.what());
}

void OneSided::onWriteDone(const Completion& c, const std::string& failure) {
  auto it = writes_.find(c.cookie);
  if (it == writes_.end()) return;
  if (c.status == Status::kOk)
    it->second->finishPart();
  else
    it->second->fail(errorCodeFor(c.status),
                     std::string("the transport failed the write: ") + statusName(c.status) + " (" + failure + ")");
  writes_.erase(it);
}

void OneSided::onMessage(const ControlMsg& m, Actions& out) {
  switch (m.type) {
    case MsgType::kFence: {
      ControlMsg ack;
      ack.type = MsgType::kFenceAck;
      ack.id = m.id;
      return post(out, ack);
    }
    case MsgType::kFenceAck: {
      auto it = fences_.find(m.id);
      if (it == fences_.end()) return;
      it->second->finishPart();
      fences_.erase(it);
      return;
    }
    case MsgType::kReadRequest: return onReadRequest(m, out);
    case MsgType::kReadDone: return onReadDone(m);
    default: return;  // not one-sided: the connection routes those elsewhere
  }
}

void OneSided::onReadRequest(const ControlMsg& m, Actions& out) {
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
    Action a;
    a.kind = Action::Kind::kWrite;
    a.readId = m.id;
    a.region = src;
    a.write.peer = peer_;
    a.write.localWindow = src.window;
    a.write.localOffset = m.offset;
    a.write.remoteWindow = m.dstWindow;
    a.write.remoteOffset = m.dstOffset;
    a.write.bytes = m.bytes;
    a.write.cookie = nextId_++;
    out.push_back(std::move(a));  // the kReadDone below is delivered only after this data is in place
  }
  post(out, done);
}

void OneSided::onReadDone(const ControlMsg& m) {
  windows_.revokeRead(m.id);
  auto it = reads_.find(m.id);
  if (it == reads_.end()) return;
  if (m.status == ReadStatus::kOk)
    it->second->finishPart();
  else
    it->second->fail(m.status == ReadStatus::kFailed ? ErrorCode::kPeerFailed : ErrorCode::kInvalidArgument,
                     std::string("the peer refused the read: ") + readStatusText(m.status));
  reads_.erase(it);
}

void OneSided::clear() {
  writes_.clear();
  fences_.clear();
  reads_.clear();
}

}  // namespace gdx::p2p
