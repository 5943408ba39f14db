#include "proxy/proxy.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <sstream>

#include "base/log.hpp"
#include "base/timer_slack.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/signal_imm.hpp"
#include "gdx/error.hpp"
#include "proxy/completion_tracker.hpp"
#include "proxy/trace.hpp"
#include "proxy/write_merger.hpp"

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
  std::atomic<uint64_t> commands{0}, bytes{0}, errors{0}, batches{0}, writes{0};
  std::atomic<uint64_t> handlingNs{0}, inFlightNs{0};  // Options::timing only
  uint64_t inFlightSince = 0;                          // this thread's: when its lane last went from idle to busy
  Command batch[kBatch];
  Completion done[kBatch];
  std::unique_ptr<TraceBuffer> trace;  // GDX_TRACE only
};

namespace {
// The trace events of a command (pick-up or rejection), of an operation posted and of a completion reaped.
TraceEvent commandEvent(TraceKind kind, size_t ring, const Command& c, uint64_t position) {
  TraceEvent e;
  e.ns = nowNs();
  e.kind = kind;
  e.opcode = static_cast<uint8_t>(c.opcode());
  e.ring = static_cast<uint16_t>(ring);
  e.peer = static_cast<int32_t>(c.peer());
  e.window = c.dstWindow();
  e.offset = c.dstOffset();
  e.bytes = c.size();
  e.position = position;
  return e;
}
TraceEvent postEvent(size_t ring, int peer, uint32_t window, uint64_t offset, uint64_t bytes, uint64_t cookie) {
  TraceEvent e;
  e.ns = nowNs();
  e.kind = TraceKind::kPost;
  e.opcode = 0xff;
  e.ring = static_cast<uint16_t>(ring);
  e.peer = peer;
  e.window = window;
  e.offset = offset;
  e.bytes = bytes;
  e.position = cookie;
  return e;
}
TraceEvent completionEvent(size_t ring, const Completion& c) {
  TraceEvent e;
  e.ns = nowNs();
  e.kind = TraceKind::kComplete;
  e.opcode = 0xff;
  e.ring = static_cast<uint16_t>(ring);
  e.peer = c.peer;
  e.status = static_cast<uint32_t>(c.status);
  e.position = c.cookie;
  return e;
}
}  // namespace

// The operations of one drained batch. They all carry the cookie of the batch's completion-tracker entry, which
// is opened after the batch with the number of operations the lane took: an operation the lane refused (it threw)
// is never counted, so flush() does not wait for it. Completions are reaped by the same thread after the batch,
// so none is counted before its entry exists.
class Proxy::Posting {
 public:
  Posting(Thread& t, size_t ring) : t_(t), ring_(ring), seq_(t.trackers[ring].nextSeq()) {}
  void write(WriteOp w) {
    w.cookie = cookie();
    t_.lane->post(w);
    if (t_.trace) t_.trace->record(postEvent(ring_, w.peer, w.remoteWindow, w.remoteOffset, w.bytes, w.cookie));
    ++posted_;
    ++writes_;
    bytes_ += w.bytes;
  }
  void atomic(AtomicOp a) {
    a.cookie = cookie();
    t_.lane->postAtomic(a);
    if (t_.trace) t_.trace->record(postEvent(ring_, a.peer, a.remoteWindow, a.remoteOffset, 8, a.cookie));
    ++posted_;
  }
  void message(MessageOp m) {
    m.cookie = cookie();
    t_.lane->postMessage(m);
    if (t_.trace) t_.trace->record(postEvent(ring_, m.peer, 0, 0, m.bytes, m.cookie));
    ++posted_;
  }
  /// Opens the batch's entry: positions up to `endPos` are done once the posted operations complete.
  void close(uint64_t endPos) {
    t_.trackers[ring_].open(endPos, posted_);
    t_.bytes.fetch_add(bytes_, std::memory_order_relaxed);
    t_.writes.fetch_add(writes_, std::memory_order_relaxed);
  }

 private:
  uint64_t cookie() const { return (static_cast<uint64_t>(ring_) << kCookieRingShift) | seq_; }
  Thread& t_;
  size_t ring_;
  uint64_t seq_;
  uint32_t posted_ = 0;
  uint32_t writes_ = 0;
  uint64_t bytes_ = 0;
};

