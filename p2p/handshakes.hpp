// Handshakes: the accepting side of many handshakes at once, each in a thread of its own, so that a client that
// connects and then says nothing (or says it slowly) delays nobody but itself. At most kMaxRunning run at a time.
// When they are all taken, the oldest one whose client has not yet said Hello gives its place to the newcomer (its
// socket is shut down): sockets that connect and stay silent cannot keep a real client out for longer than it
// takes to send its Hello. Only when every place holds a client that spoke is a newcomer's socket closed at once.
// Stopping shuts every socket still in a handshake down, so that its thread ends at once instead of at its deadline,
// and joins them all.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "sockets/socket.hpp"

namespace gdx::p2p {

class Handshakes {
 public:
  static constexpr size_t kMaxRunning = 64;

  Handshakes() = default;
  ~Handshakes();
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;

  /// What a handshake runs: the socket it owns and what it calls once its client said a well-formed Hello.
  using Body = std::function<void(net::UniqueFd, const std::function<void()>& heard)>;
  /// Runs `body` on a duplicate of `fd` in a new thread (it owns that duplicate; this keeps `fd` until it returns,
  /// to shut it down on stop() or to make room). `body` reports its own outcome and must not throw. false (and `fd`
  /// closed) when kMaxRunning are running and every one of them heard its Hello, or stop() was called.
  bool start(net::UniqueFd fd, Body body);
  /// How many run now.
  size_t running();
  /// Ends every handshake (their sockets shut down) and waits for their threads; later start() calls refuse.
  void stop();

 private:
  struct Running {
    net::UniqueFd fd;
    std::thread thread;
    bool done = false;     ///< under mutex_
    bool heard = false;    ///< under mutex_: the client said Hello
    bool evicted = false;  ///< under mutex_: its socket was shut down to make room
  };
  /// Shuts down the oldest handshake that has not heard its Hello; false when there is none (mutex_ held).
  bool evictSilent();
  /// Joins the threads that finished (mutex_ held by `lock`).
  void reap(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::list<std::unique_ptr<Running>> running_;
  bool stopping_ = false;
};

}  // namespace gdx::p2p
