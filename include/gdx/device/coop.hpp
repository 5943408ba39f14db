// Cooperation types: which threads call a device operation together, passed as its last argument (as NCCL's
// ncclCoopThread / ncclCoopWarp / ncclCoopCta, or MSCCL++'s threadId and numThreads), so that each operation is one
// function whose threads are a parameter instead of a name per group size.
//  * Thread: the calling thread alone (the default).
//  * Warp: every active lane of a converged warp, all with the same arguments. Lanes are numbered by %laneid among
//    the active ones, so any block shape works.
//  * Block: every thread of the block, all with the same arguments; the operation contains __syncthreads.
//  * Group: `size` threads that each name their own `rank` in [0, size), for the copy primitive (a warp of a block
//    shaped by the caller, a grid).
// The types are empty (Group: two integers) and trivially copyable; their members are device functions.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/impl/ptx.hpp"

namespace gdx::device {

struct Thread {
#if defined(__CUDACC__)
  GDX_DEVICE_INLINE uint64_t rank() const {
    return 0;
  }
  GDX_DEVICE_INLINE uint64_t size() const {
    return 1;
  }
  GDX_DEVICE_INLINE void sync() const {}
#endif
};

struct Warp {
#if defined(__CUDACC__)
  /// This lane's index among the active lanes.
  GDX_DEVICE_INLINE uint64_t rank() const {
    const unsigned mask = __activemask();
    return __popc(mask & ((1u << ptx::laneId()) - 1));
  }
  GDX_DEVICE_INLINE uint64_t size() const {
    return __popc(__activemask());
  }
  GDX_DEVICE_INLINE void sync() const {
    __syncwarp(__activemask());
  }
#endif
};

struct Block {
#if defined(__CUDACC__)
  GDX_DEVICE_INLINE uint64_t rank() const {
    return threadIdx.x + blockDim.x * (threadIdx.y + uint64_t(blockDim.y) * threadIdx.z);
  }
  GDX_DEVICE_INLINE uint64_t size() const {
    return uint64_t(blockDim.x) * blockDim.y * blockDim.z;
  }
  GDX_DEVICE_INLINE void sync() const {
    __syncthreads();
  }
#endif
};

struct Group {
  uint64_t threadRank;  ///< this thread's index in the group, in [0, numThreads)
  uint64_t numThreads;
#if defined(__CUDACC__)
  GDX_DEVICE_INLINE uint64_t rank() const {
    return threadRank;
  }
  GDX_DEVICE_INLINE uint64_t size() const {
    return numThreads;
  }
#endif
};

/// True for the cooperation types the channel's operations take (Group is for copies only).
template <typename T>
constexpr bool kIsChannelCoop =
    std::is_same<T, Thread>::value || std::is_same<T, Warp>::value || std::is_same<T, Block>::value;

static_assert(std::is_trivially_copyable<Group>::value, "passed by value");

}  // namespace gdx::device

namespace gdx::detail {
/// Lets a channel operation's overload take part only for a cooperation type, so that a put's other arguments are
/// never taken for one.
template <typename T>
using IfChannelCoop = std::enable_if_t<device::kIsChannelCoop<T>>;
}  // namespace gdx::detail