ProxyOptions ProxyOptions::fromEnv() {
  ProxyOptions o;
  // envInt holds each value to its bounds in the configuration table (gdx/config.hpp), so the casts keep them whole.
  o.threads = static_cast<int>(envInt("GDX_PROXY_THREADS", o.threads));
  o.ringsPerThread = static_cast<int>(envInt("GDX_RINGS_PER_THREAD", o.ringsPerThread));
  o.deviceRingsPerThread = static_cast<int>(envInt("GDX_DEVICE_RINGS_PER_THREAD", -1));
  o.ringCapacity = static_cast<uint64_t>(envInt("GDX_RING_SIZE", static_cast<int64_t>(o.ringCapacity)));
  o.maxInFlight = static_cast<size_t>(envInt("GDX_PROXY_MAX_INFLIGHT", static_cast<int64_t>(o.maxInFlight)));
  o.timeoutNs = defaultTimeoutNs();
  o.trace = envString("GDX_TRACE", "");
  o.traceEvents = static_cast<size_t>(envInt("GDX_TRACE_EVENTS", static_cast<int64_t>(o.traceEvents)));
  o.timing = envBool("GDX_PROXY_TIMING", false);
  o.validate();
  return o;
}

void ProxyOptions::validate() const {
  // The same bounds as the variables' (base/config.cpp), for options set in code.
  auto check = [](const char* var, int64_t value, int64_t lo, int64_t hi) {
    if (value < lo || value > hi)
      throw Error(ErrorCode::kInvalidArgument, std::string(var) + "=" + std::to_string(value) +
                                                   " is out of range; allowed: [" + std::to_string(lo) + ", " +
                                                   std::to_string(hi) + "]");
  };
  check("GDX_PROXY_THREADS", threads, 1, envVar("GDX_PROXY_THREADS").max);
  check("GDX_RINGS_PER_THREAD", ringsPerThread, 0, envVar("GDX_RINGS_PER_THREAD").max);
  check("GDX_DEVICE_RINGS_PER_THREAD", deviceRingsPerThread, -1, envVar("GDX_DEVICE_RINGS_PER_THREAD").max);
  check("GDX_PROXY_MAX_INFLIGHT", static_cast<int64_t>(std::min<size_t>(maxInFlight, INT64_MAX)), 1,
        envVar("GDX_PROXY_MAX_INFLIGHT").max);
  check("GDX_TRACE_EVENTS", static_cast<int64_t>(std::min<size_t>(traceEvents, INT64_MAX)), 1,
        envVar("GDX_TRACE_EVENTS").max);
  const int64_t maxRing = envVar("GDX_RING_SIZE").max;
  if (ringCapacity < 2 || ringCapacity > static_cast<uint64_t>(maxRing) || (ringCapacity & (ringCapacity - 1)) != 0)
    throw Error(ErrorCode::kInvalidArgument, "GDX_RING_SIZE=" + std::to_string(ringCapacity) +
                                                 " is not a power of two in [2, " + std::to_string(maxRing) + "]");
  if (timeoutNs == 0) throw Error(ErrorCode::kInvalidArgument, "the proxy's timeout (GDX_TIMEOUT_MS) must be positive");
  // Rings are pinned host memory: more than the machine has can never be allocated, and finding that out after the
  // rendezvous would leave the other ranks waiting. Whether the memory is free is only known when it is allocated.
  const uint64_t rings = static_cast<uint64_t>(threads) * (ringsPerThread + std::max(deviceRingsPerThread, 1));
  const uint64_t bytes = rings * ringCapacity * sizeof(Command);
  const long pages = sysconf(_SC_PHYS_PAGES), pageBytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && pageBytes > 0 && bytes > static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageBytes))
    throw Error(ErrorCode::kInvalidArgument, "GDX_RING_SIZE=" + std::to_string(ringCapacity) + ": " +
                                                 std::to_string(rings) + " rings (" + std::to_string(threads) +
                                                 " GDX_PROXY_THREADS) of 16-byte slots need " + std::to_string(bytes) +
                                                 " bytes, more than this machine's memory");
}

