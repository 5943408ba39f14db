// The copy primitive of kernels, device::copy(coop, dst, src, bytes): the threads of `coop` (device/coop.hpp: one
// thread, a warp, a block, or a Group of any size whose threads name their own index) copy `bytes` from `src` to
// `dst`, each calling it with the same arguments. Either side may be another GPU's memory (peer-mapped or IPC-mapped)
// or mapped host memory. Where dst and src agree modulo 16 the body moves 16-byte vectors, kUnroll loads in flight
// per thread before the stores (software pipelining); the unaligned head goes byte by byte, the tail in the widest
// words its alignment allows. Otherwise the widest common alignment (8, 4, 2 or 1 bytes) is used.
// No ordering is implied: the caller fences/barriers before publishing the data.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/coop.hpp"

namespace gdx {

#if defined(__CUDACC__)
namespace copy_detail {
template <typename T, int kUnroll>
GDX_DEVICE_INLINE void copyWords(T* __restrict__ dst, const T* __restrict__ src, uint64_t n, uint64_t tid,
                                 uint64_t nthreads) {
  const uint64_t stride = nthreads * kUnroll;
  uint64_t i = tid;
  for (; i + (kUnroll - 1) * nthreads < n; i += stride) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * nthreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * nthreads] = v[u];
  }
  for (; i < n; i += nthreads) dst[i] = src[i];
}

/// Fewer than 64 bytes by one thread, both addresses 8-byte aligned (a put of a flag, a count, a few words): every
/// load before the stores and no loop bookkeeping, so it costs one round trip to the source; through the general path
/// below the same 8 bytes took about 0.3 us longer.
GDX_DEVICE_INLINE void smallAligned(char* dst, const char* src, uint64_t bytes) {
  const unsigned n = static_cast<unsigned>(bytes >> 3), rest = static_cast<unsigned>(bytes & 7);
  const uint64_t* s = reinterpret_cast<const uint64_t*>(src);
  uint64_t* d = reinterpret_cast<uint64_t*>(dst);
  uint64_t v[7];
#pragma unroll
  for (unsigned k = 0; k < 7; ++k)
    if (k < n) v[k] = s[k];
  uint32_t w4 = 0;
  uint16_t w2 = 0;
  uint8_t w1 = 0;
  const char* t = src + (n << 3);  // the tail starts 8-byte aligned
  if (rest & 4) w4 = *reinterpret_cast<const uint32_t*>(t);
  if (rest & 2) w2 = *reinterpret_cast<const uint16_t*>(t + (rest & 4));
  if (rest & 1) w1 = static_cast<uint8_t>(t[rest & 6]);
#pragma unroll
  for (unsigned k = 0; k < 7; ++k)
    if (k < n) d[k] = v[k];
  char* u = dst + (n << 3);
  if (rest & 4) *reinterpret_cast<uint32_t*>(u) = w4;
  if (rest & 2) *reinterpret_cast<uint16_t*>(u + (rest & 4)) = w2;
  if (rest & 1) u[rest & 6] = static_cast<char>(w1);
}

/// kUnroll: 16-byte vectors each thread loads before storing them (bytes in flight per thread = 16 * kUnroll).
template <int kUnroll>
GDX_DEVICE_INLINE void cooperative(void* dstv, const void* srcv, uint64_t bytes, uint64_t tid, uint64_t nthreads) {
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  // A few aligned words (a flag, a count): one thread, one round trip; the others have nothing to do.
  if (bytes < 64 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 7) == 0) {
    if (tid == 0) smallAligned(dst, src, bytes);
    return;
  }
  const uintptr_t mis = (reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src));
  const unsigned align = (mis & 15) == 0 ? 16 : (mis & 7) == 0 ? 8 : (mis & 3) == 0 ? 4 : (mis & 1) == 0 ? 2 : 1;
  // Shifts, not divisions by `align`: a 64-bit division by a value the compiler cannot see is a subroutine call.
  const unsigned shift = __ffs(align) - 1;
  uint64_t head = (align - (reinterpret_cast<uintptr_t>(dst) & (align - 1))) & (align - 1);
  if (head > bytes) head = bytes;
  for (uint64_t i = tid; i < head; i += nthreads) dst[i] = src[i];
  const uint64_t words = (bytes - head) >> shift;
  char* d = dst + head;
  const char* s = src + head;
  switch (align) {
    case 16:
      copyWords<uint4, kUnroll>(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), words, tid, nthreads);
      break;
    case 8:
      copyWords<uint64_t, 4>(reinterpret_cast<uint64_t*>(d), reinterpret_cast<const uint64_t*>(s), words, tid,
                             nthreads);
      break;
    case 4:
      copyWords<uint32_t, 4>(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(s), words, tid,
                             nthreads);
      break;
    case 2:
      copyWords<uint16_t, 4>(reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(s), words, tid,
                             nthreads);
      break;
    default:
      copyWords<uint8_t, 4>(reinterpret_cast<uint8_t*>(d), reinterpret_cast<const uint8_t*>(s), words, tid, nthreads);
  }
  // The tail (fewer than `align` bytes) starts aligned: one thread moves it in the widest words it allows.
  uint64_t p = head + (words << shift);
  if (tid == 0 && p < bytes) {
    if (align >= 8 && bytes - p >= 8) {
      *reinterpret_cast<uint64_t*>(dst + p) = *reinterpret_cast<const uint64_t*>(src + p);
      p += 8;
    }
    if (align >= 4 && bytes - p >= 4) {
      *reinterpret_cast<uint32_t*>(dst + p) = *reinterpret_cast<const uint32_t*>(src + p);
      p += 4;
    }
    if (align >= 2 && bytes - p >= 2) {
      *reinterpret_cast<uint16_t*>(dst + p) = *reinterpret_cast<const uint16_t*>(src + p);
      p += 2;
    }
    if (p < bytes) dst[p] = src[p];
  }
}

