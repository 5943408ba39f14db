// Deterministic fault injection (GDX_FAULT=ACTION:PEER:N[:MS]) so that every fault path of a transport is tested on
// every run without a broken network: this rank's N-th operation to PEER (counted from 1 over all lanes: writes,
// atomics, control messages) is
//   drop    never sent, yet completed locally as if it had been (a lost message: the receiver never sees it)
//   delay   sent MS milliseconds late (default 100)
//   corrupt sent with a damaged header (the receiver must reject it and fail the sender by name)
//   close   not sent; its connection is shut down instead (the peer sees the connection go, this rank fails the peer)
// Unset, the transport pays one relaxed counter increment per operation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace gdx::common {

enum class FaultAction : uint8_t { kNone, kDrop, kDelay, kCorrupt, kClose };

const char* faultName(FaultAction a);

struct FaultPlan {
  FaultAction action = FaultAction::kNone;
  int peer = -1;
  uint64_t atOperation = 0;  ///< 1-based
  uint64_t delayMs = 100;
  /// Parses GDX_FAULT's value (empty: no fault); throws gdx::Error(kInvalidArgument) naming GDX_FAULT and the value.
  static FaultPlan parse(const std::string& spec, int worldSize);
  std::string describe() const;
};

class FaultInjector {
 public:
  explicit FaultInjector(const FaultPlan& plan) : plan_(plan) {}
  /// Counts an operation to `peer` and returns what to do to it: kNone for every operation but the chosen one.
  FaultAction next(int peer) {
    if (plan_.action == FaultAction::kNone || peer != plan_.peer) return FaultAction::kNone;
    return count_.fetch_add(1, std::memory_order_relaxed) + 1 == plan_.atOperation ? plan_.action : FaultAction::kNone;
  }
  const FaultPlan& plan() const { return plan_; }
  /// A delay's sleep (plan().delayMs), in slices of at most 10 ms so that `stop` (the transport shutting down, the
  /// peer failed) ends it: a delay longer than the timeout must not hold the transport's shutdown. Returns true when
  /// the whole delay passed, false when `stop` ended it.
  bool sleepDelay(const std::function<bool()>& stop) const;

 private:
  FaultPlan plan_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace gdx::common
