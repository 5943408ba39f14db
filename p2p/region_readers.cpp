// Which local windows the transport still reads for writes this connection posted (a large send's, an eager send's,
// a one-sided write's, the answer to a peer's read), so that forget() -- the endpoint's dereg() -- returns only once
// nothing reads the memory any more: the transport reads the source of a posted write until its completion.
#include <chrono>
#include <thread>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"
#include "p2p/connection.hpp"

namespace gdx::p2p {

void Connection::postReading(const WriteOp& op) {
  try {
    lane_->post(op);
  } catch (...) {
    windows_.doneReading(op.localWindow);
    throw;
  }
  readingCookies_[op.cookie] = op.localWindow;
}

void Connection::doneReading(uint64_t cookie) {
  auto it = readingCookies_.find(cookie);
  if (it == readingCookies_.end()) return;
  const uint32_t window = it->second;
  readingCookies_.erase(it);
  windows_.doneReading(window);
}

void Connection::waitForReaders(const std::vector<uint32_t>& windows) {
  if (windows.empty() || windows_.readersOf(windows) == 0) return;
  const uint64_t deadline = nowNs() + timeoutNs_;
  for (;;) {
    const int n = windows_.readersOf(windows);
    if (n == 0) return;
    if (nowNs() >= deadline) {
      // The transport still holds pointers into the memory: only stopping it (its threads are joined) ends that.
      close(ErrorCode::kTimeout, "memory region " + std::to_string(windows.front()) +
                                     " was deregistered while the transport still read it for " + std::to_string(n) +
                                     " write(s) that did not complete within GDX_TIMEOUT_MS (" +
                                     std::to_string(timeoutNs_ / 1000000) +
                                     " ms); the connection is closed so that nothing reads it after dereg returns");
      return;
    }
    progress();  // takes the completions where no other thread runs the connection now
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace gdx::p2p
