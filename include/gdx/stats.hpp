// What the proxy did, for benchmarks and monitoring (Context::stats()).
#pragma once

#include <cstdint>

namespace gdx {

/// Per-thread counters, updated by the proxy thread and readable at any time.
struct ProxyCounters {
  uint64_t commands = 0;  ///< commands taken out of the rings (a putWithSignal pair counts as 2)
  uint64_t bytes = 0;     ///< payload bytes posted
  uint64_t errors = 0;    ///< commands rejected plus operations that completed with an error
  uint64_t batches = 0;   ///< non-empty polls of a ring
  uint64_t writes = 0;    ///< transport writes posted (consecutive puts merged into one count once)
  // With ProxyOptions::timing (GDX_PROXY_TIMING) only, else 0: where a command's time goes after a kernel pushed it.
  uint64_t handlingNs = 0;  ///< taking commands out of the rings, checking and posting them
  uint64_t inFlightNs = 0;  ///< with at least one posted operation not yet completed by the transport
  uint64_t inFlight = 0;    ///< operations posted and not yet completed, now (a gauge, not a count)
};

}  // namespace gdx
