// The only place gdx uses inline PTX: operations that have no CUDA intrinsic or libcu++ equivalent.
#pragma once

#include <cstdint>

#include "gdx/device.hpp"

namespace gdx::ptx {

#if defined(__CUDACC__)
/// Nanoseconds of the GPU's global timer (shared by all SMs); there is no intrinsic for %globaltimer.
GDX_DEVICE_INLINE uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// The thread's lane within its warp; threadIdx.x & 31 is wrong for blocks whose x size is not a multiple of 32.
GDX_DEVICE_INLINE unsigned laneId() {
  unsigned id;
  asm("mov.u32 %0, %%laneid;" : "=r"(id));
  return id;
}

/// Release fence at system scope followed by one 16-byte relaxed system-scope store: publishes a command to
/// host memory with a single PCIe write, ordered after everything this thread wrote before. libcu++ has no
/// 128-bit atomic store and two 8-byte release stores would cost two system fences.
GDX_DEVICE_INLINE void releaseStore128Sys(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}

/// The second store of a pair published under one fence (releaseStore128Sys already ordered what came before).
GDX_DEVICE_INLINE void relaxedStore128Sys(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}
#endif

}  // namespace gdx::ptx