/// One thread copies `bytes` (device::copy with Thread, the single-thread form of put). A lone thread is bound by the
/// latency of its loads, so where dst and src agree modulo 16 it keeps kVectors 16-byte loads in flight before storing
/// them: 128 bytes per round trip with 8, for about 10 more registers in the calling kernel (16 would cost 40 more, in
/// every kernel that uses put); otherwise, or for fewer than 64 bytes, cooperative().
template <int kVectors>
GDX_DEVICE_INLINE void singleThread(void* dstv, const void* srcv, uint64_t bytes) {
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  // One aligned 8-byte word (a flag, a count, an index: the commonest small put) ahead of every branch below: a lone
  // thread pays for each instruction on its path, and through smallAligned's the 8-byte put-with-signal took
  // 0.25 us longer one way over NVLink than the same load and store written out by hand.
  if (bytes == 8 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(dst) = *reinterpret_cast<const uint64_t*>(src);
    return;
  }
  if (bytes < 64 || ((reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 15) != 0) {
    cooperative<4>(dst, src, bytes, 0, 1);
    return;
  }
  const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  for (uint64_t i = 0; i < head; ++i) dst[i] = src[i];
  uint4* d = reinterpret_cast<uint4*>(dst + head);
  const uint4* s = reinterpret_cast<const uint4*>(src + head);
  const uint64_t n = (bytes - head) / 16;
  uint64_t i = 0;
  for (; i + kVectors <= n; i += kVectors) {
    uint4 v[kVectors];
#pragma unroll
    for (int u = 0; u < kVectors; ++u) v[u] = s[i + u];
#pragma unroll
    for (int u = 0; u < kVectors; ++u) d[i + u] = v[u];
  }
  {  // the last partial round, loads still all before the stores
    const uint64_t r = n - i;
    uint4 v[kVectors];
#pragma unroll
    for (int u = 0; u < kVectors; ++u)
      if (u < r) v[u] = s[i + u];
#pragma unroll
    for (int u = 0; u < kVectors; ++u)
      if (u < r) d[i + u] = v[u];
  }
  // Fewer than 16 bytes left, starting 16-byte aligned.
  uint64_t p = head + n * 16;
  if (bytes - p >= 8) {
    *reinterpret_cast<uint64_t*>(dst + p) = *reinterpret_cast<const uint64_t*>(src + p);
    p += 8;
  }
  if (bytes - p >= 4) {
    *reinterpret_cast<uint32_t*>(dst + p) = *reinterpret_cast<const uint32_t*>(src + p);
    p += 4;
  }
  if (bytes - p >= 2) {
    *reinterpret_cast<uint16_t*>(dst + p) = *reinterpret_cast<const uint16_t*>(src + p);
    p += 2;
  }
  if (p < bytes) dst[p] = src[p];
}
}  // namespace copy_detail

namespace device {
/// The threads of `coop` copy `bytes` from `src` to `dst`. kUnroll: 16-byte vectors each thread loads before storing
/// them (bytes in flight per thread = 16 * kUnroll); 0 takes the coop's default, 8 for a Thread (a lone thread is
/// bound by the latency of its loads) and 4 for a group. Thread, Warp and Block take no barrier: the caller orders
/// the copy before whatever publishes it.
template <int kUnroll = 0, typename Coop>
GDX_DEVICE_INLINE void copy(Coop coop, void* dst, const void* src, uint64_t bytes) {
  if constexpr (std::is_same<Coop, Thread>::value)
    copy_detail::singleThread<kUnroll ? kUnroll : 8>(dst, src, bytes);
  else
    copy_detail::cooperative<kUnroll ? kUnroll : 4>(dst, src, bytes, coop.rank(), coop.size());
}
}  // namespace device
#endif

}  // namespace gdx
