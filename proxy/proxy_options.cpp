#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "base/command_ring.hpp"
#include "gdx/config.hpp"
#include "gdx/error.hpp"
#include "proxy/proxy.hpp"

namespace gdx {

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

}  // namespace gdx
