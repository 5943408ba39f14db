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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Bulk copies through the Tensor Memory Accelerator (sm_90), for the peer-copy kernel's bulk mode: global ->
// shared completes on an mbarrier, shared -> global in bulk groups. Addresses 16-byte aligned, sizes multiples of 16.
GDX_DEVICE_INLINE uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
GDX_DEVICE_INLINE void mbarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smemAddr(bar)), "r"(count) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
GDX_DEVICE_INLINE void bulkLoad(void* smem, const void* gsrc, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smemAddr(bar)), "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smemAddr(smem)),
      "l"(gsrc), "r"(bytes), "r"(smemAddr(bar))
      : "memory");
}
GDX_DEVICE_INLINE void mbarrierWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smemAddr(bar)), "r"(parity)
                 : "memory");
  }
}
GDX_DEVICE_INLINE void bulkStore(void* gdst, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gdst), "r"(smemAddr(smem)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/// Waits until at most N bulk groups still read shared memory (their buffers may be refilled).
template <int N>
GDX_DEVICE_INLINE void bulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
/// Waits until every bulk store of this thread is complete (written).
GDX_DEVICE_INLINE void bulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
#endif

/// The one-way release fence of sm_90 (PTX 8.6): with a strong store after it, a release pattern that need not
/// order later loads. Elsewhere the two-way fence.acq_rel.sys.
GDX_DEVICE_INLINE void fenceReleaseSys() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.release.sys;" ::: "memory");
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

/// The one-way acquire fence of sm_90 (PTX 8.6): after loads that observed a release, it orders the loads after it.
/// It compiles to an L1 invalidation alone, where fence.acq_rel.sys also waits for the thread's writes to reach the
/// system (MEMBAR.ALL.SYS). Elsewhere the two-way fence.acq_rel.sys.
GDX_DEVICE_INLINE void fenceAcquireSys() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.acquire.sys;" ::: "memory");
#else
  asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
}

/// 16-byte relaxed load and store at GPU scope, for the copy queue's work entries: each 8-byte half is its own
/// single-copy atomic access (the pair is not), so the queue tags both halves and checks both tags.
GDX_DEVICE_INLINE void loadRelaxedGpu128(const uint64_t* p, uint64_t& w0, uint64_t& w1) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p) : "memory");
}
GDX_DEVICE_INLINE void storeRelaxedGpu128(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}

/// A command store after the release fence that orders what came before it (RingDeviceHandle::reserve issues it).
GDX_DEVICE_INLINE void relaxedStore128Sys(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}
#endif

}  // namespace gdx::ptx