Proxy::Proxy(const Options& options, Transport* transport, const WindowRegistry& registry, const RelayRequests* relay)
    : options_(options),
      transport_(transport),
      registry_(registry),
      relay_(relay),
      tracePath_(gdx::tracePath(options.trace, registry.rank())),
      peerErrors_(static_cast<size_t>(registry.worldSize())) {
  checkTraceWritable(tracePath_);
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
      try {
        rings_.push_back(std::make_unique<CommandRing>(
            CommandRing::Options{options_.ringCapacity, options_.placement.numaNode, options_.timeoutNs, device,
                                 static_cast<uint32_t>(registry_.worldSize())}));
      } catch (const Error& e) {
        // Out of (pinned, NUMA-local) memory, most likely: say which setting asked for it.
        throw Error(e.code(), "GDX_RING_SIZE=" + std::to_string(options_.ringCapacity) + ": ring " +
                                  std::to_string(rings_.size()) + " (" +
                                  std::to_string(options_.ringCapacity * sizeof(Command)) + " bytes on NUMA node " +
                                  std::to_string(options_.placement.numaNode) + ") could not be created: " + e.what());
      }
    }
    if (!options_.trace.empty()) th->trace = std::make_unique<TraceBuffer>(options_.traceEvents);
    th->trackers.resize(th->ringIds.size());
    th->published.assign(th->ringIds.size(), 0);
    threads_.push_back(std::move(th));
  }
  // Ring i of each kind is served by thread i % threads: a kernel that spreads its warps over the rings
  // (warp % numDeviceRings()) keeps every proxy thread busy even when it has fewer warps than rings.
  auto interleave = [&](std::vector<int>& ids, int perThread) {
    std::vector<int> byIndex;
    for (int r = 0; r < perThread; ++r)
      for (int t = 0; t < options_.threads; ++t) byIndex.push_back(ids[static_cast<size_t>(t) * perThread + r]);
    ids = byIndex;
  };
  interleave(hostRings_, options_.ringsPerThread);
  interleave(deviceRings_, std::max(options_.deviceRingsPerThread, 0));
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
                     << std::max(options_.deviceRingsPerThread, 0) << " device ring(s) of " << options_.ringCapacity
                     << " slots on NUMA node " << options_.placement.numaNode << " (" << options_.placement.reason
                     << "), transport " << (transport_ ? transport_->name() : "null"));
  for (auto& t : threads_) t->thread = std::thread([this, th = t.get()] { run(*th); });
}

void Proxy::stop() {
  if (!started_ || stopping_.exchange(true)) return;
  for (auto& t : threads_)
    if (t->thread.joinable()) t->thread.join();
  // Producers still waiting for space or completions learn that nobody will serve them.
  for (auto& r : rings_) r->setError(Status::kShutdown);
  writeTrace();
}

std::vector<const TraceBuffer*> Proxy::traceBuffers() const {
  std::vector<const TraceBuffer*> buffers;
  for (const auto& t : threads_) buffers.push_back(t->trace.get());
  return buffers;
}

void Proxy::writeTrace() const {
  if (tracePath_.empty()) return;
  try {
    writeChromeTrace(tracePath_, registry_.rank(), traceBuffers());
    GDX_INFO("proxy trace written to " << tracePath_);
  } catch (const std::exception& e) {
    GDX_ERROR(e.what());
  }
}

std::string Proxy::recentTrace(size_t perPeer) const {
  if (tracePath_.empty()) return {};
  return recentByPeer(traceBuffers(), perPeer);
}

void Proxy::recordError(const std::string& message) {
  GDX_ERROR(message);
  std::lock_guard<std::mutex> lock(errorMutex_);
  if (firstError_.empty()) firstError_ = message;
}

void Proxy::recordError(uint32_t peer, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(errorMutex_);
    if (firstError_.empty()) firstError_ = message;
    if (peer < peerErrors_.size()) {
      PeerErrors& e = peerErrors_[peer];
      // Every operation to a dead peer fails the same way: the log says it once, not once per operation.
      if (e.latest == message) return;
      if (e.first.empty()) e.first = message;
      e.latest = message;
    }
  }
  GDX_ERROR(message);
}

