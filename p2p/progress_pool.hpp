// The progress threads of an endpoint: numCpus threads, each driving the connections given to it (round-robin).
// A thread sleeps until a connection wakes it (an operation queued, a message, an immediate or an armed completion
// arrived); it polls without sleeping for a short while after it did work while a connection has completions due,
// and for as long as they are due where the transport cannot announce them; it also wakes every millisecond so
// that deadlines are checked. A connection that a caller drives itself (Connection::drive) is left to that caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "p2p/connection.hpp"

namespace gdx::p2p {

class ProgressPool {
 public:
  explicit ProgressPool(int threads);
  ~ProgressPool();  ///< stops the threads (connections are not touched after it returns)
  /// Stops the threads but keeps what waker() returned valid: connections still being shut down (their transport
  /// threads report a closing peer through it) may call it until the pool is destroyed. Idempotent.
  void stop();

  /// The thread that will drive a connection with this id; pass its wake() to the Connection.
  int threadFor(uint64_t connId) const { return static_cast<int>(connId % workers_.size()); }
  std::function<void()> waker(int thread);
  void add(int thread, std::shared_ptr<Connection> c);
  void remove(const Connection* c);

 private:
  struct Worker {
    std::mutex mutex;
    std::condition_variable cv;
    bool woken = false;
    std::vector<std::shared_ptr<Connection>> conns;
    std::thread thread;
  };
  void loop(Worker& w);
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};
};

}  // namespace gdx::p2p
