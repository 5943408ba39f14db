// Connection, the driver (connection.hpp): the threads that run it (submit, queue, drive, progress rounds), what the
// transport hands over and where it goes, completions, deadlines and failure. What each kind of transfer does lives
// beside it: sends and receives in TwoSided (two_sided.hpp), carried out by connection_two_sided.cpp; one-sided
// writes and reads in OneSided (one_sided.hpp), carried out by connection_one_sided.cpp; region_readers.cpp; failure
// and teardown in connection_failure.cpp; the windows the peer may reach, in LocalWindows (local_windows.hpp), and the
// keys of both sides' windows, in WindowKeys (window_keys.hpp).
#include "p2p/connection.hpp"

#include <algorithm>
#include <chrono>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"

namespace gdx::p2p {
namespace {

constexpr size_t kMaxCompletions = 64;
/// Longest sleep of drive() between looks at the deadline (a wake-up can be missed only when a transfer is finished
/// by the progress thread between drive()'s look and its sleep; that costs at most this).
constexpr uint64_t kDriveSleepNs = 1000 * 1000;
/// While drive() polls and nothing was handed over, it still runs a round this often: credits owed for
/// TwoSided::kCreditDelayNs and deadlines are found by rounds, not announced.
constexpr uint64_t kQuietRoundNs = 20 * 1000;
/// How long a blocking call polls after the last work it did before it sleeps. Longer than Connection::kSpinNs (the
/// progress threads'): the caller waits for its peer's answer, a round trip plus the peer's own turnaround, which a
/// small message's blocking send does every time (its credit comes back with the reply); on a 2-vCPU host that is
/// 50-80 us, so 50 us of polling put the caller to sleep, and a futex wake-up on the reply's path, about every other
/// message. The caller has nothing else to do meanwhile, and spinPause() yields the CPU to whoever else is runnable.
constexpr uint64_t kDriveSpinNs = 200 * 1000;

}  // namespace

Connection::Connection(uint64_t id, PairLink link, uint64_t timeoutNs, std::function<void()> wake)
    : id_(id),
      link_(std::move(link)),
      timeoutNs_(timeoutNs),
      wake_(std::move(wake)),
      windows_(*link_.transport, name_),
      keys_(*link_.transport, link_.peer(), windows_, name_),
      twoSided_(windows_, keys_, link_.peer(), name_),
      oneSided_(windows_, keys_, link_.peer(), name_) {
  name_ = "connection " + std::to_string(id_) + " (peer " + link_.peerIp + ", GPU " + std::to_string(link_.peerGpu) +
          ", " + link_.detail + ")";
  sharedName_ = std::make_shared<const std::string>(name_);
}

Connection::~Connection() {
  try {
    // Sends this side took and has not confirmed yet are confirmed before the goodbye: their senders wait for it.
    if (lane_ && twoSided_.owesCredits() && failure().empty()) flushCredits();
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

void Connection::track(std::shared_ptr<Transfer> t) {
  live_.push_back(std::move(t));
}

// ---- operations (queued by callers, run by the progress thread) ------------------------------------------------

void Connection::send(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  submit([this, t, pieces = std::move(pieces)] { runSend(t, pieces); });
}

void Connection::recv(std::shared_ptr<Transfer> t, std::vector<Piece> pieces) {
  submit([this, t, pieces = std::move(pieces)] { runRecv(t, pieces); });
}

// ---- messages to the peer ------------------------------------------------------------------------------------

void Connection::postControl(const ControlMsg& m) {
  MessageOp op = encode(m, link_.peer());
  op.cookie = 0;  // internal: its completion is not a transfer's (a lost one fails the peer, which fails them all)
  lane_->postMessage(op);
}

void Connection::postControls(const std::vector<ControlMsg>& ms) {
  for (const ControlMsg& m : ms) postControl(m);
}

// ---- what arrives ---------------------------------------------------------------------------------------------

void Connection::handleMessage(const ControlMsg& m) {
  switch (m.type) {
    case MsgType::kKeyRequest: return postControls(keys_.answer(m));
    case MsgType::kKeyPart: return onKeyPart(m);
    case MsgType::kKeyRefused: return keys_.onKeyRefused(m.window);
    case MsgType::kClearToSend:
    case MsgType::kCredit:
    case MsgType::kRequestToSend:
    case MsgType::kReceiveRefused:
    case MsgType::kReceiveFailed:
    case MsgType::kSendWithdrawn:
    case MsgType::kWithdrawTooLate:
    case MsgType::kSendRefused: return decide<TwoSided>([&](TwoSided::Actions& out) { twoSided_.onMessage(m, out); });
    case MsgType::kFence:
    case MsgType::kFenceAck:
    case MsgType::kReadRequest:
    case MsgType::kReadDone: return decide<OneSided>([&](OneSided::Actions& out) { oneSided_.onMessage(m, out); });
  }
}

void Connection::handle(const Event& e) {
  if (e.kind == Event::kFailure) return failAll(ErrorCode::kPeerFailed, "the peer failed: " + e.why);
  if (e.kind == Event::kImm) {
    if (e.imm & kNotifyImm) {
      if (notify_) notify_();
      return;
    }
    return decide<TwoSided>([&](TwoSided::Actions& out) {
      if (e.imm & kEagerImm)
        twoSided_.onEagerData(e.imm, e.bytes, out);
      else
        twoSided_.onWriteArrived(e.imm, out);  // a large send's, into its receive's buffer
    });
  }
  ControlMsg m;
  std::string bad = decode(e.msg, &m);
  if (!bad.empty()) return failAll(ErrorCode::kProtocol, "the peer sent " + bad);
  handleMessage(m);
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
  if (failed.empty() && twoSided_.creditsOverdue(now)) flushCredits();
  sweep(now);
  const bool worked = n > 0 || !roundOps_.empty() || !roundEvents_.empty();
  roundOps_.clear();
  roundEvents_.clear();
  return worked;
}

void Connection::handleCompletion(const Completion& c) {
  if (c.cookie == 0) return;
  if (!readingCookies_.empty()) doneReading(c.cookie);
  if (TwoSided::owns(c.cookie))  // a send's write; the connection's failure names the cause of a failed one
    return twoSided_.onWriteDone(c, c.status == Status::kOk ? std::string() : failure());
  oneSided_.onWriteDone(c, c.status == Status::kOk ? std::string() : failure());
}

}  // namespace gdx::p2p
