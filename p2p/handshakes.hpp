// Handshakes: the accepting side of many handshakes at once, each in a thread of its own, so that a client that
// connects and then says nothing (or says it slowly) delays nobody but itself. At most kMaxRunning run at a time;
// a socket beyond that is closed at once. Stopping shuts every socket still in a handshake down, so that its thread
// ends at once instead of at its deadline, and joins them all.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "rdma/socket.hpp"

namespace gdx::p2p {

class Handshakes {
 public:
  static constexpr size_t kMaxRunning = 64;

  Handshakes() = default;
  ~Handshakes();
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;

  /// Runs `body` on a duplicate of `fd` in a new thread (it owns that duplicate; this keeps `fd` until it returns,
  /// to shut it down on stop()). `body` reports its own outcome and must not throw. false (and `fd` closed) when
  /// kMaxRunning are running or stop() was called.
  bool start(net::UniqueFd fd, std::function<void(net::UniqueFd)> body);
  /// How many run now.
  size_t running();
  /// Ends every handshake (their sockets shut down) and waits for their threads; later start() calls refuse.
  void stop();

 private:
  struct Running {
    net::UniqueFd fd;
    std::thread thread;
    bool done = false;  ///< under mutex_
  };
  /// Joins the threads that finished (mutex_ held by `lock`).
  void reap(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::list<std::unique_ptr<Running>> running_;
  bool stopping_ = false;
};

}  // namespace gdx::p2p
