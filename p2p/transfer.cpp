#include "p2p/transfer.hpp"

#include <chrono>

#include "gdx/device/impl/clock.hpp"

namespace gdx::p2p {

std::string TransferName::text() const {
  return std::string(op) + " of " + (pieces == 1 ? "" : std::to_string(pieces) + " buffers, ") + std::to_string(bytes) +
         " bytes on " + (where ? *where : std::string("a connection"));
}

void Transfer::finishPart() {
  FinishHandler done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_ || parts_ == 0) return;
    if (--parts_ > 0) return;
    cv_.notify_all();
    done = std::move(onFinish_);
  }
  if (done) done(*this);
}

void Transfer::finishPart(size_t index, uint64_t bytes) {
  FinishHandler done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_ || parts_ == 0) return;
    sized_ = true;
    if (index == 0) {
      size0_ = bytes;
    } else if (index < static_cast<size_t>(total_)) {
      if (moreSizes_.empty()) moreSizes_.resize(static_cast<size_t>(total_) - 1);
      moreSizes_[index - 1] = bytes;
    }
    if (--parts_ > 0) return;
    cv_.notify_all();
    done = std::move(onFinish_);  // the header's promise: the thread that finished the last part calls it
  }
  if (done) done(*this);
}

std::vector<uint64_t> Transfer::sizes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint64_t> out;
  if (!sized_) return out;
  out.reserve(static_cast<size_t>(total_));
  out.push_back(size0_);
  for (int i = 1; i < total_; ++i) out.push_back(moreSizes_.empty() ? 0 : moreSizes_[static_cast<size_t>(i) - 1]);
  return out;
}

void Transfer::fail(ErrorCode code, const std::string& why) {
  FinishHandler done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_ || parts_ == 0) return;
    failed_ = true;
    code_ = code;
    why_ = why;
    cv_.notify_all();
    done = std::move(onFinish_);
  }
  if (done) done(*this);
}

void Transfer::setWaiting(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_ = what;
  waitingLiteral_ = nullptr;
}

void Transfer::setWaitingLiteral(const char* literal) {
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.clear();
  waitingLiteral_ = literal;
}

std::string Transfer::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waitingLocked();
}

std::string Transfer::waitingLocked() const {
  return waitingLiteral_ ? std::string(waitingLiteral_) : waiting_;
}

bool Transfer::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_ || parts_ == 0;
}

ErrorCode Transfer::failureCode() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_ ? code_ : ErrorCode::kOk;
}

void Transfer::throwIfFailed() const {
  if (failed_) throw Error(code_, what() + ": " + why_);
}

bool Transfer::poll() const {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfFailed();
  return parts_ == 0;
}

void Transfer::wait(uint64_t deadlineNs) const {
  if (driver_) driver_(*this, deadlineNs);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!failed_ && parts_ > 0) {
    uint64_t now = nowNs();
    if (now >= deadlineNs)
      throw Error(ErrorCode::kTimeout,
                  what() + ": not done within GDX_TIMEOUT_MS (" + std::to_string(parts_) +
                      " part(s) still outstanding" +
                      (waitingLocked().empty() ? std::string() : "; waiting for " + waitingLocked()) + ")");
    cv_.wait_for(lock, std::chrono::nanoseconds(std::min<uint64_t>(deadlineNs - now, 100000000)));
  }
  throwIfFailed();
}

}  // namespace gdx::p2p
