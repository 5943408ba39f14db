// Cooperation types: which threads call a device operation together, passed as its last argument (as NCCL's
// ncclCoopThread / ncclCoopWarp / ncclCoopCta, or MSCCL++'s threadId and numThreads), so that each operation is one
// function whose threads are a parameter instead of a name per group size.
//  * Thread: the calling thread alone (the default).
//  * Warp: every lane of the warp, all with the same arguments (NCCL's ncclCoopWarp): 32 lanes, or the lanes that a
//    block's last warp has when the block's size is not a multiple of 32. The lanes need not arrive together (one may
//    call a loop trip later than another): the group is the warp, not the lanes that happen to be active, so each
//    lane's share of a copy and the one lane that enqueues or signals are the same whatever the compiler converged.
//    Lanes are numbered by %laneid, so any block shape works.
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
  /// The lanes of the calling thread's warp that exist: all 32 unless the block's size is not a multiple of 32 and this
  /// is its last warp (warps are cut from the linear thread index, whose low five bits are %laneid). Not
  /// __activemask(): that names the lanes the compiler happens to run together at the call, and lanes split over two
  /// passes would each take a whole copy and enqueue or signal once per pass.
  GDX_DEVICE_INLINE static unsigned lanes() {
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    if ((threads & 31u) == 0) return 0xffffffffu;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned n = threads - (tid & ~31u);
    return n >= 32 ? 0xffffffffu : (1u << n) - 1;
  }
  GDX_DEVICE_INLINE uint64_t rank() const {
    return ptx::laneId();
  }
  GDX_DEVICE_INLINE uint64_t size() const {
    return __popc(lanes());
  }
  GDX_DEVICE_INLINE void sync() const {
    __syncwarp(lanes());
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