std::string Proxy::peerError(int peer) const {
  std::lock_guard<std::mutex> lock(errorMutex_);
  if (peer < 0 || static_cast<size_t>(peer) >= peerErrors_.size()) return {};
  const PeerErrors& e = peerErrors_[peer];
  if (e.latest == e.first) return e.latest;
  return e.latest + " (first error to peer " + std::to_string(peer) + ": " + e.first + ")";
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
  ProxyCounters c;
  c.commands = t.commands.load(std::memory_order_relaxed);
  c.bytes = t.bytes.load(std::memory_order_relaxed);
  c.errors = t.errors.load(std::memory_order_relaxed);
  c.batches = t.batches.load(std::memory_order_relaxed);
  c.writes = t.writes.load(std::memory_order_relaxed);
  c.handlingNs = t.handlingNs.load(std::memory_order_relaxed);
  c.inFlightNs = t.inFlightNs.load(std::memory_order_relaxed);
  c.inFlight = t.lane ? t.lane->inFlight() : 0;
  return c;
}

ProxyCounters Proxy::totalCounters() const {
  ProxyCounters sum;
  for (int t = 0; t < numThreads(); ++t) {
    ProxyCounters c = counters(t);
    sum.commands += c.commands;
    sum.bytes += c.bytes;
    sum.errors += c.errors;
    sum.batches += c.batches;
    sum.writes += c.writes;
    sum.handlingNs += c.handlingNs;
    sum.inFlightNs += c.inFlightNs;
    sum.inFlight += c.inFlight;
  }
  return sum;
}

namespace {

bool isSignal(const Command& c) {
  return c.opcode() == Opcode::kSignalSet || c.opcode() == Opcode::kSignalAdd;
}

// The write of a put (or of the first slot of a putWithSignal or relayPut); the caller adds the immediate.
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

// The remote atomic on the peer's signal word that a signal command (or slot) stands for.
AtomicOp signalAtomicOf(const Command& s) {
  AtomicOp a;
  a.peer = static_cast<int>(s.peer());
  a.remoteWindow = kSignalWindowId;
  a.remoteOffset = uint64_t{s.signalId()} * 8;
  a.kind = s.signalOp();
  a.value = s.value();
  return a;
}

std::string describe(const Command& c) {
  std::ostringstream os;
  os << opcodeName(c.opcode()) << " to peer " << c.peer();
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
    case Opcode::kRelayPut:
      os << " (src window " << c.srcWindow() << " offset " << c.srcOffset() << ", dst window " << c.dstWindow()
         << " offset " << c.dstOffset() << ", " << c.size() << " bytes)";
      break;
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd: os << " (signal " << c.signalId() << ", value " << c.value() << ")"; break;
    case Opcode::kAtomicAdd:
      os << " (window " << c.dstWindow() << " offset " << c.dstOffset() << ", addend " << c.value() << ")";
      break;
    default: os << " (words 0x" << std::hex << c.word[0] << " 0x" << c.word[1] << ")";
  }
  return os.str();
}

}  // namespace

// The common commands' checks without building a message: puts and putWithSignals that are not relayed, signals.
// False sends the command through checkCommand, which says what is wrong (or finds it valid after all).
bool Proxy::plainlyValid(const Command& c, const Command* second) const {
  const int peer = static_cast<int>(c.peer());
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
      if (c.size() == 0 || !registry_.fitsLocal(c.srcWindow(), c.srcOffset(), c.size()) ||
          !registry_.fitsRemote(peer, c.dstWindow(), c.dstOffset(), c.size()))
        return false;
      if (!second) return c.opcode() == Opcode::kPut;
      return isSignal(*second) && second->peer() == c.peer() && second->forwardTo() < 0 &&
             registry_.fitsRemote(peer, kSignalWindowId, uint64_t{second->signalId()} * 8, 8);
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      return c.forwardTo() < 0 && registry_.fitsRemote(peer, kSignalWindowId, uint64_t{c.signalId()} * 8, 8);
    default: return false;
  }
}

