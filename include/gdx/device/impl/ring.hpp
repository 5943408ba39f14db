// The producer side of a command ring: a trivially copyable handle that host threads and GPU threads use to
// enqueue commands for one proxy thread.
//
// Protocol (one ring, many producers, one consumer):
//  * `slots` is an array of `capacity` 16-byte commands (capacity a power of two) in host memory that the
//    GPU can reach (host-mapped pinned memory when CUDA is present).
//  * `head` counts slots ever reserved. A producer reserves n consecutive slots with one fetch_add on head;
//    position p lives in slot p & (capacity - 1) and belongs to lap p / capacity.
//  * `tail` counts slots the consumer has taken out; only the consumer writes it (release). A producer may
//    write position p only once p < tail + capacity. Producers keep `cachedTail`, a copy of tail next to head,
//    and re-read the real tail (over PCIe, for a GPU) only when the ring looks full; on the GPU one waiting
//    thread per ring at a time reads it (the word after cachedTail is that reader's lock, zero when free).
//  * A command is published by storing both of its 8-byte words with the lap bit (bit 63 of each word) set to
//    ((p / capacity) + 1) & 1, after a release fence. Slots start zeroed, so the first lap publishes lap bit 1
//    and a stale command from the previous lap never looks valid. Both words carry the bit, so a consumer
//    that observes only one new half sees a torn command and waits for the other half.
//  * The consumer reads slot tail & (capacity - 1) with acquire loads until both lap bits match, takes the
//    command out and later publishes the new tail. Slots are never cleared; the lap bit alternates.
//  * `completed` counts positions whose operation finished at the source (the proxy advances it in order);
//    flush() waits on it. A rejected or failed command also "completes" (its slot is free again); bit 63 of the
//    word (kCompletedHasFaults) says that the proxy recorded at least one such command on this ring.
//  * Faults are per command and per peer: `faults[peer]` holds the highest position of a command to that peer
//    that the proxy refused (bad window, offset) or whose operation failed (the peer died), and why. A flush of
//    the positions [from, to] of one peer fails when that position is >= from, so a bad command fails the flush
//    that covers it and a later flush of later commands succeeds; other peers' flushes never look at it. (A later
//    command to the same peer that failed before the flush looked also fails it: one record per peer cannot tell
//    whether an earlier one of the range failed too, and reporting too much is safer than too little.)
//  * `error` is the ring's own error word, for what breaks the whole ring: the proxy thread stopped (kShutdown,
//    kProxyError) or a producer left a hole (below). Non-zero, every bounded wait on the ring returns it at once.
// A producer that reserved a slot must publish it; a producer that times out waiting for space leaves a hole
// that the consumer will wait on, which is why a full-ring timeout is reported as an error of the whole ring.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gdx/device.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/command.hpp"
#include "gdx/device/impl/poll.hpp"
#include "gdx/device/impl/ptx.hpp"
#include "gdx/status.hpp"

namespace gdx {

/// Sets a sticky error word unless an earlier error is already there (the first cause is the useful one).
GDX_HOST_DEVICE_INLINE void setErrorOnce(uint32_t* word, Status status) {
#if GDX_HAVE_LIBCUXX
  uint32_t expected = 0;
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*word).compare_exchange_strong(
      expected, static_cast<uint32_t>(status), cuda::std::memory_order_acq_rel);
#else
  uint32_t expected = 0;
  __atomic_compare_exchange_n(word, &expected, static_cast<uint32_t>(status), false, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
#endif
}

/// The proxy's record of the failed commands to one peer on one ring (host memory, written by the consumer only).
struct RingFault {
  uint64_t lastFailed;  ///< highest position of a failed command to the peer, plus one; 0: none
  uint32_t status;      ///< why that command failed (kProxyError: refused; else the transport's Status)
  uint32_t reserved;
};
/// Set in `completed` once the ring holds any RingFault: only then does a flush read the peer's record.
constexpr uint64_t kCompletedHasFaults = uint64_t{1} << 63;

struct RingDeviceHandle {
  Command* slots;
  uint64_t* head;        ///< producers' reservation counter
  uint64_t* cachedTail;  ///< producers' last seen tail (same memory as head)
  uint64_t* tail;        ///< consumer-published tail (host memory)
  uint64_t* completed;   ///< positions completed at the source, in order (host memory)
  uint32_t* error;       ///< the ring's error word: a Status, kOk while the ring works (host memory)
  uint64_t capacity;     ///< power of two
  uint64_t timeoutNs;    ///< bound for every wait a producer makes
  RingFault* faults;     ///< one record per peer (host memory); null for a ring made without peers
  uint32_t numPeers;     ///< entries of `faults`

