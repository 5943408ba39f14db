#include "p2p/connection.hpp"

#include <algorithm>
#include <chrono>

#include "gdx/detail/clock.hpp"
#include "gdx/detail/log.hpp"
#include "gdx/error.hpp"
#include "p2p/memory_kind.hpp"

namespace gdx::p2p {
namespace {

/// The bits of a send's number the immediate of a write into the receive's own buffer carries.
constexpr uint32_t kSeqMask = 0x3fffffffu;
/// An eager write's immediate: kEagerImm, the credits this side returns (bits 16..29), the send's number's low bits.
constexpr uint32_t kEagerSeqBits = 0xffffu;
constexpr int kEagerCreditShift = 16;
constexpr uint32_t kEagerCreditMask = 0x3fffu;
static_assert(kEagerSlots <= kEagerCreditMask, "an eager immediate carries up to a buffer's worth of credits");
/// Credits owed for longer than this are reported on their own (kCredit) by the next round of the connection: a
/// reply within it carries them in its immediate instead. Rounds run at least every millisecond (progress thread).
constexpr uint64_t kCreditDelayNs = 100 * 1000;
constexpr uint64_t kSweepEveryNs = 10 * 1000 * 1000;
constexpr size_t kMaxCompletions = 64;
/// Longest sleep of drive() between looks at the deadline (a wake-up can be missed only when a transfer is finished
/// by the progress thread between drive()'s look and its sleep; that costs at most this).
constexpr uint64_t kDriveSleepNs = 1000 * 1000;
/// While drive() polls and nothing was handed over, it still runs a round this often: credits owed for
/// kCreditDelayNs and deadlines are found by rounds, not announced.
constexpr uint64_t kQuietRoundNs = 20 * 1000;
/// How long a blocking call polls after the last work it did before it sleeps. Longer than Connection::kSpinNs (the
/// progress threads'): the caller waits for its peer's answer, a round trip plus the peer's own turnaround, which a
/// small message's blocking send does every time (its credit comes back with the reply); on a 2-vCPU host that is
/// 50-80 us, so 50 us of polling put the caller to sleep, and a futex wake-up on the reply's path, about every other
/// message. The caller has nothing else to do meanwhile, and spinPause() yields the CPU to whoever else is runnable.
constexpr uint64_t kDriveSpinNs = 200 * 1000;
/// The receiver reports freed eager slots on its own (kCredit) once this many are unreported; fewer ride on the
/// next clear-to-send.
constexpr uint32_t kCreditBatch = kEagerSlots / 2;

/// Why a send failed whose receive's buffer has `bufferBytes`, fewer than its own, after "send #n of b bytes".
std::string bufferTooSmall(uint64_t bufferBytes) {
  return ": the receive the peer posted for it has a buffer of " + std::to_string(bufferBytes) +
         " bytes, smaller than this send";
}

/// Why a send failed whose receive failed with `code` (kReceiveFailed), after "send #n of b bytes".
std::string receiveFailed(ErrorCode code) {
  return std::string(": the receive the peer posted for it ended in error (") + errorCodeName(code) +
         ") and takes no data";
}

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
    : id_(id),
      link_(std::move(link)),
      timeoutNs_(timeoutNs),
      wake_(std::move(wake)),
      windows_(*link_.transport, name_) {
  name_ = "connection " + std::to_string(id_) + " (peer " + link_.peerIp + ", GPU " + std::to_string(link_.peerGpu) +
          ", " + link_.detail + ")";
  sharedName_ = std::make_shared<const std::string>(name_);
}

Connection::~Connection() {
  try {
    // Sends this side took and has not confirmed yet are confirmed before the goodbye: their senders wait for it.
    if (lane_ && creditsFreed_ > 0 && failure().empty()) flushCredits();
    link_.transport->shutdown();
  } catch (const std::exception& e) {
    GDX_ERROR(name_ << ": closing: " << e.what());
  }
}

void Connection::close(ErrorCode code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(progressMutex_);  // after whoever runs it now
    if (lane_) {
      if (!failed_.load()) {
        try {  // sends this side took are confirmed before the goodbye: their senders wait for it
          if (creditsFreed_ > 0) flushCredits();
        } catch (const Error& e) {
          GDX_WARN(name_ << ": confirming what arrived before closing: " << e.what());
        }
        failAll(code, why);
      }
      round();  // operations queued meanwhile fail by name too
    }
  }
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
    e.bytes = w.bytes;
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
  link_.transport->setCompletionHandler([this](int) { onCompletionReady(); });
  link_.transport->connect(link_.addresses, 1);
  lane_ = &link_.transport->lane(0);
  GDX_INFO(name_ << ": connected over " << link_.transport->name() << " as rank " << link_.self);
}

std::string Connection::failure() const {
  if (!failed_.load()) return std::string();  // healthy: no lock and no copy (every round and operation asks)
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

template <typename Op>
void Connection::submit(Op op) {
  std::unique_lock<std::mutex> lock(progressMutex_, std::try_to_lock);
  if (!lane_ || !lock.owns_lock()) return queue(std::move(op));  // the holder runs it (pending_) before it lets go
  // Operations queued and events handed over before this one are taken first, in the order a round takes them.
  while (pending_.exchange(false)) round();
  runOperation(op, failure());
  // One more round takes the completions of what the operation posted (a small send that left from this thread has
  // its completion already) and whatever was handed over meanwhile; with neither it would find nothing, and the
  // connection's deadlines and owed credits are looked at by the next round anyway (at most a millisecond away).
  Activity activity = Activity::kWorked;
  if (pending_.load() || lane_->inFlight() > 0) {
    activity = progressHolding(lock, false, true);
  } else {
    lock.unlock();
    notifyOtherDrivers();
  }
  if (activity != Activity::kIdle && drivers_.load() == 0) wake_();
}

template <typename Op>
void Connection::runOperation(Op& op, const std::string& failed) {
  if (!failed.empty()) {
    op();  // queues its transfer in live_; failAll fails it by name
    return failAll(ErrorCode::kPeerFailed, failed);
  }
  try {
    op();
  } catch (const std::exception& e) {
    GDX_ERROR(name_ << ": " << e.what());
  }
}

void Connection::queue(std::function<void()> op) {
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    ops_.push_back(std::move(op));
    pending_ = true;
  }
  // Run it here unless another thread drives the connection (it sees pending_ before it lets go). What is left in
  // flight afterwards (completions to poll) goes to the progress thread unless the caller is about to drive().
  if (progress() != Activity::kIdle && drivers_.load() == 0) wake_();
}

void Connection::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    inbox_.push_back(std::move(e));
    pending_ = true;
  }
  wakeDriver();
}

