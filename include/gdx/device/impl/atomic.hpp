// System-scope atomics shared by host and device code. Memory that the GPU and the CPU both touch (rings,
// counters, signals) is accessed only through these helpers, with an explicit memory order, never through
// `volatile`. With libcu++ available (it ships with CUDA as part of CCCL) they are cuda::atomic_ref with
// thread_scope_system; a host-only build without CUDA headers falls back to the GCC/Clang __atomic builtins,
// which have the same semantics for the host.
#pragma once

#include <cstdint>

#include "gdx/device.hpp"

#if defined(__CUDACC__) || __has_include(<cuda/atomic>)
#include <cuda/atomic>
#define GDX_HAVE_LIBCUXX 1
#else
#define GDX_HAVE_LIBCUXX 0
#endif

namespace gdx {

#if GDX_HAVE_LIBCUXX
using MemoryOrder = cuda::std::memory_order;
constexpr MemoryOrder kRelaxed = cuda::std::memory_order_relaxed;
constexpr MemoryOrder kAcquire = cuda::std::memory_order_acquire;
constexpr MemoryOrder kRelease = cuda::std::memory_order_release;
constexpr MemoryOrder kAcqRel = cuda::std::memory_order_acq_rel;

template <typename T>
GDX_HOST_DEVICE_INLINE T atomicLoad(T* p, MemoryOrder order) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).load(order);
}
template <typename T>
GDX_HOST_DEVICE_INLINE void atomicStore(T* p, T v, MemoryOrder order) {
  cuda::atomic_ref<T, cuda::thread_scope_system>(*p).store(v, order);
}
template <typename T>
GDX_HOST_DEVICE_INLINE T atomicFetchAdd(T* p, T v, MemoryOrder order) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).fetch_add(v, order);
}
template <typename T>
GDX_HOST_DEVICE_INLINE T atomicFetchMax(T* p, T v, MemoryOrder order) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*p).fetch_max(v, order);
}
#else
enum MemoryOrder : int {
  kRelaxed = __ATOMIC_RELAXED,
  kAcquire = __ATOMIC_ACQUIRE,
  kRelease = __ATOMIC_RELEASE,
  kAcqRel = __ATOMIC_ACQ_REL
};
template <typename T>
inline T atomicLoad(T* p, MemoryOrder order) {
  return __atomic_load_n(p, order);
}
template <typename T>
inline void atomicStore(T* p, T v, MemoryOrder order) {
  __atomic_store_n(p, v, order);
}
template <typename T>
inline T atomicFetchAdd(T* p, T v, MemoryOrder order) {
  return __atomic_fetch_add(p, v, order);
}
template <typename T>
inline T atomicFetchMax(T* p, T v, MemoryOrder order) {
  T cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, order, __ATOMIC_RELAXED)) {
  }
  return cur;
}
#endif

}  // namespace gdx