  /// Positions completed so far (the count in `completed`, without its flag).
  GDX_HOST_DEVICE_INLINE uint64_t completedPositions() const {
    return atomicLoad(completed, kAcquire) & ~kCompletedHasFaults;
  }

  /// ((pos / capacity) + 1) & 1 for a power-of-two capacity, without the division: a 64-bit division by a value
  /// the compiler cannot see is a subroutine call on the GPU, about 0.1 us of every push.
  GDX_HOST_DEVICE_INLINE static uint64_t lapOf(uint64_t pos, uint64_t capacity) { return (pos & capacity) ? 0 : 1; }

#if GDX_DEVICE_COMPILE
  // The error word and the clock are read every this many spins (+1) of a full-ring wait: on the GPU the error
  // word is a read over PCIe, and thousands of waiting warps must not flood it.
  static constexpr uint64_t kErrorCheckEvery = 255;
#else
  static constexpr uint64_t kErrorCheckEvery = 15;
#endif

  /// Reads the consumer's tail into cachedTail and returns the newest tail known (`seen` if none is newer).
  /// On the GPU only one waiting thread per ring reads it (the word after cachedTail is its lock): when a
  /// kernel's thousands of warps wait for space at once, their reads over PCIe would queue behind each other
  /// and every one of them would see the tail microseconds late, while the consumer waits in order for the
  /// slots they reserved. The others watch cachedTail, which stays in GPU memory.
  GDX_HOST_DEVICE_INLINE uint64_t refreshTail(uint64_t seen) const {
#if GDX_DEVICE_COMPILE
    unsigned long long* reader = reinterpret_cast<unsigned long long*>(cachedTail + 1);
    if (atomicLoad(reader, kRelaxed) != 0 || atomicCAS(reader, 0ull, 1ull) != 0ull) return seen;
    const uint64_t t = atomicLoad(tail, kAcquire);
    atomicFetchMax(cachedTail, t, kRelaxed);
    atomicStore(reader, 0ull, kRelease);
    return t > seen ? t : seen;
#else
    const uint64_t t = atomicLoad(tail, kAcquire);
    if (t > seen) atomicFetchMax(cachedTail, t, kRelaxed);
    return t > seen ? t : seen;
#endif
  }

  /// Reserves `n` consecutive positions; returns the first in *pos. Waits (bounded) until they are free.
  /// On the device, the threads of a warp that reserve on the same ring at the same time are served by one
  /// atomic on head (warp aggregation), which is what lets many warps reach tens of millions of commands/s.
  /// On the device it also issues the publish's system release fence, while the atomic is in flight: the fence
  /// waits for the caller's earlier writes (the data of a put) to reach the system, the atomic for its answer from
  /// L2, and the two waits overlap instead of following each other. The commands stored after it (publish) are then
  /// plain stores: fence then store is the release pattern.
  GDX_HOST_DEVICE_INLINE Status reserve(uint32_t n, uint64_t* pos) const {
    // Read before reserving, so that this load overlaps the atomic below instead of waiting for its answer (on the
    // GPU each is a round trip to L2, most of what a lone producer's push costs beyond its store). The cached tail
    // only grows: a value older than the reservation can only send the check below to the slow path.
    const uint64_t cached = atomicLoad(cachedTail, kRelaxed);
#if GDX_DEVICE_COMPILE
    const unsigned active = __activemask();
    const unsigned group = __match_any_sync(active, reinterpret_cast<unsigned long long>(head));
    const unsigned pairs = __ballot_sync(group, n == 2) & group;
    const unsigned lane = ptx::laneId();
    const unsigned leader = __ffs(group) - 1;
    const unsigned lower = group & ((1u << lane) - 1);
    const uint64_t total = __popc(group) + __popc(pairs);
    uint64_t base = 0;
    if (lane == leader) base = atomicFetchAdd(head, total, kRelaxed);
    ptx::fenceReleaseSys();  // before the shuffle, which waits for the atomic's answer
    base = __shfl_sync(group, base, leader);
    uint64_t p = base + __popc(lower) + __popc(lower & pairs);
#else
    uint64_t p = atomicFetchAdd(head, static_cast<uint64_t>(n), kRelaxed);
#endif
    *pos = p;
    uint64_t last = p + n - 1;
    if (last < cached + capacity) return Status::kOk;
    uint64_t t = cached;
    return detail::pollBounded(
        timeoutNs, kErrorCheckEvery, 0,
        [&](uint64_t, Status&) {
          // Another producer may have refreshed the cached copy already; only then pay for reading the real tail.
          t = atomicLoad(cachedTail, kRelaxed);
          if (last >= t + capacity) t = refreshTail(t);
          return last < t + capacity;
        },
        [&](Status& s) {
          s = static_cast<Status>(atomicLoad(error, kRelaxed));
          return s != Status::kOk;
        },
        [&] {
          // This position is reserved and will never be published, so the consumer stops at it: the whole ring is
          // broken from here on, and every other wait on it must say so instead of timing out too.
          setErrorOnce(error, Status::kTimeout);
          return Status::kTimeout;
        },
        [&](uint64_t spins) { waitForSlots(spins, last + 1 - (t + capacity)); });
  }