void Connection::onCompletionReady() {
  {
    std::lock_guard<std::mutex> lock(opsMutex_);  // orders it with drive()'s look at pending_ before it sleeps
    pending_ = true;
  }
  wakeDriver();
}

namespace {
/// The connection the calling thread drives (Connection::Driving), so that a round it runs does not wake itself.
thread_local Connection::Driving::Here drivenHere;
}  // namespace

Connection::Driving::Driving(Connection& c) : c_(c), outer_(drivenHere) {
  c_.drivers_.fetch_add(1);
  drivenHere = Here{&c, outer_.connection == &c ? outer_.depth + 1 : 1};
}

Connection::Driving::~Driving() {
  drivenHere = outer_;
  c_.leaveDriving();
}

int Connection::drivingHere() const {
  return drivenHere.connection == this ? drivenHere.depth : 0;
}

void Connection::notifyOtherDrivers() {
  // Only drivers in other threads can be asleep (this one is running); a blocking call's own round wakes nobody.
  if (drivers_.load() <= drivingHere()) return;
  // Taking opsMutex_ orders this notification after a sleeping driver's last look at its transfer.
  { std::lock_guard<std::mutex> ops(opsMutex_); }
  driverCv_.notify_all();
}

void Connection::leaveDriving() {
  // drivers_ and pending_ are sequentially consistent: either push() sees no driver and wakes the progress thread,
  // or this sees its pending_.
  if (drivers_.fetch_sub(1) == 1 && (pending_.load() || (lane_ && lane_->inFlight() > 0))) wake_();
}

