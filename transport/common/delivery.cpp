// Completions, control messages and peer failures handed to the user (delivery.hpp).
#include "transport/common/delivery.hpp"

#include <algorithm>
#include <utility>

namespace gdx::common {

size_t takeCompletions(std::deque<Completion>& done, Completion* out, size_t max) {
  const size_t n = std::min(max, done.size());
  std::copy_n(done.begin(), n, out);
  done.erase(done.begin(), done.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

void PeerFailureNotifier::set(Transport::PeerFailureHandler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  handler_ = std::move(handler);
}

void PeerFailureNotifier::notify(int peer, const std::string& why) const {
  Transport::PeerFailureHandler handler;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handler = handler_;
  }
  if (handler) handler(peer, why);
}

}  // namespace gdx::common
