#include "p2p/progress_pool.hpp"

#include <algorithm>
#include <chrono>

#include "base/log.hpp"
#include "gdx/device/impl/clock.hpp"

namespace gdx::p2p {

ProgressPool::ProgressPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.push_back(std::make_unique<Worker>());
  for (auto& w : workers_) w->thread = std::thread([this, worker = w.get()] { loop(*worker); });
}

ProgressPool::~ProgressPool() {
  stop();
}

void ProgressPool::stop() {
  stop_ = true;
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->woken = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
}

std::function<void()> ProgressPool::waker(int thread) {
  Worker* w = workers_[thread].get();
  return [w] {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->woken = true;
    }
    w->cv.notify_one();
  };
}

void ProgressPool::add(int thread, std::shared_ptr<Connection> c) {
  Worker& w = *workers_[thread];
  {
    std::lock_guard<std::mutex> lock(w.mutex);
    w.conns.push_back(std::move(c));
    w.woken = true;
  }
  w.cv.notify_one();
}

void ProgressPool::remove(const Connection* c) {
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->conns.erase(std::remove_if(w->conns.begin(), w->conns.end(),
                                  [c](const std::shared_ptr<Connection>& x) { return x.get() == c; }),
                   w->conns.end());
  }
}

void ProgressPool::loop(Worker& w) {
  uint64_t spins = 0;
  uint64_t activeNs = nowNs();
  std::vector<std::shared_ptr<Connection>> conns;
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lock(w.mutex);
      conns = w.conns;
      // Woken for work another thread queued (a posted transfer): its completion comes soon, poll for it first.
      if (w.woken) activeNs = nowNs();
      w.woken = false;
    }
    // Completions due soon after the last work are polled for; later ones are announced by the transport where it
    // can (Connection::progress(arm)), so that an idle thread sleeps instead of taking CPU from whatever produces them.
    const bool arm = nowNs() - activeNs >= Connection::kSpinNs;
    bool worked = false, polling = false;
    for (auto& c : conns) {
      if (c->driven()) continue;  // a caller runs it now, and wakes this thread when it stops
      try {
        const Connection::Activity a = c->progress(arm);
        worked |= a == Connection::Activity::kWorked;
        polling |= a == Connection::Activity::kPolling;
      } catch (const std::exception& e) {
        GDX_ERROR(c->name() << ": progress: " << e.what());
      }
    }
    conns.clear();
    if (worked) activeNs = nowNs();
    if (worked || polling) {
      spinPause(++spins);
      continue;
    }
    spins = 0;
    std::unique_lock<std::mutex> lock(w.mutex);
    w.cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return w.woken || stop_.load(); });
  }
}

}  // namespace gdx::p2p
