// The consumer's own limit, shared by bench_ring and benchmark_local's GPU mode: one proxy thread with the null
// transport drains a ring its producer filled before the thread started, so producers are never what is measured.
#pragma once

#include <chrono>
#include <cstdint>

#include "base/window_registry.hpp"
#include "gdx/error.hpp"
#include "proxy/placement.hpp"
#include "proxy/proxy.hpp"

namespace gdx::bench {

/// Seconds from starting the proxy thread until it completed `commands` (a power of two) 8-byte puts to `peer`,
/// window 0 to window 0, that were pushed into its ring beforehand. `registry` must hold those windows.
inline double drainFilledRingSeconds(const WindowRegistry& registry, int peer, uint64_t commands) {
  Proxy::Options o;
  o.threads = 1;
  o.ringsPerThread = 1;
  o.deviceRingsPerThread = 0;
  o.ringCapacity = 2 * commands;
  o.placement = defaultPlacement();
  Proxy proxy(o, nullptr, registry);
  RingDeviceHandle h = proxy.ring(0).hostHandle();
  for (uint64_t i = 0; i < commands; ++i)
    if (h.push(Command::put(static_cast<uint32_t>(peer), 0, 0, 0, (i % 4096) * 8, 8)) != Status::kOk)
      throw Error(ErrorCode::kInternal, "filling the ring failed");
  const auto t0 = std::chrono::steady_clock::now();
  proxy.start();
  if (h.waitCompleted(commands - 1) != Status::kOk)
    throw Error(ErrorCode::kTimeout, "draining a filled ring: " + proxy.lastError());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  proxy.stop();
  return seconds;
}

}  // namespace gdx::bench
