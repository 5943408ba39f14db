// TimerSlack: a finer timer slack for the calling thread while the guard lives. Linux lets a timed sleep of a
// thread end up to its timer slack late (50 us by default) so that wake-ups can be merged; gdx's pollers nap 20 us
// at a time once idle, and with the default slack each nap took 76 us instead of 26 us (Debian 12, 2026-11-26),
// which a command or signal arriving during the nap waits out. The old slack comes back when the guard ends (a
// waiting user thread leaves as it came). Elsewhere than Linux the guard does nothing.
#pragma once

#include <chrono>
#include <optional>
#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace gdx {

/// Timer slack of gdx's napping pollers: short against their 20 us naps.
constexpr unsigned long kPollerTimerSlackNs = 1000;

class TimerSlack {
 public:
  explicit TimerSlack(unsigned long ns = kPollerTimerSlackNs) {
#if defined(__linux__)
    const int old = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old > 0 && static_cast<unsigned long>(old) != ns && ::prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0)
      previous_ = static_cast<unsigned long>(old);
#else
    (void)ns;
#endif
  }
  ~TimerSlack() {
#if defined(__linux__)
    if (previous_ != 0) ::prctl(PR_SET_TIMERSLACK, previous_, 0, 0, 0);
#endif
  }
  TimerSlack(const TimerSlack&) = delete;
  TimerSlack& operator=(const TimerSlack&) = delete;

 private:
  unsigned long previous_ = 0;  ///< the slack to put back; 0: nothing was changed
};

/// The naps of a polling thread, with the finer slack from its first nap on (a thread that never naps keeps its own
/// untouched) until the Napper ends.
class Napper {
 public:
  template <typename Rep, typename Period>
  void nap(std::chrono::duration<Rep, Period> d) {
    if (!slack_) slack_.emplace();
    std::this_thread::sleep_for(d);
  }

 private:
  std::optional<TimerSlack> slack_;
};

}  // namespace gdx
