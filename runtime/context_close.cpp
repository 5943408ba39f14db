// Before ~Context and before a Window is deregistered, the commands host threads already put into the rings are
// given the context's timeout to complete, and whatever did not is named in the log (how many, to which peer, of
// which kind), so that puts a caller forgot to flush are either delivered or reported, never dropped without a word.
// (Windows are usually destroyed before their Context; without the wait at deregistration the proxy would refuse
// the unflushed puts that name them.)
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include "gdx/context.hpp"
#include "gdx/detail/atomic.hpp"
#include "gdx/detail/clock.hpp"
#include "gdx/detail/log.hpp"

namespace gdx {
namespace {

// Positions [from, to) of a ring, counted per peer and kind. The slots are still intact: nobody produces into a
// ring of a context being destroyed, and the consumer never clears a slot.
std::string describeLost(const RingDeviceHandle& ring, uint64_t from, uint64_t to) {
  std::map<uint32_t, std::map<std::string, uint64_t>> perPeer;
  const uint64_t first = to - from > ring.capacity ? to - ring.capacity : from;
  for (uint64_t p = first; p < to; ++p) {
    const Command& c = ring.slots[p & (ring.capacity - 1)];
    ++perPeer[c.peer()][opcodeName(c.opcode())];
  }
  std::ostringstream os;
  const char* sep = "";
  for (const auto& [peer, kinds] : perPeer) {
    os << sep << "to peer " << peer << ":";
    sep = ";";
    for (const auto& [kind, n] : kinds) os << " " << n << " " << kind;
  }
  return os.str();
}

}  // namespace

// A failed command fails only the flush that covers it; the caller that never flushed hears of it here.
void Context::reportFaults(int ringIndex) const {
  const CommandRing& ring = proxy_->ring(ringIndex);
  for (int p = 0; p < worldSize(); ++p) {
    const RingFault f = ring.fault(static_cast<uint32_t>(p));
    if (f.lastFailed == 0) continue;
    std::string why = proxy_->peerError(p);
    const std::string peerFailed = failure(p);
    if (!peerFailed.empty() && peerFailed != why) why += (why.empty() ? "" : "; ") + peerFailed;
    GDX_ERROR("rank " << rank() << ": closing the context: commands to peer " << p << " on ring " << ringIndex
                      << " failed (the last at ring position " << f.lastFailed - 1 << ", '"
                      << statusName(static_cast<Status>(f.status)) << "'): " << why
                      << "; operations issued through them may not have been delivered");
  }
}

void Context::drainRings(const std::string& occasion, bool closing) noexcept {
  if (!proxy_) return;
  try {
    const uint64_t start = nowNs();
    for (int i = 0; i < proxy_->numRings(); ++i) {
      const RingDeviceHandle ring = proxy_->ring(i).hostHandle();
      const uint64_t head = atomicLoad(ring.head, kAcquire);
      // Bounded by one timeout for all rings together: closing takes at most GDX_TIMEOUT_MS more.
      while (ring.completedPositions() < head && atomicLoad(ring.error, kAcquire) == 0 &&
             nowNs() - start < options_.timeoutNs)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      const uint64_t completed = ring.completedPositions();
      const uint32_t error = atomicLoad(ring.error, kAcquire);
      if (closing) reportFaults(i);
      if (completed >= head && error == 0) continue;
      // A failed ring reported its error to flush() and wait(); only the closing context repeats it.
      if (error != 0 && !closing) continue;
      std::string why = error != 0
                            ? std::string("the ring failed with '") + statusName(static_cast<Status>(error)) + "'"
                            : "not completed within " + std::to_string(options_.timeoutNs / 1000000) + " ms";
      const std::string proxyError = proxy_->lastError();
      if (!proxyError.empty()) why += "; proxy: " + proxyError;
      const std::string failed = failure();
      if (!failed.empty() && failed != proxyError) why += "; " + failed;
      if (completed >= head) {
        // Every command completed, but a failed ring completes rejected commands too: say so once more here, for the
        // caller that never flushed and so never heard of it.
        GDX_ERROR("rank " << rank() << ": " << occasion << ": ring " << i << " had failed (" << why
                          << "); commands issued through it may not have been delivered");
        continue;
      }
      GDX_ERROR("rank " << rank() << ": " << occasion << ": " << head - completed << " command(s) on ring " << i
                        << " did not complete and are given up (" << describeLost(ring, completed, head) << "): " << why
                        << "; flush() channels before destroying their windows and Context");
    }
  } catch (const std::exception& e) {
    GDX_ERROR("rank " << rank() << ": " << occasion << ": checking for unflushed commands: " << e.what());
  }
}

}  // namespace gdx