// Checks one command (and its second slot) against the registry; empty when valid.
std::string Proxy::checkCommand(const Command& c, const Command* second) const {
  const int peer = static_cast<int>(c.peer());
  auto relayed = [&](const Command& slot) -> std::string {
    return relay_ ? relay_->check(c, slot) : "a relayed command, but this proxy serves no relay";
  };
  switch (c.opcode()) {
    case Opcode::kPut:
    case Opcode::kPutWithSignal:
    case Opcode::kRelayPut: {
      if (c.size() == 0) return "zero-byte put";
      std::string why = registry_.checkLocal(c.srcWindow(), c.srcOffset(), c.size());
      if (why.empty()) why = registry_.checkRemote(peer, c.dstWindow(), c.dstOffset(), c.size());
      if (!why.empty() || !second) return why;
      if (second->peer() != c.peer())
        return describe(c) + " followed by a slot for peer " + std::to_string(second->peer());
      if (c.opcode() == Opcode::kRelayPut) {
        if (second->opcode() != Opcode::kRelayTo || second->forwardTo() < 0)
          return "relayPut not followed by its relayTo slot";
        return relayed(*second);
      }
      if (!isSignal(*second)) return "putWithSignal not followed by its signal slot";
      if (second->forwardTo() >= 0) return relayed(*second);
      return registry_.checkRemote(peer, kSignalWindowId, uint64_t{second->signalId()} * 8, 8);
    }
    case Opcode::kSignalSet:
    case Opcode::kSignalAdd:
      if (c.forwardTo() >= 0) return relayed(c);
      return registry_.checkRemote(peer, kSignalWindowId, uint64_t{c.signalId()} * 8, 8);
    case Opcode::kAtomicAdd:
      if (c.dstOffset() % 8 != 0) return "atomicAdd offset " + std::to_string(c.dstOffset()) + " is not 8-byte aligned";
      return registry_.checkRemote(peer, c.dstWindow(), c.dstOffset(), 8);
    case Opcode::kRelayTo: return "relayTo slot without its relayPut";
    default: return "unknown opcode " + std::to_string(static_cast<int>(c.opcode()));
  }
}

// A put: one write, merged with the puts around it when they continue each other (the caller posted what it does
// not continue; the merged write is posted once a command that does not continue it arrives, or at the end of the
// batch). A putWithSignal: its write (merged with the puts before it) with the immediate, or the write and then the
// signal as a remote atomic when the update does not fit the immediate.
void Proxy::postPut(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command& c,
                    const Command* signal, uint64_t lastPosition) {
  merger.add(writeOf(c), lastPosition);
  if (signal) postMerged(t, ring, p, merger, signal);
}

// Posts the pending write (with `signal`, the putWithSignal's signal slot that ends it). When the transport refuses
// it (a window deregistered after the registry's check), its puts fail, recorded as a fault of their peer at the
// last one's position, and the caller goes on with the command at hand, which is not theirs to fail.
void Proxy::postMerged(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command* signal) {
  if (!merger.pending()) return;
  const uint32_t merged = merger.count();
  const uint64_t last = merger.lastPosition();
  WriteOp w = merger.take();
  try {
    if (signal) w.withImm = encodeSignalImm(signal->signalOp(), signal->signalId(), signal->value(), &w.imm);
    p.write(w);
    if (signal && !w.withImm) p.atomic(signalAtomicOf(*signal));
  } catch (const std::exception& e) {
    t.errors.fetch_add(1, std::memory_order_relaxed);
    const uint32_t peer = static_cast<uint32_t>(w.peer);
    recordError(peer, "rank " + std::to_string(registry_.rank()) + " proxy thread " + std::to_string(t.index) +
                          ": posting a write of " + std::to_string(w.bytes) + " bytes to peer " + std::to_string(peer) +
                          " (window " + std::to_string(w.remoteWindow) + " offset " + std::to_string(w.remoteOffset) +
                          ", " + std::to_string(merged) + (merged == 1 ? " put" : " puts merged") +
                          (signal ? " and a signal" : "") + ", the last at ring position " + std::to_string(last) +
                          ") failed: " + e.what());
    ring.recordFault(peer, last, Status::kProxyError);
  }
}

