// gdx::p2p::EventBase: a task loop that one thread runs, the part of folly::EventBase that RdmaTransport uses (where
// its completions are delivered), and ScopedEventBaseThread, an EventBase with a thread of its own. gdx does not
// depend on folly: code written for torchcomms' RdmaTransport names these through gdx/p2p/rdma_transport.hpp's
// gdx::p2p::compat::folly.
//
// Tasks run one at a time, in the order they were queued, in the thread that runs loopForever(); timers run in that
// thread too, once due. A task that throws is logged at ERROR and the loop goes on. There is no I/O multiplexing: the
// transports have threads of their own and queue their completions here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace gdx::p2p {

class EventBase {
 public:
  EventBase();
  /// Tasks still queued and timers not yet due are dropped, not run. Call it once no thread runs the loop.
  ~EventBase();
  EventBase(const EventBase&) = delete;
  EventBase& operator=(const EventBase&) = delete;

  /// Queues `fn` to run in the loop's thread after what was queued before it. From any thread, the loop's own too.
  void runInEventBaseThread(std::function<void()> fn);
  /// Runs `fn` in the loop's thread and returns once it ran: at once when called from that thread. Throws
  /// gdx::Error(kTimeout) when it did not run within GDX_TIMEOUT_MS (no loop runs); it may still run later.
  void runInEventBaseThreadAndWait(std::function<void()> fn);
  /// Runs `fn` in the loop's thread once `milliseconds` passed; returns an id for cancelTimeout().
  uint64_t runAfterDelay(std::function<void()> fn, uint32_t milliseconds);
  /// Drops timer `id` unless it ran already; true when it was dropped.
  bool cancelTimeout(uint64_t id);
  /// true in the thread that runs the loop now.
  bool isInEventBaseThread() const;
  /// Runs tasks and timers in the calling thread until terminateLoopSoon(); what was queued before that still runs.
  void loopForever();
  /// Makes loopForever() return once the tasks queued so far (and those they queue) ran.
  void terminateLoopSoon();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// An EventBase run by a thread of its own from construction to destruction (folly::ScopedEventBaseThread).
class ScopedEventBaseThread {
 public:
  ScopedEventBaseThread();
  /// `name`: the thread's name (at most 15 characters are kept), as top and debuggers show it.
  explicit ScopedEventBaseThread(const std::string& name);
  /// Runs what was queued so far, then joins the thread.
  ~ScopedEventBaseThread();
  ScopedEventBaseThread(const ScopedEventBaseThread&) = delete;
  ScopedEventBaseThread& operator=(const ScopedEventBaseThread&) = delete;

  EventBase* getEventBase() { return &evb_; }

 private:
  EventBase evb_;
  std::thread thread_;
};

}  // namespace gdx::p2p
