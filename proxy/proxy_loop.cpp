#include <algorithm>
#include <chrono>
#include <cstdint>

#include "base/log.hpp"
#include "base/timer_slack.hpp"
#include "gdx/device/impl/clock.hpp"
#include "proxy/proxy_thread.hpp"
#include "proxy/write_merger.hpp"

namespace gdx {
namespace {

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

// The trace events of a command (pick-up or rejection) and of a completion reaped.
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
  const size_t n = ring.poll(t.batch, std::min(Thread::kBatch, room));
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
  const size_t m = t.lane ? t.lane->poll(t.done, Thread::kBatch) : 0;
  for (size_t i = 0; i < m; ++i) {
    const size_t r = t.done[i].cookie >> Thread::kCookieRingShift;
    if (r >= t.trackers.size()) continue;
    if (t.trace) t.trace->record(completionEvent(r, t.done[i]));
    if (t.done[i].status != Status::kOk) {
      // The operation belongs to a batch whose positions end at `last`: flushes of the peer's commands in it fail.
      const uint32_t peer = static_cast<uint32_t>(t.done[i].peer);
      const uint64_t last = t.trackers[r].endOf(t.done[i].cookie & Thread::kCookieSeqMask) - 1;
      t.errors.fetch_add(1, std::memory_order_relaxed);
      recordError(peer, "rank " + std::to_string(registry_.rank()) + ": operations to peer " + std::to_string(peer) +
                            " on ring " + std::to_string(t.ringIds[r]) + " completed with status '" +
                            statusName(t.done[i].status) + "'");
      rings_[t.ringIds[r]]->recordFault(peer, last, t.done[i].status);
    }
    t.trackers[r].complete(t.done[i].cookie & Thread::kCookieSeqMask);
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
