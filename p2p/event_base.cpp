// EventBase: a queue of tasks and a table of timers under one mutex; the loop takes what is due and runs it without
// the lock, so that a task may queue more (or wait for nothing: tasks must not block the loop for long).
#include "gdx/p2p/event_base.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "base/log.hpp"
#include "gdx/config.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/error.hpp"

namespace gdx::p2p {

struct EventBase::Impl {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  std::map<std::pair<uint64_t, uint64_t>, std::function<void()>> timers;  ///< by (due time, id)
  std::map<uint64_t, uint64_t> dueOf;                                     ///< timer id -> its due time
  uint64_t nextTimer = 1;
  bool terminating = false;
  std::atomic<std::thread::id> loopThread{};

  static void run(std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      GDX_ERROR("EventBase: a task threw: " << e.what());
    } catch (...) {
      GDX_ERROR("EventBase: a task threw something that is not a std::exception");
    }
  }
};

EventBase::EventBase() : impl_(std::make_unique<Impl>()) {}

EventBase::~EventBase() = default;

void EventBase::runInEventBaseThread(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->tasks.push_back(std::move(fn));
  }
  impl_->cv.notify_one();
}

void EventBase::runInEventBaseThreadAndWait(std::function<void()> fn) {
  if (isInEventBaseThread()) return Impl::run(fn);
  // Shared with the task: a wait that gave up leaves it safe to run later.
  auto ran = std::make_shared<std::promise<void>>();
  std::future<void> done = ran->get_future();
  runInEventBaseThread([ran, fn = std::move(fn)]() mutable {
    Impl::run(fn);
    ran->set_value();
  });
  const uint64_t timeoutNs = defaultTimeoutNs();
  if (done.wait_for(std::chrono::nanoseconds(timeoutNs)) != std::future_status::ready)
    throw Error(ErrorCode::kTimeout,
                "EventBase::runInEventBaseThreadAndWait: the task did not run within "
                "GDX_TIMEOUT_MS (" +
                    std::to_string(timeoutNs / 1000000) +
                    " ms): is the event base's loop running (loopForever, or a "
                    "ScopedEventBaseThread)?");
}

uint64_t EventBase::runAfterDelay(std::function<void()> fn, uint32_t milliseconds) {
  const uint64_t due = nowNs() + uint64_t{milliseconds} * 1000000;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    id = impl_->nextTimer++;
    impl_->timers.emplace(std::make_pair(due, id), std::move(fn));
    impl_->dueOf.emplace(id, due);
  }
  impl_->cv.notify_one();
  return id;
}

bool EventBase::cancelTimeout(uint64_t id) {
  std::function<void()> dropped;  // destroyed without the lock: it may own what takes locks as it goes
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->dueOf.find(id);
  if (it == impl_->dueOf.end()) return false;
  auto timer = impl_->timers.find(std::make_pair(it->second, id));
  dropped = std::move(timer->second);
  impl_->timers.erase(timer);
  impl_->dueOf.erase(it);
  return true;
}

bool EventBase::isInEventBaseThread() const {
  return impl_->loopThread.load() == std::this_thread::get_id();
}

void EventBase::loopForever() {
  Impl& d = *impl_;
  d.loopThread = std::this_thread::get_id();
  std::unique_lock<std::mutex> lock(d.mutex);
  for (;;) {
    const uint64_t now = nowNs();
    std::deque<std::function<void()>> ready;
    while (!d.timers.empty() && d.timers.begin()->first.first <= now) {
      ready.push_back(std::move(d.timers.begin()->second));
      d.dueOf.erase(d.timers.begin()->first.second);
      d.timers.erase(d.timers.begin());
    }
    ready.insert(ready.end(), std::make_move_iterator(d.tasks.begin()), std::make_move_iterator(d.tasks.end()));
    d.tasks.clear();
    if (!ready.empty()) {
      lock.unlock();
      for (auto& fn : ready) Impl::run(fn);
      ready.clear();
      lock.lock();
      continue;
    }
    if (d.terminating) break;
    if (d.timers.empty())
      d.cv.wait(lock);
    else
      d.cv.wait_for(lock, std::chrono::nanoseconds(d.timers.begin()->first.first - now));
  }
  d.terminating = false;
  d.loopThread = std::thread::id();
}

void EventBase::terminateLoopSoon() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->terminating = true;
  }
  impl_->cv.notify_all();
}

ScopedEventBaseThread::ScopedEventBaseThread() : ScopedEventBaseThread("gdx-evb") {}

ScopedEventBaseThread::ScopedEventBaseThread(const std::string& name) {
  thread_ = std::thread([this, name] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    evb_.loopForever();
  });
}

ScopedEventBaseThread::~ScopedEventBaseThread() {
  evb_.terminateLoopSoon();
  thread_.join();
}

}  // namespace gdx::p2p
