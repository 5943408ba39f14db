#include "p2p/connection.hpp"

#include <algorithm>
#include <tuple>

#include "gdx/detail/clock.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"

namespace gdx::p2p {
namespace {

constexpr uint32_t kSeqMask = 0x7fffffffu;
constexpr uint64_t kSweepEveryNs = 10 * 1000 * 1000;
constexpr size_t kMaxCompletions = 64;

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

Connection::Connection(uint64_t id, PairLink link, uint64_t timeoutNs, std::function<void()> wake)
    : id_(id), link_(std::move(link)), timeoutNs_(timeoutNs), wake_(std::move(wake)) {
  name_ = "connection " + std::to_string(id_) + " (peer " + link_.peerIp + ", GPU " + std::to_string(link_.peerGpu) +
          ", " + link_.detail + ")";
}

Connection::~Connection() {
  try {
    link_.transport->shutdown();
  } catch (const std::exception& e) {
    GDX_ERROR(name_ << ": closing: " << e.what());
  }
}

void Connection::start() {
  link_.transport->setImmHandler([this](const RemoteWrite& w) {
    Event e;
    e.kind = Event::kImm;
    e.imm = w.imm;
    push(std::move(e));
  });
  link_.transport->setMessageHandler([this](const RemoteMessage& m) {
    Event e;
    e.kind = Event::kMessage;
    e.msg = m;
    push(std::move(e));
  });
  link_.transport->setPeerFailureHandler([this](int, const std::string& why) {
    Event e;
    e.kind = Event::kFailure;
    e.why = why;
    push(std::move(e));
  });
  link_.transport->connect(link_.addresses, 1);
  lane_ = &link_.transport->lane(0);
  GDX_INFO(name_ << ": connected over " << link_.transport->name() << " as rank " << link_.self);
}

std::string Connection::failure() const {
  std::lock_guard<std::mutex> lock(winMutex_);
  return failure_;
}

void Connection::queue(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    ops_.push_back(std::move(op));
  }
  wake_();
}

void Connection::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    inbox_.push_back(std::move(e));
  }
  wake_();
}

void Connection::setResolver(WindowResolver r) {
  std::lock_guard<std::mutex> lock(winMutex_);
  resolver_ = std::move(r);
}

void Connection::setNotifyHandler(std::function<void()> h) {
  queue([this, h = std::move(h)] { notify_ = h; });
}

uint64_t Connection::track(std::shared_ptr<Transfer> t) {
  live_.push_back(t);
  return nextId_++;
}

// ---- operations (queued by callers, run by the progress thread) ------------------------------------------------

void Connection::send(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  queue([this, t, pieces = std::move(pieces)] {
    track(t);
    for (const Piece& p : pieces) sends_.push_back(PendingSend{nextSendSeq_++, t, p});
    t->setWaiting("a matching receive posted by the peer");
    trySends();
  });
}

void Connection::recv(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  queue([this, t, pieces = std::move(pieces)] {
    track(t);
    t->setWaiting("the peer's matching send");
    for (const Piece& p : pieces) {
      const uint64_t seq = nextRecvSeq_++;
      try {
        std::string key = ensureLocal(p.region);
        sendKey(p.region.window, key, p.region.bytes);
        recvs_[static_cast<uint32_t>(seq) & kSeqMask] = PendingRecv{t, p.size, seq};
        ControlMsg cts;
        cts.type = MsgType::kClearToSend;
        cts.id = seq;
        cts.window = p.region.window;
        cts.offset = p.offset;
        cts.bytes = p.size;
        postControl(cts);
      } catch (const Error& e) {
        t->fail(e.code(), std::string("receive #") + std::to_string(seq) + ": " + e.what());
      }
    }
  });
}

void Connection::whenKnown(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op) {
  if (remoteKnown_.count(window)) return op();
  auto& waiters = keyWaiters_[window];
  if (waiters.empty()) {
    ControlMsg req;
    req.type = MsgType::kKeyRequest;
    req.window = window;
    postControl(req);
  }
  t->setWaiting("the peer's key of window " + std::to_string(window));
  waiters.emplace_back(t, std::move(op));
}

