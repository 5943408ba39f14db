// Proxy: threads that drain command rings and turn commands into transport operations.
//
// Each proxy thread owns `ringsPerThread` rings and one transport lane. Its loop: take a batch of commands
// from each ring, check every command against the WindowRegistry, post it on the lane (one put -> one write;
// putWithSignal -> one write-with-immediate, or a write then a remote atomic when the signal does not fit
// the immediate; signal/atomicAdd -> one remote atomic; a relayed command -> the write to the relay, then the
// relay's control message (RelayRequests)), publish the ring's tail, then reap lane completions
// and advance each ring's in-order completion counter (what flush() waits on). A command that fails the check
// is not posted: it is counted as an error, its message kept (per peer: peerError()), and recorded as a fault of
// its peer at its ring position (ring_device.hpp), so the flush that covers it returns Status::kProxyError while
// the ring, later commands and other peers' commands go on; an operation that completes with an error is recorded
// the same way with the transport's status. Only a proxy thread that stops breaks its rings (their error word).
// Threads are pinned to the CPUs of one NUMA node and the rings' memory is placed on that node.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/command_ring.hpp"
#include "base/window_registry.hpp"
#include "gdx/config.hpp"
#include "gdx/stats.hpp"
#include "proxy/placement.hpp"
#include "transport/transport.hpp"

namespace gdx {

class TraceBuffer;
class WriteMerger;

/// What the proxy does with relayed commands (a relayPut pair, or a putWithSignal or signal whose signal slot names a
/// destination; command.hpp): the runtime's relay checks them and builds the control message the relay rank acts
/// on. The proxy posts the command's data to the relay, then that message on the same lane.
class RelayRequests {
 public:
  virtual ~RelayRequests() = default;
  /// Empty when the relayed command can be forwarded, else why not. `second` is its second slot (the command
  /// itself for a relayed signal).
  virtual std::string check(const Command& first, const Command& second) const = 0;
  /// The control message for the relay (first.peer()); the proxy sets its cookie.
  virtual MessageOp request(const Command& first, const Command& second) const = 0;
};

class Proxy {
 public:
  using Options = ProxyOptions;

  /// `transport` may be null: the proxy then completes every valid command without moving data (the null
  /// transport of the command-rate benchmark). `relay` may be null: relayed commands are then rejected.
  Proxy(const Options& options, Transport* transport, const WindowRegistry& registry,
        const RelayRequests* relay = nullptr);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  void start();
  /// Stops the threads after the operations in flight completed (bounded by the timeout); idempotent.
  void stop();

  /// Rings for host-thread producers.
  int numRings() const { return static_cast<int>(hostRings_.size()); }
  CommandRing& ring(int index) { return *rings_.at(hostRings_.at(index)); }
  /// Rings for GPU producers.
  int numDeviceRings() const { return static_cast<int>(deviceRings_.size()); }
  CommandRing& deviceRing(int index) { return *rings_.at(deviceRings_.at(index)); }
  int numThreads() const { return static_cast<int>(threads_.size()); }
  ProxyCounters counters(int thread) const;
  ProxyCounters totalCounters() const;
  /// Sets every ring's error word (the proxy cannot go on); the first message is kept for lastError().
  void failAll(Status status, const std::string& why);
  /// The first error any proxy thread recorded, empty when none.
  std::string lastError() const;
  /// The latest error of a command to `peer` (and the first one, when they differ), empty when none.
  std::string peerError(int peer) const;
  /// Tracing (GDX_TRACE): the file the trace is written to when the proxy stops; empty when not tracing.
  const std::string& tracePath() const { return tracePath_; }
  /// The last `perPeer` traced events to each peer, a line each (empty when not tracing).
  std::string recentTrace(size_t perPeer) const;
  const Options& options() const { return options_; }

 private:
  struct Thread;
  class Posting;
  void run(Thread& t);
  void loop(Thread& t);
  /// Takes a batch from ring `r` of thread `t` and posts it; returns the number of slots taken.
  size_t drainRing(Thread& t, size_t r);
  /// Reaps the lane's completions and publishes each ring's completed prefix; returns whether all rings are idle.
  bool reapCompletions(Thread& t, size_t* reaped);
  bool plainlyValid(const Command& c, const Command* second) const;
  std::string checkCommand(const Command& c, const Command* second) const;
  void postPut(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command& c, const Command* signal,
               uint64_t lastPosition);
  void postMerged(Thread& t, CommandRing& ring, Posting& p, WriteMerger& merger, const Command* signal = nullptr);
  void postRelayed(Posting& p, const Command& c, const Command& second);
  void postAtomic(Posting& p, const Command& c);
  void recordError(const std::string& message);
  void recordError(uint32_t peer, const std::string& message);

  Options options_;
  Transport* transport_;
  const WindowRegistry& registry_;
  const RelayRequests* relay_;
  std::vector<std::unique_ptr<CommandRing>> rings_;
  std::vector<int> hostRings_, deviceRings_;  // indexes into rings_
  std::vector<std::unique_ptr<Thread>> threads_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  std::string tracePath_;
  std::vector<const TraceBuffer*> traceBuffers() const;
  void writeTrace() const;
  mutable std::mutex errorMutex_;
  std::string firstError_;
  struct PeerErrors {
    std::string first, latest;
  };
  std::vector<PeerErrors> peerErrors_;  // by peer, under errorMutex_
};

}  // namespace gdx
