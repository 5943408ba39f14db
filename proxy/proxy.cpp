#include "gdx/proxy.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "gdx/clock.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "gdx/log.hpp"
#include "gdx/signal_imm.hpp"
#include "core/forward_request.hpp"
#include "proxy/completion_tracker.hpp"

namespace gdx {
namespace {
constexpr int kCookieRingShift = 56;
constexpr uint64_t kCookieSeqMask = (uint64_t{1} << kCookieRingShift) - 1;
constexpr size_t kBatch = 256;
// After this long without work a proxy thread naps between polls, so idle processes leave the cores to
// others; a steady stream of commands never lets it get there.
constexpr uint64_t kIdleBeforeNapNs = 200 * 1000;
// Before that, it spins without a system call for a while: a command that arrives meanwhile is seen within
// a few hundred nanoseconds, which the GPU round-trip latency depends on.
constexpr uint64_t kIdleBeforeYieldNs = 20 * 1000;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

struct Proxy::Thread {
  int index = 0;
  std::vector<int> ringIds;  // global ring indexes owned by this thread
  std::vector<CompletionTracker> trackers;
  std::vector<uint64_t> published;
  TransportLane* lane = nullptr;
  std::thread thread;
  std::atomic<uint64_t> commands{0}, bytes{0}, errors{0}, batches{0};
};

Proxy::Options Proxy::Options::fromEnv() {
  Options o;
  o.threads = static_cast<int>(envInt("GDX_PROXY_THREADS", o.threads));
  o.ringsPerThread = static_cast<int>(envInt("GDX_RINGS_PER_THREAD", o.ringsPerThread));
  o.deviceRingsPerThread = static_cast<int>(envInt("GDX_DEVICE_RINGS_PER_THREAD", -1));
  o.ringCapacity = static_cast<uint64_t>(envInt("GDX_RING_SIZE", static_cast<int64_t>(o.ringCapacity)));
  o.maxInFlight = static_cast<size_t>(envInt("GDX_PROXY_MAX_INFLIGHT", static_cast<int64_t>(o.maxInFlight)));
  o.timeoutNs = defaultTimeoutNs();
  if (o.threads < 1 || o.ringsPerThread < 0 || o.ringsPerThread > 127 || o.deviceRingsPerThread > 127 ||
      o.maxInFlight < 1)
    throw Error(ErrorCode::kInvalidArgument,
                "GDX_PROXY_THREADS and GDX_PROXY_MAX_INFLIGHT must be positive, GDX_RINGS_PER_THREAD and "
                "GDX_DEVICE_RINGS_PER_THREAD at most 127");
  return o;
}

Proxy::Proxy(const Options& options, Transport* transport, const WindowRegistry& registry)
    : options_(options), transport_(transport), registry_(registry) {
  if (options_.timeoutNs == 0) options_.timeoutNs = defaultTimeoutNs();
  if (transport_ && transport_->numLanes() < options_.threads)
    throw Error(ErrorCode::kInvalidArgument, "the transport has " + std::to_string(transport_->numLanes()) +
                                                 " lanes for " + std::to_string(options_.threads) + " proxy threads");
  for (int t = 0; t < options_.threads; ++t) {
    auto th = std::make_unique<Thread>();
    th->index = t;
    th->lane = transport_ ? &transport_->lane(t) : nullptr;
    const int deviceRings = std::max(options_.deviceRingsPerThread, 0);
    for (int r = 0; r < options_.ringsPerThread + deviceRings; ++r) {
      bool device = r >= options_.ringsPerThread;
      (device ? deviceRings_ : hostRings_).push_back(static_cast<int>(rings_.size()));
      th->ringIds.push_back(static_cast<int>(rings_.size()));
      rings_.push_back(std::make_unique<CommandRing>(CommandRing::Options{
          options_.ringCapacity, options_.placement.numaNode, options_.timeoutNs, device}));
    }
    th->trackers.resize(th->ringIds.size());
    th->published.assign(th->ringIds.size(), 0);
    threads_.push_back(std::move(th));
  }
}

Proxy::~Proxy() {
  try {
    stop();
  } catch (const std::exception& e) {
    GDX_ERROR("stopping the proxy: " << e.what());
  }
}

void Proxy::start() {
  if (started_) return;
  started_ = true;
  GDX_INFO("proxy: " << options_.threads << " thread(s) x " << options_.ringsPerThread << " host + "
                     << std::max(options_.deviceRingsPerThread, 0) << " device ring(s) of "
                     << options_.ringCapacity << " slots on NUMA node " << options_.placement.numaNode << " ("
                     << options_.placement.reason << "), transport " << (transport_ ? transport_->name() : "null"));
  for (auto& t : threads_) t->thread = std::thread([this, th = t.get()] { run(*th); });
}

void Proxy::stop() {
  if (!started_ || stopping_.exchange(true)) return;
  for (auto& t : threads_)
    if (t->thread.joinable()) t->thread.join();
  // Producers still waiting for space or completions learn that nobody will serve them.
  for (auto& r : rings_) r->setError(Status::kShutdown);
}

void Proxy::recordError(const std::string& message) {
  GDX_ERROR(message);
  std::lock_guard<std::mutex> lock(errorMutex_);
  if (firstError_.empty()) firstError_ = message;
}

void Proxy::failAll(Status status, const std::string& why) {
  recordError(why);
  for (auto& r : rings_) r->setError(status);
}

std::string Proxy::lastError() const {
  std::lock_guard<std::mutex> lock(errorMutex_);
  return firstError_;
}

ProxyCounters Proxy::counters(int thread) const {
  const Thread& t = *threads_.at(thread);
  return ProxyCounters{t.commands.load(std::memory_order_relaxed), t.bytes.load(std::memory_order_relaxed),
                       t.errors.load(std::memory_order_relaxed), t.batches.load(std::memory_order_relaxed)};
}

ProxyCounters Proxy::totalCounters() const {
  ProxyCounters sum;
  for (int t = 0; t < numThreads(); ++t) {
    ProxyCounters c = counters(t);
    sum.commands += c.commands;
    sum.bytes += c.bytes;
    sum.errors += c.errors;
    sum.batches += c.batches;
  }
  return sum;
}

namespace {

// The signal slot of a command: the command itself for a signal, its second slot for a putWithSignal.
const Command* signalSlot(const Command& c, const Command* pairSignal) {
  if (c.opcode() == Opcode::kSignalSet || c.opcode() == Opcode::kSignalAdd) return &c;
  return pairSignal;
}

// A forwarded operation: the relay (the command's peer) gets the data, the destination the data and the signal.
std::string checkForward(const WindowRegistry& reg, const Command& c, const Command& signal, int destination) {
  const int relay = static_cast<int>(c.peer());
  if (destination == relay) return "forwarding to the relay itself";
  std::string why = reg.checkRemote(destination, kSignalWindowId, uint64_t{signal.signalId()} * 8, 8);
  if (why.empty() && c.opcode() == Opcode::kPutWithSignal)
    why = reg.checkRemote(destination, c.dstWindow(), c.dstOffset(), c.size());
  return why.empty() ? why : "forwarding to rank " + std::to_string(destination) + ": " + why;
}

// Checks one command (and the signal slot of a putWithSignal) against the registry; empty when valid.
std::string checkCommand(const WindowRegistry& reg, const Command& c, const Command* signal) {
  int peer = static_cast<int>(c.peer());
  std::string why;
  const Command* slot = signalSlot(c, signal);
  const int forward = slot ? slot->forwardTo() : -1;
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
      if (c.size() == 0) return "zero-byte put";
      why = reg.checkLocal(c.srcWindow(), c.srcOffset(), c.size());
      if (why.empty()) why = reg.checkRemote(peer, c.dstWindow(), c.dstOffset(), c.size());
      if (why.empty() && signal) {
        if ((signal->opcode() != Opcode::kSignalSet && signal->opcode() != Opcode::kSignalAdd) ||
            signal->peer() != c.peer())
          return "putWithSignal not followed by its signal slot";
        why = forward >= 0 ? checkForward(reg, c, *signal, forward)
                           : reg.checkRemote(peer, kSignalWindowId, uint64_t{signal->signalId()} * 8, 8);
      }
      return why;
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      if (forward >= 0) return checkForward(reg, c, c, forward);
      return reg.checkRemote(peer, kSignalWindowId, uint64_t{c.signalId()} * 8, 8);
    case Opcode::kAtomicAdd:
      if (c.dstOffset() % 8 != 0) return "atomicAdd offset " + std::to_string(c.dstOffset()) + " is not 8-byte aligned";
      return reg.checkRemote(peer, c.dstWindow(), c.dstOffset(), 8);
    default:
      return "unknown opcode " + std::to_string(static_cast<int>(c.opcode()));
  }
}

// The write of a put (or of the first slot of a putWithSignal); the caller adds immediate and cookie.
WriteOp writeOf(const Command& c) {
  WriteOp w;
  w.peer = static_cast<int>(c.peer());
  w.localWindow = c.srcWindow();
  w.localOffset = c.srcOffset();
  w.remoteWindow = c.dstWindow();
  w.remoteOffset = c.dstOffset();
  w.bytes = c.size();
  return w;
}

// What the relay needs to forward a relayed putWithSignal (pair: the put's range too) or signal.
ForwardRequest forwardOf(const Command& c, const Command& slot, bool pair) {
  ForwardRequest f;
  f.destination = slot.forwardTo();
  f.signalId = slot.signalId();
  f.value = slot.value();
  const bool add = slot.opcode() == Opcode::kSignalAdd;
  f.signalOp = add && f.value == 0 ? ForwardRequest::kSignalNone  // a forwarded plain put
               : add               ? ForwardRequest::kSignalAdd
                                   : ForwardRequest::kSignalSet;
  if (pair) {
    f.window = c.dstWindow();
    f.offset = c.dstOffset();
    f.bytes = c.size();
  }
  return f;
}

std::string describe(const Command& c) {
  std::ostringstream os;
  os << opcodeName(c.opcode()) << " to peer " << c.peer();
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
      os << " (src window " << c.srcWindow() << " offset " << c.srcOffset() << ", dst window " << c.dstWindow()
         << " offset " << c.dstOffset() << ", " << c.size() << " bytes)";
      break;
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      os << " (signal " << c.signalId() << ", value " << c.value() << ")";
      break;
    case Opcode::kAtomicAdd:
      os << " (window " << c.dstWindow() << " offset " << c.dstOffset() << ", addend " << c.value() << ")";
      break;
    default:
      os << " (words 0x" << std::hex << c.word[0] << " 0x" << c.word[1] << ")";
  }
  return os.str();
}

}  // namespace