// Relayed: the data goes to the relay (no immediate), then the forward request on the same lane, which the relay
// handles only once that data is in place.
void Proxy::postRelayed(Posting& p, const Command& c, const Command& second) {
  const bool withData = !isSignal(c);
  const MessageOp request = relay_->request(c, second);
  if (withData) p.write(writeOf(c));
  p.message(request);
}

// A signal or an atomicAdd: one remote atomic.
void Proxy::postAtomic(Posting& p, const Command& c) {
  AtomicOp a;
  if (c.opcode() == Opcode::kAtomicAdd) {
    a.peer = static_cast<int>(c.peer());
    a.remoteWindow = c.dstWindow();
    a.remoteOffset = c.dstOffset();
    a.kind = SignalOp::kAdd;
    a.value = c.value();
  } else {
    a = signalAtomicOf(c);
  }
  p.atomic(a);
}

void Proxy::run(Thread& t) {
  try {
    loop(t);
  } catch (const std::exception& e) {
    // Whatever went wrong, the rings this thread serves are dead: say so to every producer and waiter.
    failAll(Status::kProxyError, "rank " + std::to_string(registry_.rank()) + " proxy thread " +
                                     std::to_string(t.index) + " stopped: " + e.what());
  }
}

size_t Proxy::drainRing(Thread& t, size_t r) {
  CommandRing& ring = *rings_[t.ringIds[r]];
  const size_t room = options_.maxInFlight - std::min(options_.maxInFlight, t.lane ? t.lane->inFlight() : 0);
  if (room < 2) return 0;
  const size_t n = ring.poll(t.batch, std::min(kBatch, room));
  if (n == 0) return 0;
  const uint64_t startNs = options_.timing ? nowNs() : 0;
  t.batches.fetch_add(1, std::memory_order_relaxed);
  t.commands.fetch_add(n, std::memory_order_relaxed);
  Posting posting(t, r);
  WriteMerger merger;
  // The transport refused what the registry allowed (a window deregistered meanwhile): that command fails, recorded
  // as a fault of its peer at `last`, its last position. (A refused put fails in postMerged(), with those merged with
  // it.)
  auto failed = [&](const Command& c, uint64_t last, const std::exception& e) {
    t.errors.fetch_add(1, std::memory_order_relaxed);
    recordError(c.peer(), "rank " + std::to_string(registry_.rank()) + " proxy thread " + std::to_string(t.index) +
                              ": posting " + describe(c) + " failed: " + e.what());
    ring.recordFault(c.peer(), last, Status::kProxyError);
  };
  for (size_t i = 0; i < n;) {
    const Command& c = t.batch[i];
    const size_t slots = static_cast<size_t>(slotsFor(c.opcode()));  // the ring hands out whole pairs only
    const Command* second = slots == 2 ? &t.batch[i + 1] : nullptr;
    const uint64_t position = ring.consumed() - n + i;
    i += slots;
    const std::string why = plainlyValid(c, second) ? std::string() : checkCommand(c, second);
    if (t.trace) t.trace->record(commandEvent(why.empty() ? TraceKind::kPickup : TraceKind::kReject, r, c, position));
    if (!why.empty()) {
      // This command fails alone: the ring and the other commands to the peer go on.
      t.errors.fetch_add(1, std::memory_order_relaxed);
      recordError(c.peer(), "rank " + std::to_string(registry_.rank()) + " proxy thread " + std::to_string(t.index) +
                                " ring " + std::to_string(t.ringIds[r]) + ": rejected " + describe(c) +
                                " at ring position " + std::to_string(position) + ": " + why);
      ring.recordFault(c.peer(), position + slots - 1, Status::kProxyError);
    }
    if (!t.lane) continue;  // null transport: valid commands complete at once
    try {
      const Command& signalSlot = second ? *second : c;
      const bool relayed = c.opcode() == Opcode::kRelayPut || ((second || isSignal(c)) && signalSlot.forwardTo() >= 0);
      if (why.empty() && !relayed && (c.opcode() == Opcode::kPut || c.opcode() == Opcode::kPutWithSignal)) {
        if (!merger.extends(writeOf(c))) postMerged(t, ring, posting, merger);
        postPut(t, ring, posting, merger, c, second, position + slots - 1);
        continue;
      }
      postMerged(t, ring, posting, merger);  // what came before goes first
      if (!why.empty()) continue;
      if (relayed)
        postRelayed(posting, c, signalSlot);
      else
        postAtomic(posting, c);
    } catch (const std::exception& e) {
      failed(c, position + slots - 1, e);
    }
  }
  if (t.lane) postMerged(t, ring, posting, merger);
  posting.close(ring.consumed());
  ring.publishTail();
  if (startNs) {
    const uint64_t endNs = nowNs();
    t.handlingNs.fetch_add(endNs - startNs, std::memory_order_relaxed);
    if (t.inFlightSince == 0 && t.lane && t.lane->inFlight() > 0) t.inFlightSince = endNs;
  }
  return n;
}