void Connection::wakeDriver() {
  if (drivers_.load() > 0)
    driverCv_.notify_all();  // a driver polls or sleeps on driverCv_ and does the work in its own thread
  else
    wake_();
}

void Connection::setResolver(WindowResolver r) {
  windows_.setResolver(std::move(r));
}

void Connection::setNotifyHandler(std::function<void()> h) {
  queue([this, h = std::move(h)] { notify_ = h; });
}

void Connection::setFailureHandler(std::function<void()> h) {
  std::lock_guard<std::mutex> lock(failureMutex_);
  onFailure_ = std::move(h);
}

uint64_t Connection::track(std::shared_ptr<Transfer> t) {
  live_.push_back(t);
  return nextId_++;
}

// ---- operations (queued by callers, run by the progress thread) ------------------------------------------------

void Connection::send(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  submit([this, t, pieces = std::move(pieces)] {
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
  });
}

void Connection::recv(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  submit([this, t, pieces = std::move(pieces)] {
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
  });
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

void Connection::tellFailure(MsgType type, uint64_t seq, ErrorCode code, const std::string& what) {
  ControlMsg m;
  m.type = type;
  m.id = seq;
  m.code = code == ErrorCode::kOk ? ErrorCode::kInternal : code;
  try {
    postControl(m);
  } catch (const Error& e) {  // called on failure paths: a transport that cannot carry it fails the peer anyway
    GDX_WARN(name_ << ": telling the peer " << what << ": " << e.what());
  }
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
  if (keysSent_.count(kEagerWindow)) return;
  MemoryRegion r;
  windows_.resolve(kEagerWindow, &r);
  sendKey(kEagerWindow, windows_.keyOf(r), r.bytes);
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

void Connection::whenKnown(uint32_t window, const std::shared_ptr<Transfer>& t, std::function<void()> op,
                           uint64_t secret) {
  if (remoteKnown_.count(window)) return op();
  auto& waiters = keyWaiters_[window];
  if (waiters.empty()) {
    ControlMsg req;
    req.type = MsgType::kKeyRequest;
    req.window = window;
    req.offset = secret;
    postControl(req);
  }
  t->setWaiting("the peer's key of window " + std::to_string(window));
  waiters.emplace_back(t, std::move(op));
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
    if (!remoteKnown_.count(d.window))
      return whenKnown(
          d.window, w->t, [this, w] { postWrite(w); }, d.secret);
  const std::shared_ptr<Transfer>& t = w->t;
  if (t->finished()) return;
  try {
    for (size_t i = 0; i < w->src.size(); ++i) {
      const Piece& src = w->src[i];
      const RemotePiece& dst = w->dst[i];
      const uint64_t have = remoteKnown_[dst.window];
      if (dst.offset > have || dst.size > have - dst.offset)
        throw Error(ErrorCode::kInvalidArgument, "a write of " + std::to_string(dst.size) + " bytes at offset " +
                                                     std::to_string(dst.offset) + " does not fit the peer's window " +
                                                     std::to_string(dst.window) + " of " + std::to_string(have) +
                                                     " bytes");
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
      cookies_[op.cookie] = PostedWrite{t};
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

// ---- windows --------------------------------------------------------------------------------------------------

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
  std::string key;
  const uint32_t w = windows_.grant(p, what, id, &key);
  keysSent_.erase(w);  // a window id used before: the peer gets this grant's key
  sendKey(w, key, p.size);
  return w;
}

void Connection::sendKey(uint32_t window, const std::string& key, uint64_t bytes) {
  if (!keysSent_.insert(window).second) return;
  if (key.size() > kMaxKeyBytes)
    throw Error(ErrorCode::kInternal, name_ + ": a window key of " + std::to_string(key.size()) + " bytes");
  for (const ControlMsg& part : splitKey(window, key, bytes)) postControl(part);
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
      if (!remoteKnown_.count(cts.window))
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
  if (!remoteKnown_.count(kEagerWindow)) {
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

void Connection::onKeyPart(const ControlMsg& m) {
  bool complete = false;
  KeyAssembly::Key k;
  const std::string bad = keyAssembly_.add(m, &complete, &k);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, "the peer sent " + bad);
  if (!complete) return;
  auto waiters = std::move(keyWaiters_[m.window]);
  keyWaiters_.erase(m.window);
  try {
    link_.transport->addRemoteWindow(link_.peer(), k.window, k.bytes, k.key);
    remoteKnown_[k.window] = k.bytes;
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

void Connection::handleMessage(const ControlMsg& m) {
  switch (m.type) {
    case MsgType::kKeyRequest: {
      MemoryRegion r;
      if (!windows_.resolve(m.window, &r, m.offset)) {
        ControlMsg no;
        no.type = MsgType::kKeyRefused;
        no.window = m.window;
        return postControl(no);
      }
      keysSent_.erase(m.window);  // the peer asks, so it does not have it
      try {
        std::string key = windows_.keyOf(r);
        // A window the resolver gave (the URL transport's memory, its key's secret presented) may be written, even
        // if it was registered before as the source of this side's writes.
        if (m.window < kAdvertisedWindowBase && m.window != kEagerWindow)
          link_.transport->setRemoteAccess(m.window, RemoteAccess::kWrite);
        return sendKey(m.window, key, r.bytes);
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
    case MsgType::kClearToSend:
    case MsgType::kCredit:
      onCredits(m.credits);
      if (m.type == MsgType::kClearToSend) {
        if (eagerSends_.count(m.id))
          matchEager(m);
        else if (m.id >= nextSendSeq_ || (!sends_.empty() && m.id >= sends_.front().seq))
          cts_[m.id] = m;  // else its send is gone (withdrawn, or failed by the peer's notice): nothing waits for it
      }
      return trySends();
    case MsgType::kRequestToSend: return onRequestToSend(m);
    case MsgType::kReceiveRefused: failUnsentSend(m.id, ErrorCode::kInvalidArgument, bufferTooSmall(m.bytes)); return;
    case MsgType::kReceiveFailed: return onReceiveFailed(m);
    case MsgType::kSendWithdrawn: return onSendWithdrawn(m);
    case MsgType::kWithdrawTooLate: return onWithdrawTooLate(m);
    case MsgType::kSendRefused: {
      auto it = recvs_.find(static_cast<uint32_t>(m.id) & kSeqMask);
      if (it == recvs_.end()) return;
      it->second.t->fail(ErrorCode::kInvalidArgument, tooLarge(it->second.seq, m.bytes, it->second.bytes));
      recvs_.erase(it);
      abandonFailedRecvs();  // the receive's other buffers
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
      windows_.revokeRead(m.id);
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
    if (e.imm & kEagerImm) return onEagerData(e.imm, e.bytes);
    auto it = recvs_.find(e.imm);
    if (it == recvs_.end()) {
      auto failed = failedRecvs_.find(e.imm);
      if (failed == failedRecvs_.end())
        return failAll(ErrorCode::kProtocol,
                       "data arrived for receive #" + std::to_string(e.imm) + ", which was never posted");
      // The write left before the sender heard that its receive failed: the transport placed the data (the region
      // was still registered), which the receive's caller was told it would not get.
      const uint64_t seq = failed->second;
      GDX_WARN(name_ << ": the data of send #" << seq << " arrived after its receive had failed");
      arrivedForFailedRecv(seq);
      nextArrival_ = seq + 1;
      windows_.revokeReceivesBefore(nextArrival_);
      return;
    }
    arrivedForFailedRecv(it->second.seq);  // failed receives before it will see nothing more
    nextArrival_ = it->second.seq + 1;
    windows_.revokeReceivesBefore(nextArrival_);  // the data is in place: the peer may write there no more
    const PendingRecv r = it->second;
    recvs_.erase(it);
    // Its size is the one the send announced before its write (kRequestToSend), which the sender checked against
    // the buffer; the grant kept the write inside the buffer whatever it was.
    if (r.sent == 0 || r.sent > r.bytes)
      return failAll(ErrorCode::kProtocol, "the data of send #" + std::to_string(r.seq) + " arrived " +
                                               (r.sent ? "announced as " + std::to_string(r.sent) + " bytes, larger "
                                                       : std::string("unannounced, ")) +
                                               "for a receive of " + std::to_string(r.bytes) + " bytes");
    r.t->finishPart(r.index, r.sent);
    return;
  }
  ControlMsg m;
  std::string bad = decode(e.msg, &m);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, "the peer sent " + bad);
  handleMessage(m);
}

void Connection::failAll(ErrorCode code, const std::string& why) {
  std::function<void()> onFailure;
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    if (failure_.empty()) failure_ = why;
    failed_ = true;
    onFailure.swap(onFailure_);  // once
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
  eagerSends_.clear();
  eagerOrder_.clear();
  eagerCookies_.clear();
  early_.clear();
  rts_.clear();
  failedRecvs_.clear();
  failedAhead_.clear();
  if (onFailure) onFailure();
}

void Connection::sweep(uint64_t now) {
  if (now < nextSweepNs_) return;
  nextSweepNs_ = now + kSweepEveryNs;
  bool timedOut = false;
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [&](const std::shared_ptr<Transfer>& t) {
                               if (t->finished()) return true;
                               if (now < t->deadlineNs()) return false;
                               timedOut = true;
                               const std::string waiting = t->waiting();
                               t->fail(ErrorCode::kTimeout, "not done within GDX_TIMEOUT_MS (" +
                                                                std::to_string(timeoutNs_ / 1000000) + " ms)" +
                                                                (waiting.empty() ? "" : "; waiting for " + waiting));
                               return true;
                             }),
              live_.end());
  if (timedOut) {
    abandonFailedRecvs();   // receives among them take nothing that still comes
    withdrawFailedSends();  // and no receive of the peer takes the sends among them
  }
  // A peer that closed its end said goodbye (TCP), which the transport does not report as a failure (the Context's
  // ranks all say it at teardown): without this, what still waits for that peer would wait out its timeout. Over
  // verbs a clean close says nothing; it is seen when an operation to the peer fails.
  if (!failed_.load() && link_.transport->peerStatus(link_.peer()) == Status::kShutdown)
    failAll(ErrorCode::kPeerFailed, "the peer closed the connection");
}

Connection::Activity Connection::progress(bool arm) {
  if (!lane_) return Activity::kIdle;  // not started yet: start() is followed by the progress thread's first round
  std::unique_lock<std::mutex> lock(progressMutex_, std::try_to_lock);
  if (!lock.owns_lock()) return Activity::kIdle;  // the holder runs whatever was queued before it lets go (pending_)
  return progressHolding(lock, arm, false);
}

Connection::Activity Connection::progressHolding(std::unique_lock<std::mutex>& lock, bool arm, bool worked) {
  bool ran = false;
  while (pending_.exchange(false)) {
    worked |= round();
    ran = true;
  }
  // Completions are polled, not announced: one more round polls them even when nothing was queued, and after rounds
  // that left writes in flight (those above ran the rest: credits owed, deadlines).
  if (!ran || lane_->inFlight() > 0) worked |= round();
  Activity activity = worked ? Activity::kWorked : Activity::kIdle;
  if (!worked && lane_->inFlight() > 0) {
    // Completions are due. Polling for them in every idle thread starves whatever produces them (on a host with few
    // cores, or Soft-RoCE, whose work is done by the same CPUs): where the transport can announce them, it does, and
    // one more round takes those that came before it was armed.
    if (arm && lane_->armCompletion())
      activity = round() ? Activity::kWorked : Activity::kIdle;
    else
      activity = Activity::kPolling;
  }
  lock.unlock();
  notifyOtherDrivers();
  return activity;
}

void Connection::drive(const Transfer& t, uint64_t deadlineNs) {
  Driving self(*this);
  uint64_t spins = 0;
  uint64_t activeNs = nowNs();
  uint64_t roundNs = 0;  // when this thread last ran a round
  while (!t.finished()) {
    // Poll for kDriveSpinNs after the last work done (a reply or completion soon after is caught without a
    // wake-up), then have completions announced and sleep until something arrives.
    const uint64_t before = nowNs();
    const bool spin = before - activeNs < kDriveSpinNs;
    // While polling, a round runs only when it can find something: work queued or handed over by the transport
    // (pending_), completions to poll, or the turn of a quiet round (credits owed, deadlines). A round takes locks
    // the transport's threads need to hand over what arrives, and on a host with few cores the time it takes is
    // theirs: looking at two atomics instead leaves them the CPU and the locks, and yields sooner (spinPause).
    if (spin && !pending_.load() && (!lane_ || lane_->inFlight() == 0) && before - roundNs < kQuietRoundNs) {
      spinPause(++spins);
      continue;
    }
    roundNs = before;
    const Activity activity = progress(!spin);
    if (t.finished()) break;
    const uint64_t now = nowNs();
    if (now >= deadlineNs) break;
    if (activity == Activity::kWorked) activeNs = now;
    if (spin || activity != Activity::kIdle) {
      spinPause(++spins);
      continue;
    }
    std::unique_lock<std::mutex> lock(opsMutex_);
    driverCv_.wait_for(lock, std::chrono::nanoseconds(std::min(kDriveSleepNs, deadlineNs - now)),
                       [&] { return pending_.load() || t.finished(); });
    spins = 0;
  }
  // ~Driving hands whatever is still in flight (other transfers' completions) back to the progress thread.
}

bool Connection::round() {
  // Emptied here too, not only below: a handler that threw out of the last round left its events behind.
  roundOps_.clear();
  roundEvents_.clear();
  {
    std::lock_guard<std::mutex> lock(opsMutex_);
    roundOps_.swap(ops_);
    roundEvents_.swap(inbox_);
  }
  const std::string failed = failure();
  for (const Event& e : roundEvents_) handle(e);
  for (auto& op : roundOps_) runOperation(op, failed);
  Completion done[kMaxCompletions];
  size_t n = lane_->poll(done, kMaxCompletions);
  for (size_t i = 0; i < n; ++i) handleCompletion(done[i]);
  const uint64_t now = nowNs();  // one clock read for the credits' age and the deadlines
  if (creditsFreed_ > 0 && failed.empty() && now - creditsOwedSinceNs_ >= kCreditDelayNs) flushCredits();
  sweep(now);
  const bool worked = n > 0 || !roundOps_.empty() || !roundEvents_.empty();
  roundOps_.clear();
  roundEvents_.clear();
  return worked;
}

void Connection::handleCompletion(const Completion& c) {
  if (c.cookie == 0) return;
  if (!readingCookies_.empty()) doneReading(c.cookie);
  auto eager = eagerCookies_.find(c.cookie);
  if (eager != eagerCookies_.end()) {
    auto it = eagerSends_.find(eager->second);
    eagerCookies_.erase(eager);
    if (it == eagerSends_.end()) return;  // failed already (its clear-to-send named another size)
    if (c.status != Status::kOk) {
      it->second.t->fail(errorCodeFor(c.status), std::string("the transport failed the eager write: ") +
                                                     statusName(c.status) + " (" + failure() + ")");
    } else {
      it->second.written = true;
      if (!it->second.matched) return;
      it->second.t->finishPart();
    }
    eagerSends_.erase(it);
    return;
  }
  auto it = cookies_.find(c.cookie);
  if (it == cookies_.end()) return;
  if (c.status == Status::kOk)
    it->second.t->finishPart();
  else
    it->second.t->fail(errorCodeFor(c.status),
                       std::string("the transport failed the write: ") + statusName(c.status) + " (" + failure() + ")");
  cookies_.erase(it);
}

}  // namespace gdx::p2p