void Proxy::run(Thread& t) {
  try {
    loop(t);
  } catch (const std::exception& e) {
    // Whatever went wrong, the rings this thread serves are dead: say so to every producer and waiter.
    failAll(Status::kProxyError, "rank " + std::to_string(registry_.rank()) + " proxy thread " +
                                     std::to_string(t.index) + " stopped: " + e.what());
  }
}

void Proxy::loop(Thread& t) {
  pinCurrentThread(options_.placement);
  const int rank = registry_.rank();
  Command batch[kBatch];
  Completion done[kBatch];
  uint64_t idleSince = 0;
  const uint64_t drainDeadlineNs = options_.timeoutNs;
  uint64_t stopSeenAt = 0;

  for (;;) {
    bool stopping = stopping_.load(std::memory_order_acquire);
    bool progress = false;
    if (!stopping) {
      for (size_t r = 0; r < t.ringIds.size(); ++r) {
        CommandRing& ring = *rings_[t.ringIds[r]];
        CompletionTracker& tracker = t.trackers[r];
        size_t room = options_.maxInFlight - std::min(options_.maxInFlight, t.lane ? t.lane->inFlight() : 0);
        if (room < 2) break;
        size_t n = ring.poll(batch, std::min(kBatch, room));
        if (n == 0) continue;
        progress = true;
        t.batches.fetch_add(1, std::memory_order_relaxed);
        t.commands.fetch_add(n, std::memory_order_relaxed);
        uint64_t pos = ring.consumed() - n;
        for (size_t i = 0; i < n; ++i) {
          const Command& c = batch[i];
          bool pair = c.opcode() == Opcode::kPutWithSignal;
          const Command* signal = pair ? &batch[i + 1] : nullptr;
          uint64_t endPos = pos + (pair ? 2 : 1);
          std::string why = checkCommand(registry_, c, signal);
          if (!why.empty()) {
            t.errors.fetch_add(1, std::memory_order_relaxed);
            recordError("rank " + std::to_string(rank) + " proxy thread " + std::to_string(t.index) + " ring " +
                        std::to_string(t.ringIds[r]) + ": rejected " + describe(c) + ": " + why);
            ring.setError(Status::kProxyError);
            tracker.open(endPos, 0);
          } else if (!t.lane) {
            tracker.open(endPos, 0);  // null transport: valid commands complete at once
          } else {
            const int peer = static_cast<int>(c.peer());
            uint64_t cookieBase = static_cast<uint64_t>(r) << kCookieRingShift;
            uint64_t seq = 0;
            uint32_t unposted = 0;  // operations of the open entry that were not handed to the lane
            const Command* slot = signalSlot(c, signal);
            try {
              if (slot && slot->forwardTo() >= 0) {
                // Relay: the data goes to the relay (no immediate), then the forward request on the same lane,
                // which the relay handles only once that data is in place.
                const uint32_t ops = pair ? 2 : 1;
                seq = tracker.open(endPos, ops);
                unposted = ops;
                if (pair) {
                  WriteOp w = writeOf(c);
                  w.cookie = cookieBase | seq;
                  t.lane->post(w);
                  --unposted;
                  t.bytes.fetch_add(c.size(), std::memory_order_relaxed);
                }
                t.lane->postMessage(encodeForward(peer, forwardOf(c, *slot, pair), cookieBase | seq));
                --unposted;
              } else if (c.opcode() == Opcode::kPut || pair) {
                WriteOp w = writeOf(c);
                bool add = pair && signal->opcode() == Opcode::kSignalAdd;
                bool viaImm = pair && encodeSignalImm(add, signal->signalId(), signal->value(), &w.imm);
                w.withImm = viaImm;
                uint32_t ops = (pair && !viaImm) ? 2 : 1;
                seq = tracker.open(endPos, ops);
                unposted = ops;
                w.cookie = cookieBase | seq;
                t.lane->post(w);
                --unposted;
                t.bytes.fetch_add(c.size(), std::memory_order_relaxed);
                if (ops == 2) {
                  AtomicOp a;
                  a.peer = peer;
                  a.remoteWindow = kSignalWindowId;
                  a.remoteOffset = uint64_t{signal->signalId()} * 8;
                  a.kind = add ? AtomicKind::kAdd : AtomicKind::kSet;
                  a.value = signal->value();
                  a.cookie = cookieBase | seq;
                  t.lane->postAtomic(a);
                  --unposted;
                }
              } else {
                AtomicOp a;
                a.peer = peer;
                if (c.opcode() == Opcode::kAtomicAdd) {
                  a.remoteWindow = c.dstWindow();
                  a.remoteOffset = c.dstOffset();
                  a.kind = AtomicKind::kAdd;
                } else {
                  a.remoteWindow = kSignalWindowId;
                  a.remoteOffset = uint64_t{c.signalId()} * 8;
                  a.kind = c.opcode() == Opcode::kSignalAdd ? AtomicKind::kAdd : AtomicKind::kSet;
                }
                a.value = c.value();
                seq = tracker.open(endPos, 1);
                unposted = 1;
                a.cookie = cookieBase | seq;
                t.lane->postAtomic(a);
                --unposted;
              }
            } catch (const std::exception& e) {
              // The transport refused what the registry allowed (a window deregistered meanwhile): what was
              // not posted will never complete, so the entry must not wait for it.
              t.errors.fetch_add(1, std::memory_order_relaxed);
              recordError("rank " + std::to_string(rank) + " proxy thread " + std::to_string(t.index) +
                          ": posting " + describe(c) + " failed: " + e.what());
              ring.setError(Status::kProxyError);
              if (unposted > 0)
                tracker.cancel(seq, unposted);
              else
                tracker.open(endPos, 0);  // the entry itself was never opened
            }
          }
          if (pair) ++i;
          pos = endPos;
        }
        ring.publishTail();
      }
    }

    size_t m = t.lane ? t.lane->poll(done, kBatch) : 0;
    for (size_t i = 0; i < m; ++i) {
      size_t r = done[i].cookie >> kCookieRingShift;
      if (r >= t.trackers.size()) continue;
      if (done[i].status != Status::kOk) {
        t.errors.fetch_add(1, std::memory_order_relaxed);
        recordError("rank " + std::to_string(rank) + ": an operation to peer " + std::to_string(done[i].peer) +
                    " completed with status '" + statusName(done[i].status) + "'");
        rings_[t.ringIds[r]]->setError(done[i].status);
      }
      t.trackers[r].complete(done[i].cookie & kCookieSeqMask);
    }
    bool allIdle = true;
    for (size_t r = 0; r < t.trackers.size(); ++r) {
      uint64_t upTo = t.trackers[r].advance();
      if (upTo != t.published[r]) {
        t.published[r] = upTo;
        rings_[t.ringIds[r]]->publishCompleted(upTo);
      }
      allIdle = allIdle && t.trackers[r].idle();
    }
    if (m > 0) progress = true;

    if (stopping) {
      // Let operations in flight finish (their source buffers must outlive the transport's reads), bounded.
      uint64_t now = nowNs();
      if (stopSeenAt == 0) stopSeenAt = now;
      if (allIdle || (t.lane && t.lane->inFlight() == 0)) break;
      if (now - stopSeenAt > drainDeadlineNs) {
        GDX_WARN("proxy thread " << t.index << " stopped with " << t.lane->inFlight() << " operations in flight");
        break;
      }
    }
    if (progress) {
      idleSince = 0;
    } else {
      uint64_t now = nowNs();
      if (idleSince == 0) idleSince = now;
      if (now - idleSince > kIdleBeforeNapNs)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      else if (now - idleSince > kIdleBeforeYieldNs)
        std::this_thread::yield();
      else
        cpuRelax();
    }
  }
}

}  // namespace gdx
