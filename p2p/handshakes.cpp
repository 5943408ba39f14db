#include "p2p/handshakes.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <system_error>
#include <utility>
#include <vector>

namespace gdx::p2p {

Handshakes::~Handshakes() {
  stop();
}

bool Handshakes::evictSilent() {
  for (auto& r : running_) {  // oldest first
    if (r->done || r->heard || r->evicted) continue;
    r->evicted = true;
    ::shutdown(r->fd.get(), SHUT_RDWR);  // its Hello read ends at once; its thread leaves and is reaped
    return true;
  }
  return false;
}

bool Handshakes::start(net::UniqueFd fd, Body body) {
  std::unique_lock<std::mutex> lock(mutex_);
  reap(lock);
  if (stopping_) return false;
  // Places held by evicted handshakes are counted until their threads leave (within a moment), so that at most
  // 2 * kMaxRunning threads exist however fast sockets arrive.
  size_t live = 0;
  for (auto& r : running_) live += (!r->done && !r->evicted) ? 1 : 0;
  if (running_.size() >= 2 * kMaxRunning) return false;
  if (live >= kMaxRunning && !evictSilent()) return false;
  net::UniqueFd dup(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return false;
  auto made = std::make_unique<Running>();
  Running* r = made.get();
  r->fd = std::move(fd);
  // The thread is made before the entry is listed: if it cannot be made, no entry without a thread is left for
  // stop() to join, and the newcomer is refused like one beyond the places.
  try {
    r->thread = std::thread([this, r, body = std::move(body), dup = std::move(dup)]() mutable {
      body(std::move(dup), [this, r] {
        std::lock_guard<std::mutex> heard(mutex_);
        r->heard = true;
      });
      std::lock_guard<std::mutex> done(mutex_);
      r->done = true;
      r->fd.reset();  // the client sees the socket closed now, not when the next arrival reaps this thread
    });
  } catch (const std::system_error&) {
    return false;
  }
  running_.push_back(std::move(made));
  return true;
}

size_t Handshakes::running() {
  std::unique_lock<std::mutex> lock(mutex_);
  reap(lock);
  return running_.size();
}

void Handshakes::reap(std::unique_lock<std::mutex>& lock) {
  std::vector<std::unique_ptr<Running>> finished;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->done) {
      finished.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  lock.unlock();
  for (auto& r : finished) r->thread.join();  // it only has to return from its lambda
  lock.lock();
}

void Handshakes::stop() {
  std::list<std::unique_ptr<Running>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& r : running_) ::shutdown(r->fd.get(), SHUT_RDWR);  // the duplicate's reads and writes end at once
    all.swap(running_);
  }
  for (auto& r : all) r->thread.join();
}

}  // namespace gdx::p2p
