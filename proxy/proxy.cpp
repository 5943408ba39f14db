#include "proxy/proxy.hpp"

#include <algorithm>
#include <cstdint>

#include "base/log.hpp"
#include "gdx/error.hpp"
#include "proxy/proxy_thread.hpp"
#include "proxy/trace.hpp"

namespace gdx {

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

}  // namespace gdx
