// What a Context is built with: the proxy's threads and rings, where they run, the transport and every wait's bound.
// ContextOptions::fromEnv() reads the GDX_* variables (README.md lists them; gdx/config.hpp checks them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gdx/config.hpp"

namespace gdx {

/// Where the proxy threads run and their rings' memory lives: a NUMA node and the CPUs of it this process may use.
struct Placement {
  int numaNode = 0;
  std::vector<int> cpus;  ///< OS indexes of the node's CPUs that this process may run on
  std::string reason;     ///< how the node was chosen, for the log
};

/// The proxy threads that drain the command rings (one transport lane each).
struct ProxyOptions {
  int threads = 1;                         ///< GDX_PROXY_THREADS
  int ringsPerThread = 1;                  ///< rings for host-thread producers, per thread (GDX_RINGS_PER_THREAD)
  int deviceRingsPerThread = 0;            ///< rings for GPU producers, per thread (GDX_DEVICE_RINGS_PER_THREAD;
                                           ///< the Context makes 1 when a GPU is present)
  uint64_t ringCapacity = 4096;            ///< GDX_RING_SIZE
  size_t maxInFlight = 1024;               ///< operations posted and not completed, per thread (GDX_PROXY_MAX_INFLIGHT)
  uint64_t timeoutNs = kDefaultTimeoutNs;  ///< producers' and the drain's bound (GDX_TIMEOUT_MS)
  std::string trace;                       ///< GDX_TRACE: where the trace goes ("%r": the rank); empty: none
  size_t traceEvents = size_t{1} << 16;    ///< GDX_TRACE_EVENTS: events kept per proxy thread
  bool timing = false;  ///< GDX_PROXY_TIMING: fill ProxyCounters' handlingNs / inFlightNs (two clock reads per batch)
  Placement placement;
  static ProxyOptions fromEnv();
  /// Throws gdx::Error(kInvalidArgument) naming the variable of the first field out of range, and when the rings
  /// could not fit in this machine's memory; a Context calls it before it joins the job.
  void validate() const;
};

struct ContextOptions {
  ProxyOptions proxy;                      ///< threads, rings, ring size, in-flight cap, placement
  uint32_t numSignals = 1024;              ///< GDX_NUM_SIGNALS (at most kMaxSignals)
  std::string transport = "tcp";           ///< GDX_TRANSPORT: tcp, verbs (built with rdma-core), loopback (one rank)
  int tcpSockets = 4;                      ///< GDX_TCP_SOCKETS
  uint64_t timeoutNs = kDefaultTimeoutNs;  ///< every wait's bound (GDX_TIMEOUT_MS), passed to all the context builds
  /// Reads the variables above; placement from GDX_NUMA_NODE or the calling thread's node.
  static ContextOptions fromEnv();
};

}  // namespace gdx