void Connection::write(std::shared_ptr<Transfer> t, std::vector<Piece> src, std::vector<RemotePiece> dst, bool notify) {
  queue([this, t, src = std::move(src), dst = std::move(dst), notify] {
    track(t);
    // Post once every destination window is known; each whenKnown() either runs now or parks the retry.
    auto attempt = std::make_shared<std::function<void()>>();
    *attempt = [this, t, src, dst, notify, attempt] {
      for (const RemotePiece& d : dst)
        if (!remoteKnown_.count(d.window)) return whenKnown(d.window, t, *attempt);
      if (t->finished()) return;
      try {
        for (size_t i = 0; i < src.size(); ++i) {
          const uint64_t have = remoteKnown_[dst[i].window];
          if (dst[i].offset > have || dst[i].size > have - dst[i].offset)
            throw Error(ErrorCode::kInvalidArgument,
                        "a write of " + std::to_string(dst[i].size) + " bytes at offset " +
                            std::to_string(dst[i].offset) + " does not fit the peer's window " +
                            std::to_string(dst[i].window) + " of " + std::to_string(have) + " bytes");
          ensureLocal(src[i].region);
          WriteOp op;
          op.peer = link_.peer();
          op.localWindow = src[i].region.window;
          op.localOffset = src[i].offset;
          op.remoteWindow = dst[i].window;
          op.remoteOffset = dst[i].offset;
          op.bytes = src[i].size;
          op.withImm = notify && i + 1 == src.size();
          op.imm = kNotifyImm;
          op.cookie = nextId_++;
          cookies_[op.cookie] = t;
          lane_->post(op);
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
    };
    (*attempt)();
  });
}

void Connection::read(std::shared_ptr<Transfer> t, std::vector<Piece> dst, std::vector<RemotePiece> src) {
  queue([this, t, dst = std::move(dst), src = std::move(src)] {
    track(t);
    t->setWaiting("the peer's answer to the read");
    try {
      for (size_t i = 0; i < dst.size(); ++i) {
        std::string key = ensureLocal(dst[i].region);
        sendKey(dst[i].region.window, key, dst[i].region.bytes);
        ControlMsg req;
        req.type = MsgType::kReadRequest;
        req.id = nextId_++;
        req.window = src[i].window;
        req.offset = src[i].offset;
        req.bytes = src[i].size;
        req.dstWindow = dst[i].region.window;
        req.dstOffset = dst[i].offset;
        reads_[req.id] = t;
        postControl(req);
      }
    } catch (const Error& e) {
      t->fail(e.code(), e.what());
    }
  });
}

// ---- windows --------------------------------------------------------------------------------------------------

uint32_t Connection::advertise(const MemoryRegion& region, uint64_t offset, uint64_t size) {
  std::lock_guard<std::mutex> lock(winMutex_);
  if (forgotten_.count(region.window))
    throw Error(ErrorCode::kInvalidArgument,
                name_ + ": memory region " + std::to_string(region.window) + " was deregistered");
  auto key = std::make_tuple(region.window, offset, size);
  auto it = advertisedRanges_.find(key);
  if (it != advertisedRanges_.end()) return it->second;
  if (nextAdvertised_ == UINT32_MAX) throw Error(ErrorCode::kInvalidArgument, name_ + ": too many advertised ranges");
  Advertised a;
  a.region.window = nextAdvertised_++;
  a.region.base = region.base + offset;
  a.region.bytes = size;
  a.region.kind = region.kind;
  a.parent = region.window;
  advertised_[a.region.window] = a;
  advertisedRanges_[key] = a.region.window;
  return a.region.window;
}

void Connection::forget(uint32_t window) {
  std::lock_guard<std::mutex> lock(winMutex_);
  std::vector<uint32_t> gone{window};
  for (auto it = advertised_.begin(); it != advertised_.end();) {
    if (it->second.parent == window) {
      gone.push_back(it->first);
      it = advertised_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = advertisedRanges_.begin(); it != advertisedRanges_.end();)
    it = std::get<0>(it->first) == window ? advertisedRanges_.erase(it) : std::next(it);
  for (uint32_t w : gone) {
    forgotten_.insert(w);
    if (localKeys_.erase(w)) {
      try {
        link_.transport->deregisterWindow(w);
      } catch (const Error& e) {
        GDX_WARN(name_ << ": deregistering window " << w << ": " << e.what());
      }
    }
  }
}

std::string Connection::ensureLocal(const MemoryRegion& r) {
  std::lock_guard<std::mutex> lock(winMutex_);
  if (forgotten_.count(r.window))
    throw Error(ErrorCode::kInvalidArgument, name_ + ": memory region " + std::to_string(r.window) +
                                                 " was deregistered while the transfer was queued");
  auto it = localKeys_.find(r.window);
  if (it != localKeys_.end()) return it->second;
  std::string key = link_.transport->registerWindow(r.window, r.base, r.bytes, r.kind);
  localKeys_[r.window] = key;
  return key;
}

bool Connection::resolveLocal(uint32_t window, MemoryRegion* out) {
  WindowResolver resolver;
  {
    std::lock_guard<std::mutex> lock(winMutex_);
    auto it = advertised_.find(window);
    if (it != advertised_.end()) {
      *out = it->second.region;
      return true;
    }
    resolver = resolver_;
  }
  return resolver && resolver(window, out);
}

void Connection::sendKey(uint32_t window, const std::string& key, uint64_t bytes) {
  if (!keysSent_.insert(window).second) return;
  if (key.size() > kMaxKeyBytes)
    throw Error(ErrorCode::kInternal, name_ + ": a window key of " + std::to_string(key.size()) + " bytes");
  for (size_t at = 0; at == 0 || at < key.size(); at += kKeyPieceBytes) {
    ControlMsg part;
    part.type = MsgType::kKeyPart;
    part.window = window;
    part.bytes = bytes;
    part.keyTotal = static_cast<uint16_t>(key.size());
    part.keyAt = static_cast<uint16_t>(at);
    part.keyPiece = key.substr(at, kKeyPieceBytes);
    postControl(part);
    if (key.empty()) break;
  }
}

void Connection::postControl(const ControlMsg& m) {
  MessageOp op = encode(m, link_.peer());
  op.cookie = 0;  // internal: its completion is not a transfer's (a lost one fails the peer, which fails them all)
  lane_->postMessage(op);
}

// ---- what arrives ---------------------------------------------------------------------------------------------

void Connection::trySends() {
  while (!sends_.empty()) {
    PendingSend& s = sends_.front();
    auto it = cts_.find(s.seq);
    if (it == cts_.end()) return;
    const ControlMsg cts = it->second;
    cts_.erase(it);
    PendingSend send = s;
    sends_.pop_front();
    if (send.t->finished()) continue;
    const std::string which = "send #" + std::to_string(send.seq) + " of " + std::to_string(send.piece.size) + " bytes";
    try {
      if (cts.bytes != send.piece.size) {
        ControlMsg no;
        no.type = MsgType::kSendRefused;
        no.id = send.seq;
        no.bytes = send.piece.size;
        postControl(no);
        throw Error(ErrorCode::kInvalidArgument, which + ": the receive the peer posted for it expects " +
                                                     std::to_string(cts.bytes) +
                                                     " bytes; sizes must match exactly (nothing was sent)");
      }
      if (!remoteKnown_.count(cts.window))
        throw Error(ErrorCode::kProtocol, which + ": the peer's clear-to-send names window " +
                                              std::to_string(cts.window) + ", whose key never arrived");
      ensureLocal(send.piece.region);
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
      cookies_[op.cookie] = send.t;
      send.t->setWaiting("the transport's completion of " + which);
      lane_->post(op);
    } catch (const Error& e) {
      send.t->fail(e.code(), e.what());
    }
  }
}

void Connection::onKeyPart(const ControlMsg& m) {
  std::string& key = keyAssembly_[m.window];
  if (m.keyAt == 0) key.assign(m.keyTotal, '\0');
  if (key.size() != m.keyTotal) return failAll(ErrorCode::kProtocol, "the peer sent a key part out of order");
  key.replace(m.keyAt, m.keyPiece.size(), m.keyPiece);
  if (size_t{m.keyAt} + m.keyPiece.size() < m.keyTotal) return;
  std::string full = std::move(key);
  keyAssembly_.erase(m.window);
  auto waiters = std::move(keyWaiters_[m.window]);
  keyWaiters_.erase(m.window);
  try {
    link_.transport->addRemoteWindow(link_.peer(), m.window, m.bytes, full);
    remoteKnown_[m.window] = m.bytes;
  } catch (const Error& e) {
    for (auto& w : waiters) w.first->fail(e.code(), e.what());
    return;
  }
  for (auto& w : waiters) w.second();
}

void Connection::onReadRequest(const ControlMsg& m) {
  ControlMsg done;
  done.type = MsgType::kReadDone;
  done.id = m.id;
  MemoryRegion src;
  if (!resolveLocal(m.window, &src)) {
    done.status = ReadStatus::kUnknownWindow;
  } else if (m.offset > src.bytes || m.bytes > src.bytes - m.offset || m.bytes == 0) {
    done.status = ReadStatus::kOutOfRange;
  } else {
    try {
      ensureLocal(src);
      WriteOp op;
      op.peer = link_.peer();
      op.localWindow = src.window;
      op.localOffset = m.offset;
      op.remoteWindow = m.dstWindow;
      op.remoteOffset = m.dstOffset;
      op.bytes = m.bytes;
      op.cookie = 0;
      lane_->post(op);  // the kReadDone below is delivered only after this data is in place
    } catch (const Error& e) {
      GDX_WARN(name_ << ": read request " << m.id << " of window " << m.window << ": " << e.what());
      done.status = ReadStatus::kFailed;
    }
  }
  postControl(done);
}

void Connection::handleMessage(const ControlMsg& m) {
  switch (m.type) {
    case MsgType::kKeyRequest: {
      MemoryRegion r;
      if (!resolveLocal(m.window, &r)) {
        ControlMsg no;
        no.type = MsgType::kKeyRefused;
        no.window = m.window;
        return postControl(no);
      }
      keysSent_.erase(m.window);  // the peer asks, so it does not have it
      try {
        return sendKey(m.window, ensureLocal(r), r.bytes);
      } catch (const Error& e) {
        GDX_WARN(name_ << ": key of window " << m.window << ": " << e.what());
        ControlMsg no;
        no.type = MsgType::kKeyRefused;
        no.window = m.window;
        return postControl(no);
      }
    }
    case MsgType::kKeyPart: return onKeyPart(m);
    case MsgType::kKeyRefused: {
      auto waiters = std::move(keyWaiters_[m.window]);
      keyWaiters_.erase(m.window);
      for (auto& w : waiters)
        w.first->fail(ErrorCode::kInvalidArgument,
                      "the peer refused window " + std::to_string(m.window) +
                          ": it was not advertised on this connection (a forged, stale or foreign descriptor)");
      return;
    }
    case MsgType::kClearToSend: cts_[m.id] = m; return trySends();
    case MsgType::kSendRefused: {
      auto it = recvs_.find(static_cast<uint32_t>(m.id) & kSeqMask);
      if (it == recvs_.end()) return;
      it->second.t->fail(ErrorCode::kInvalidArgument,
                         "receive #" + std::to_string(it->second.seq) + ": the peer's send is " +
                             std::to_string(m.bytes) + " bytes, this receive expects " +
                             std::to_string(it->second.bytes) + "; sizes must match exactly (nothing was written)");
      recvs_.erase(it);
      return;
    }
    case MsgType::kFence: {
      ControlMsg ack;
      ack.type = MsgType::kFenceAck;
      ack.id = m.id;
      return postControl(ack);
    }
    case MsgType::kFenceAck: {
      auto it = fences_.find(m.id);
      if (it == fences_.end()) return;
      it->second->finishPart();
      fences_.erase(it);
      return;
    }
    case MsgType::kReadRequest: return onReadRequest(m);
    case MsgType::kReadDone: {
      auto it = reads_.find(m.id);
      if (it == reads_.end()) return;
      if (m.status == ReadStatus::kOk)
        it->second->finishPart();
      else
        it->second->fail(m.status == ReadStatus::kFailed ? ErrorCode::kPeerFailed : ErrorCode::kInvalidArgument,
                         std::string("the peer refused the read: ") + readStatusText(m.status));
      reads_.erase(it);
      return;
    }
  }
}

void Connection::handle(const Event& e) {
  if (e.kind == Event::kFailure) return failAll(ErrorCode::kPeerFailed, "the peer failed: " + e.why);
  if (e.kind == Event::kImm) {
    if (e.imm & kNotifyImm) {
      if (notify_) notify_();
      return;
    }
    auto it = recvs_.find(e.imm);
    if (it == recvs_.end())
      return failAll(ErrorCode::kProtocol,
                     "data arrived for receive #" + std::to_string(e.imm) + ", which was never posted");
    it->second.t->finishPart();
    recvs_.erase(it);
    return;
  }
  ControlMsg m;
  std::string bad = decode(e.msg, &m);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, "the peer sent " + bad);
  handleMessage(m);
}

void Connection::failAll(ErrorCode code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(winMutex_);
    if (failure_.empty()) failure_ = why;
  }
  GDX_WARN(name_ << ": " << why);
  for (auto& t : live_) t->fail(code, why);  // the transfer's own description names the connection
  live_.clear();
  sends_.clear();
  recvs_.clear();
  cookies_.clear();
  fences_.clear();
  reads_.clear();
  keyWaiters_.clear();
}

void Connection::sweep() {
  const uint64_t now = nowNs();
  if (now < nextSweepNs_) return;
  nextSweepNs_ = now + kSweepEveryNs;
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [&](const std::shared_ptr<Transfer>& t) {
                               if (t->finished()) return true;
                               if (now < t->deadlineNs()) return false;
                               t->fail(ErrorCode::kTimeout, "not done within GDX_TIMEOUT_MS (" +
                                                                std::to_string(timeoutNs_ / 1000000) + " ms)");
                               return true;
                             }),
              live_.end());
}