bool Proxy::reapCompletions(Thread& t, size_t* reaped) {
  const size_t m = t.lane ? t.lane->poll(t.done, kBatch) : 0;
  for (size_t i = 0; i < m; ++i) {
    const size_t r = t.done[i].cookie >> kCookieRingShift;
    if (r >= t.trackers.size()) continue;
    if (t.trace) t.trace->record(completionEvent(r, t.done[i]));
    if (t.done[i].status != Status::kOk) {
      // The operation belongs to a batch whose positions end at `last`: flushes of the peer's commands in it fail.
      const uint32_t peer = static_cast<uint32_t>(t.done[i].peer);
      const uint64_t last = t.trackers[r].endOf(t.done[i].cookie & kCookieSeqMask) - 1;
      t.errors.fetch_add(1, std::memory_order_relaxed);
      recordError(peer, "rank " + std::to_string(registry_.rank()) + ": operations to peer " + std::to_string(peer) +
                            " on ring " + std::to_string(t.ringIds[r]) + " completed with status '" +
                            statusName(t.done[i].status) + "'");
      rings_[t.ringIds[r]]->recordFault(peer, last, t.done[i].status);
    }
    t.trackers[r].complete(t.done[i].cookie & kCookieSeqMask);
  }
  bool allIdle = true;
  for (size_t r = 0; r < t.trackers.size(); ++r) {
    const uint64_t upTo = t.trackers[r].advance();
    if (upTo != t.published[r]) {
      t.published[r] = upTo;
      rings_[t.ringIds[r]]->publishCompleted(upTo);
    }
    allIdle = allIdle && t.trackers[r].idle();
  }
  *reaped = m;
  if (t.inFlightSince != 0 && t.lane->inFlight() == 0) {
    t.inFlightNs.fetch_add(nowNs() - t.inFlightSince, std::memory_order_relaxed);
    t.inFlightSince = 0;
  }
  return allIdle;
}

void Proxy::loop(Thread& t) {
  pinCurrentThread(options_.placement);
  Napper napper;  // its idle naps end on time (base/timer_slack.hpp)
  uint64_t idleSince = 0;
  uint64_t stopSeenAt = 0;
  for (;;) {
    const bool stopping = stopping_.load(std::memory_order_acquire);
    bool progress = false;
    if (!stopping)
      for (size_t r = 0; r < t.ringIds.size(); ++r) progress = drainRing(t, r) > 0 || progress;
    size_t reaped = 0;
    const bool allIdle = reapCompletions(t, &reaped);
    progress = progress || reaped > 0;

    if (stopping) {
      // Let operations in flight finish (their source buffers must outlive the transport's reads), bounded.
      const uint64_t now = nowNs();
      if (stopSeenAt == 0) stopSeenAt = now;
      if (allIdle || (t.lane && t.lane->inFlight() == 0)) break;
      if (now - stopSeenAt > options_.timeoutNs) {
        GDX_WARN("proxy thread " << t.index << " stopped with " << t.lane->inFlight() << " operations in flight");
        break;
      }
    }
    if (progress) {
      idleSince = 0;
    } else {
      const uint64_t now = nowNs();
      if (idleSince == 0) idleSince = now;
      if (now - idleSince > kIdleBeforeNapNs)
        napper.nap(std::chrono::microseconds(20));
      else if (now - idleSince > kIdleBeforeYieldNs)
        std::this_thread::yield();
      else
        cpuRelax();
    }
  }
}

}  // namespace gdx
