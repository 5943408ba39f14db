// A nanosecond clock usable from host and device code, for bounded waits. On the device it reads the global
// timer (%globaltimer, nanoseconds, shared by all SMs); on the host std::chrono::steady_clock.
#pragma once

#include <cstdint>

#include "gdx/device.hpp"
#include "gdx/device/impl/ptx.hpp"

#if !GDX_DEVICE_COMPILE
#include <chrono>
#include <thread>
#endif

namespace gdx {

GDX_HOST_DEVICE_INLINE uint64_t nowNs() {
#if GDX_DEVICE_COMPILE
  return ptx::globalTimerNs();
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

/// Called on every iteration of a bounded spin: on the host, yields the core after a short burst so that
/// spinning producers cannot starve the thread they wait for; on the device, backs off with __nanosleep so that
/// waiting warps do not flood PCIe with reads of host memory.
GDX_HOST_DEVICE_INLINE void spinPause(uint64_t spins) {
#if GDX_DEVICE_COMPILE
  if (spins > 16) __nanosleep(spins > 1024 ? 1000 : 64);
#else
  if (spins > 64) std::this_thread::yield();
#endif
}

/// Back-off of a producer waiting for ring space, `behind` slots short of it. On the device the sleep grows
/// with the distance, so thousands of waiting warps far down the line do not flood PCIe with reads of the
/// tail while the consumer frees the slots ahead of them; on the host it is spinPause().
GDX_HOST_DEVICE_INLINE void waitForSlots(uint64_t spins, uint64_t behind) {
#if GDX_DEVICE_COMPILE
  (void)spins;
  uint64_t ns = behind * 16;
  __nanosleep(static_cast<unsigned>(ns < 64 ? 64 : ns > 8192 ? 8192 : ns));
#else
  (void)behind;
  spinPause(spins);
#endif
}

}  // namespace gdx