bool Connection::progress() {
  std::deque<std::function<void()>> ops;
  std::deque<Event> events;
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    ops.swap(ops_);
    events.swap(inbox_);
  }
  const std::string failed = failure();
  for (auto& e : events) handle(e);
  for (auto& op : ops) {
    if (!failed.empty()) {
      op();  // queues its transfer in live_; failAll below fails it by name
      failAll(ErrorCode::kPeerFailed, failed);
      continue;
    }
    try {
      op();
    } catch (const std::exception& e) {
      GDX_ERROR(name_ << ": " << e.what());
    }
  }
  Completion done[kMaxCompletions];
  size_t n = lane_->poll(done, kMaxCompletions);
  for (size_t i = 0; i < n; ++i) {
    if (done[i].cookie == 0) continue;
    auto it = cookies_.find(done[i].cookie);
    if (it == cookies_.end()) continue;
    if (done[i].status == Status::kOk)
      it->second->finishPart();
    else
      it->second->fail(errorCodeFor(done[i].status), std::string("the transport failed the write: ") +
                                                         statusName(done[i].status) + " (" + failure() + ")");
    cookies_.erase(it);
  }
  sweep();
  // Completions of the lane are polled, not announced: come back soon while any is due.
  return lane_->inFlight() > 0 || !ops.empty() || !events.empty();
}

}  // namespace gdx::p2p