  /// Publishes `c` at position `pos` (which the caller reserved; on the device reserve() fenced).
  GDX_HOST_DEVICE_INLINE void publish(uint64_t pos, const Command& c) const {
    Command v = c.withLap(lapOf(pos, capacity));
    Command* slot = &slots[pos & (capacity - 1)];
#if GDX_DEVICE_COMPILE
    ptx::relaxedStore128Sys(slot->word, v.word[0], v.word[1]);
#else
    // Release on the last word orders everything the producer wrote before (the data a put refers to)
    // before the command; the other word may become visible first, which the lap bits make harmless.
    atomicStore(&slot->word[1], v.word[1], kRelease);
    atomicStore(&slot->word[0], v.word[0], kRelease);
#endif
  }

  /// Reserves and publishes one command (two slots for a putWithSignal pair: use pushPair).
  GDX_HOST_DEVICE_INLINE Status push(const Command& c, uint64_t* posOut = nullptr) const {
    uint64_t pos;
    Status s = reserve(1, &pos);
    if (s != Status::kOk) return s;
    publish(pos, c);
    if (posOut) *posOut = pos;
    return Status::kOk;
  }
  /// Reserves two consecutive slots and publishes a putWithSignal command and its signal.
  GDX_HOST_DEVICE_INLINE Status pushPair(const Command& first, const Command& second,
                                         uint64_t* lastPos = nullptr) const {
    uint64_t pos;
    Status s = reserve(2, &pos);
    if (s != Status::kOk) return s;
#if GDX_DEVICE_COMPILE
    // One system fence for both slots (reserve's): the consumer takes the pair only when both are valid, so the
    // order in which the two stores arrive does not matter.
    Command a = first.withLap(lapOf(pos, capacity)), b = second.withLap(lapOf(pos + 1, capacity));
    ptx::relaxedStore128Sys(slots[pos & (capacity - 1)].word, a.word[0], a.word[1]);
    ptx::relaxedStore128Sys(slots[(pos + 1) & (capacity - 1)].word, b.word[0], b.word[1]);
#else
    publish(pos, first);
    publish(pos + 1, second);
#endif
    if (lastPos) *lastPos = pos + 1;
    return Status::kOk;
  }

  /// Waits (bounded) until every position <= pos completed at the source; kOk unless the ring's error word is set
  /// (whatever the commands were).
  GDX_HOST_DEVICE_INLINE Status waitCompleted(uint64_t pos) const {
    return waitCompleted(pos, ~uint64_t{0}, 0, nullptr);
  }

  /// A flush of one peer's commands: waits (bounded) until every position <= `to` completed at the source, then
  /// returns kOk unless a command to `peer` at a position >= `from` failed (its RingFault's status; see the header
  /// comment). Ends early with the ring's error, or with `*peerFailure` (the peer's failure word; may be null) once
  /// that is set: a dead peer's operations are not waited for.
  GDX_HOST_DEVICE_INLINE Status waitCompleted(uint64_t to, uint64_t from, uint32_t peer,
                                              const uint32_t* peerFailure) const {
    return detail::pollBounded(
        timeoutNs, 63, 0,
        [&](uint64_t, Status& s) {
          const uint32_t e = atomicLoad(error, kAcquire);
          if (e != 0) {
            s = static_cast<Status>(e);
            return true;
          }
          const uint64_t c = atomicLoad(completed, kAcquire);
          if ((c & ~kCompletedHasFaults) <= to) return false;
          // The flag is in the word just read, so a ring without faults costs no further read.
          if (!(c & kCompletedHasFaults) || !faults || peer >= numPeers) return true;
          const uint64_t failed = atomicLoad(&faults[peer].lastFailed, kAcquire);
          if (failed > from) s = static_cast<Status>(atomicLoad(&faults[peer].status, kRelaxed));
          return true;
        },
        [&](Status& s) {
          if (peerFailure) {
            const uint32_t f = atomicLoad(const_cast<uint32_t*>(peerFailure), kAcquire);
            if (f != 0) {
              s = static_cast<Status>(f);
              return true;
            }
          }
          return false;
        },
        [] { return Status::kTimeout; }, [](uint64_t spins) { spinPause(spins); });
  }
};

static_assert(std::is_trivially_copyable<RingDeviceHandle>::value, "handles are passed to kernels by value");

}  // namespace gdx
