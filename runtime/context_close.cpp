// Before ~Context and before a Window is deregistered, the commands host threads and kernels already put into the
// rings are given the context's timeout to complete, and whatever did not is named in the log (how many, on which
// ring, to which peer, of which kind), so that puts a caller forgot to flush are either delivered or reported, never
// dropped without a word.
// (Windows are usually destroyed before their Context; without the wait at deregistration the proxy would refuse
// the unflushed puts that name them.)
#include <chrono>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "runtime/context_impl.hpp"

namespace gdx {
namespace {

// Positions [from, to) of a ring, counted per peer and kind. The slots are still intact (the consumer never clears
// one); a position reserved but not published yet (a kernel still producing, or one that stopped mid-command) has no
// command to name and is counted apart.
std::string describeLost(const CommandRing& ring, uint64_t from, uint64_t to) {
  std::map<uint32_t, std::map<std::string, uint64_t>> perPeer;
  uint64_t unpublished = 0;
  const uint64_t first = to - from > ring.capacity() ? to - ring.capacity() : from;
  for (uint64_t p = first; p < to; ++p) {
    Command c;
    if (ring.published(p, &c))
      ++perPeer[c.peer()][opcodeName(c.opcode())];
    else
      ++unpublished;
  }
  std::ostringstream os;
  const char* sep = "";
  for (const auto& [peer, kinds] : perPeer) {
    os << sep << "to peer " << peer << ":";
    sep = "; ";
    for (const auto& [kind, n] : kinds) os << " " << n << " " << kind;
  }
  if (unpublished) os << sep << unpublished << " reserved by a producer but never published";
  if (first > from) os << sep << first - from << " older ones overwritten";
  return os.str();
}

}  // namespace

// A failed command fails only the flush that covers it; the caller that never flushed hears of it here.
void ContextImpl::reportFaults(const std::string& ringName, const CommandRing& ring) const {
  for (int p = 0; p < worldSize(); ++p) {
    const RingFault f = ring.fault(static_cast<uint32_t>(p));
    if (f.lastFailed == 0) continue;
    std::string why = proxy_->peerError(p);
    const std::string peerFailed = failure(p);
    if (!peerFailed.empty() && peerFailed != why) why += (why.empty() ? "" : "; ") + peerFailed;
    GDX_ERROR("rank " << rank() << ": closing the context: commands to peer " << p << " on " << ringName
                      << " failed (the last at ring position " << f.lastFailed - 1 << ", '"
                      << statusName(static_cast<Status>(f.status)) << "'): " << why
                      << "; operations issued through them may not have been delivered");
  }
}

void ContextImpl::drainRings(const std::string& occasion, bool closing) noexcept {
  if (!proxy_) return;
  // Host threads' rings and kernels' rings alike: commands still in either are waited for, or named.
  std::vector<std::pair<std::string, CommandRing*>> rings;
  for (int i = 0; i < proxy_->numRings(); ++i) rings.emplace_back("ring " + std::to_string(i), &proxy_->ring(i));
  for (int i = 0; i < proxy_->numDeviceRings(); ++i)
    rings.emplace_back("device ring " + std::to_string(i), &proxy_->deviceRing(i));
  // Bounded by one timeout for all rings together: closing takes at most GDX_TIMEOUT_MS more.
  const uint64_t start = nowNs();
  for (size_t i = 0; i < rings.size(); ++i) {
    const std::string& name = rings[i].first;
    const CommandRing& ring = *rings[i].second;
    try {
      const uint64_t head = ring.reserved();
      while (ring.completedPositions() < head && ring.error() == Status::kOk && nowNs() - start < options_.timeoutNs)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      const uint64_t completed = ring.completedPositions();
      const Status error = ring.error();
      if (closing) reportFaults(name, ring);
      if (completed >= head && error == Status::kOk) continue;
      // A failed ring reported its error to flush() and wait(); only the closing context repeats it.
      if (error != Status::kOk && !closing) continue;
      std::string why = error != Status::kOk
                            ? std::string("the ring failed with '") + statusName(error) + "'"
                            : "not completed within " + std::to_string(options_.timeoutNs / 1000000) + " ms";
      const std::string proxyError = proxy_->lastError();
      if (!proxyError.empty()) why += "; proxy: " + proxyError;
      const std::string failed = failure();
      if (!failed.empty() && failed != proxyError) why += "; " + failed;
      if (completed >= head) {
        // Every command completed, but a failed ring completes rejected commands too: say so once more here, for
        // the caller that never flushed and so never heard of it.
        GDX_ERROR("rank " << rank() << ": " << occasion << ": " << name << " had failed (" << why
                          << "); commands issued through it may not have been delivered");
        continue;
      }
      GDX_ERROR("rank " << rank() << ": " << occasion << ": " << head - completed << " command(s) on " << name
                        << " did not complete and are given up (" << describeLost(ring, completed, head) << "): " << why
                        << "; flush() channels (and let kernels finish) before destroying their windows and Context");
    } catch (const std::exception& e) {
      GDX_ERROR("rank " << rank() << ": " << occasion << ": checking " << name
                        << " for unflushed commands: " << e.what());
    }
  }
}

}  // namespace gdx
