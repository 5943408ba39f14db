// Connection, failure and teardown (connection.hpp): a connection fails for good, all its transfers with it, when
// the peer fails or closes, when the peer breaks the protocol, or when close() is called; transfers whose deadline
// passed fail on their own (sweep()), and the peer is told about the sends and receives among them.
#include <algorithm>

#include "base/log.hpp"
#include "gdx/error.hpp"
#include "p2p/connection.hpp"

namespace gdx::p2p {
namespace {

/// How often a round looks for transfers whose deadline passed.
constexpr uint64_t kSweepEveryNs = 10 * 1000 * 1000;

}  // namespace

void Connection::close(ErrorCode code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(progressMutex_);  // after whoever runs it now
    if (lane_) {
      if (!failed_.load()) {
        try {  // sends this side took are confirmed before the goodbye: their senders wait for it
          if (twoSided_.owesCredits()) flushCredits();
        } catch (const Error& e) {
          GDX_WARN(name_ << ": confirming what arrived before closing: " << e.what());
        }
        failAll(code, why);
      }
      round();  // operations queued meanwhile fail by name too
    }
  }
  try {
    link_.transport->shutdown();
  } catch (const std::exception& e) {
    GDX_ERROR(name_ << ": closing: " << e.what());
  }
}

void Connection::failAll(ErrorCode code, const std::string& why) {
  std::function<void()> onFailure;
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    if (failure_.empty()) failure_ = why;
    failed_ = true;
    onFailure.swap(onFailure_);  // once
  }
  GDX_WARN(name_ << ": " << why);
  for (auto& t : live_) t->fail(code, why);  // the transfer's own description names the connection
  live_.clear();
  twoSided_.clear();
  oneSided_.clear();
  keys_.dropWaiters();
  if (onFailure) onFailure();
}

void Connection::sweep(uint64_t now) {
  if (now < nextSweepNs_) return;
  nextSweepNs_ = now + kSweepEveryNs;
  bool timedOut = false;
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [&](const std::shared_ptr<Transfer>& t) {
                               if (t->finished()) return true;
                               if (now < t->deadlineNs()) return false;
                               timedOut = true;
                               const std::string waiting = t->waiting();
                               t->fail(ErrorCode::kTimeout, "not done within GDX_TIMEOUT_MS (" +
                                                                std::to_string(timeoutNs_ / 1000000) + " ms)" +
                                                                (waiting.empty() ? "" : "; waiting for " + waiting));
                               return true;
                             }),
              live_.end());
  if (timedOut) {  // the sends and receives among them
    decide<TwoSided>([this](TwoSided::Actions& out) { twoSided_.abandonFailed(out); });
  }
  // A peer that closed its end said goodbye (TCP), which the transport does not report as a failure (the Context's
  // ranks all say it at teardown): without this, what still waits for that peer would wait out its timeout. Over
  // verbs a clean close says nothing; it is seen when an operation to the peer fails.
  if (!failed_.load() && link_.transport->peerStatus(link_.peer()) == Status::kShutdown)
    failAll(ErrorCode::kPeerFailed, "the peer closed the connection");
}

}  // namespace gdx::p2p
