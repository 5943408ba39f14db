// CommandRing: the host object that owns one command ring (protocol in ring_device.hpp) and is its single
// consumer. Producers get a RingDeviceHandle; the proxy thread that owns the ring calls poll(), publishTail(),
// publishCompleted(), recordFault() and setError().
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/host_buffer.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/ring.hpp"
#include "gdx/status.hpp"

namespace gdx {

class CommandRing {
 public:
  struct Options {
    uint64_t capacity = 4096;                ///< slots; a power of two >= 2 (GDX_RING_SIZE)
    int numaNode = -1;                       ///< where the slots and counters live; -1: the calling thread's node
    uint64_t timeoutNs = kDefaultTimeoutNs;  ///< producers' wait bound (GDX_TIMEOUT_MS)
    bool deviceProducers = false;            ///< producers are GPU threads: head and cached tail live in device memory
    uint32_t numPeers = 0;                   ///< ranks commands may name: one fault record each (ring_device.hpp)
  };

  explicit CommandRing(const Options& options);
  CommandRing(const CommandRing&) = delete;
  CommandRing& operator=(const CommandRing&) = delete;

  ~CommandRing();
  /// Handle for producers that are host threads (head and cached tail in host memory); throws for a ring
  /// made for device producers.
  RingDeviceHandle hostHandle() const;
  /// Handle for producers that are GPU threads: every pointer is one the GPU can use. Throws unless the ring
  /// was made with deviceProducers (which needs CUDA and a GPU).
  RingDeviceHandle deviceHandle() const;
  bool deviceProducers() const { return deviceCounters_ != nullptr; }

  // ---- consumer side: one thread only ----
  /// Copies up to `max` published commands, in ring order, into `out` and returns how many. A putWithSignal
  /// and its signal slot are returned together or not at all (so `max` must be >= 2 to make progress on one).
  size_t poll(Command* out, size_t max);
  /// Positions taken out by poll() so far.
  uint64_t consumed() const { return localTail_; }
  /// Makes the slots taken out so far reusable by producers.
  void publishTail();
  /// Declares positions [0, upTo) finished at the source (flush() waits on this).
  void publishCompleted(uint64_t upTo);
  /// Records that the command to `peer` at `position` was refused or failed with `status` (not kOk), before its
  /// position is declared completed: flushes of that peer's commands covering it return `status`. A peer outside
  /// the ring's records (a command no Context could have made) fails the whole ring instead.
  void recordFault(uint32_t peer, uint64_t position, Status status);
  /// The record of `peer` (zero when none).
  RingFault fault(uint32_t peer) const;
  /// Sets the sticky error word unless one is set already; producers' waits return it from now on. Only for what
  /// breaks the whole ring (ring_device.hpp): a failed command is recordFault()'s.
  void setError(Status status);
  Status error() const;

  // ---- observers, any thread (closing reports: what producers put in and what did not complete) ----
  /// Positions producers reserved so far (the head). For a ring of GPU producers the head lives in device memory:
  /// it is copied on a stream of its own that does not wait for other work, so a kernel still producing (or stuck)
  /// does not hold the read up. Throws CudaError when the copy fails (the GPU is in an error state).
  uint64_t reserved() const;
  /// Positions completed at the source so far (without the fault flag).
  uint64_t completedPositions() const;
  /// The command at `pos` when a producer published it (its lap bits are current); false for a reserved position
  /// whose producer has not published it yet.
  bool published(uint64_t pos, Command* out) const { return readSlot(pos, out); }

  uint64_t capacity() const { return capacity_; }
  int numaNode() const { return memory_.numaNode(); }

 private:
  bool readSlot(uint64_t pos, Command* out) const;

  uint64_t capacity_;
  uint64_t timeoutNs_;
  HostBuffer memory_;
  Command* slots_;
  uint64_t* head_;
  uint64_t* cachedTail_;
  uint64_t* tail_;
  uint64_t* completed_;
  uint32_t* error_;
  RingFault* faults_;
  uint32_t numPeers_;
  bool hasFaults_ = false;              // some fault recorded: publishCompleted() sets kCompletedHasFaults
  uint64_t* deviceCounters_ = nullptr;  // [0]: head, [16]: cached tail (own 128-byte lines), device memory
  uint64_t localTail_ = 0;
};

}  // namespace gdx
