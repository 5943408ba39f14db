// The one bounded spin of gdx's waits, host and device (as MSCCL++'s poll_device.hpp is theirs): every wait of the
// device API, of the command ring and of ep's kernels is this loop with its own steps, so that none of them can hang
// and each says why it ended.
//
//   for spins = 0, 1, ...:
//     attempt(spins, status) -> true: return status (the condition held, or the try saw an error)
//     on a checking spin ((spins & every) == phase):
//       check(status) -> true: return status (an error word was set: a failed peer, a broken ring, ...)
//       now = nowNs() (the first one starts the clock)
//       now - start > timeoutNs: return expire() (what timed out: kTimeout, after whatever the wait reports)
//     (a check that needs the time, check(now, status), runs after the clock is read instead of before)
//     pause(spins)
//
// The error words and the clock are looked at only on checking spins because on the GPU they are reads of host
// memory (PCIe round trips) that thousands of waiting warps must not flood. A wait whose attempt() issues those
// reads before its own poll, to let them overlap, tells a checking spin by the same test.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/status.hpp"

namespace gdx::detail {

template <typename Attempt, typename Check, typename Expire, typename Pause>
GDX_HOST_DEVICE_INLINE Status pollBounded(uint64_t timeoutNs, uint64_t every, uint64_t phase, Attempt&& attempt,
                                          Check&& check, Expire&& expire, Pause&& pause) {
  uint64_t start = 0;
  for (uint64_t spins = 0;; ++spins) {
    Status status = Status::kOk;
    if (attempt(spins, status)) return status;
    if ((spins & every) == phase) {
      if constexpr (std::is_invocable<Check&, Status&>::value) {
        if (check(status)) return status;
        const uint64_t now = nowNs();
        if (start == 0) start = now;
        if (now - start > timeoutNs) return expire();
      } else {
        const uint64_t now = nowNs();
        if (start == 0) start = now;
        if (check(now, status)) return status;
        if (now - start > timeoutNs) return expire();
      }
    }
    pause(spins);
  }
}

}  // namespace gdx::detail
