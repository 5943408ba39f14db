// The memory shared by a PeerCopyQueue (host side, device/peer_copy_queue.cpp) and its persistent kernel
// (device/copy_queue_kernel.cu). Internal to the library; users see include/gdx/peer_copy_queue.hpp.
//
// Protocol (one host producer at a time, under the queue's mutex; the kernel is the consumer):
//  * Transfers get consecutive tickets t = 0, 1, 2, ... and live in slot t % capacity of a ring of Slots in
//    host-mapped memory. Every 8-byte word of a slot carries, in its top byte, a tag of the ticket's lap around the
//    ring (slotTag). The host stores the words (after a release fence, so what it wrote before is visible first) in
//    any order; a word is single-copy atomic, so a slot whose six words all carry the lap's tag holds that
//    transfer's fields and nothing older. No separate sequence word: the kernel reads a slot in one PCIe round trip.
//  * Only one GPU warp reads host memory: the poller (warp 0 of block 0). It reads kFetch slots per round trip, takes
//    the published prefix, and mirrors it into device memory: a Desc per transfer and the transfer's units of work
//    in the work ring. A transfer of `bytes` is cut into at most `copyBlocks` chunks of at least `minChunkBytes`
//    (chunk sizes are chosen per transfer, so a large transfer keeps every block busy with few chunks and a small
//    one is not split); consecutive small transfers are batched into one unit (up to kGroupMax of them, kGroupBytes
//    in all), which a copy block copies with one team of warps per transfer.
//  * Copy blocks claim unit numbers with one atomicAdd each on `unitCursor` (device memory) and poll their own
//    work entry (a different line for each block, in device memory) until the poller wrote it. An entry is two
//    words, each tagged with the unit's lap around the work ring, so a block reads it in one 16-byte load and
//    trusts it only when both tags match. The work ring holds capacity * copyBlocks entries, every unit any
//    uncompleted transfer can have, so the poller never overwrites an entry a block has yet to read.
//  * Completion: the last chunk of a transfer is found with an acq_rel count in chunksDone (the barrier before it
//    and its acquire carry every chunk's data to the block that completes the count). Whoever completes a
//    transfer either raises its signal at once, when every earlier transfer was already signalled (`signalled` ==
//    its ticket: the fast path, no hand-off), and then marks doneSeq with the `raised` bit; or publishes doneSeq
//    with release for the signaller warp (warp 1 of block 0), which reads 32 doneSeq words at a time, raises the
//    signals of the done prefix in ticket order after one system-scope fence, passes over raised ones, and then
//    publishes `signalled` and, to the host, `completed`. A signal is therefore seen only after its transfer's data
//    and that of every earlier transfer (causality through the chain of releases and acquires is transitive),
//    and a later transfer's kSet of the same word lands after an earlier one's.
//  * A lone small transfer (the round found only it, at most kPollerCopyBytes) on a quiet queue (every earlier
//    transfer signalled, by `signalled` or by the poller itself) skips all of that: the poller copies it, raises its
//    signal and marks doneSeq with `raised`, as a completing block does on its fast path. No Desc, no unit.
//  * The host reuses slot t % capacity only once completed > t - capacity: the poller has long read it.
//  * The kernel runs while there is work; the host sets `stop` once everything submitted completed and the queue
//    stayed idle; the poller then sets `leave` in device memory and every warp leaves. A later submit launches the
//    kernel again; the host clears the device counters and the work ring before each launch, and units and the
//    tickets in device memory count from that launch's first ticket. So a user's cudaDeviceSynchronize() waits at
//    most for the idle period, never forever.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdx/device.hpp"

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx::copy_queue {

// ---- host-mapped memory ----

/// Words of a Slot that carry fields (the other two are padding). Each is tag << 56 | a 56-bit payload.
enum SlotWord : unsigned { kSrcWord, kDstWord, kBytesWord, kSignalWord, kValueLowWord, kValueHighWord, kSlotWords };
constexpr unsigned kTagShift = 56;
constexpr uint64_t kPayloadMask = (uint64_t{1} << kTagShift) - 1;

/// One transfer, written by the host (64 bytes: one PCIe read for the kernel). kValueLowWord holds the low 32 bits
/// of the signal value and the SignalOp in bits 32..39; kValueHighWord the high 32 bits of the value.
struct alignas(64) Slot {
  uint64_t word[8];
};
static_assert(sizeof(Slot) == 64, "one slot per 64-byte line");

/// Tag of ticket t's lap: 1..255, never 0 (a slot never written is all zeros), different for consecutive laps. The
/// capacity is a power of two: shifts and masks, where a 64-bit division by a runtime value is a subroutine call on
/// the GPU, several of which lay on a transfer's way through the poller and the workers.
GDX_HOST_DEVICE_INLINE uint64_t slotTag(uint64_t ticket, uint32_t capacity) {
#if GDX_DEVICE_COMPILE
  const unsigned shift = __ffs(capacity) - 1;
#else
  const unsigned shift = static_cast<unsigned>(__builtin_ctz(capacity));
#endif
  return (ticket >> shift) % 255 + 1;
}
/// Slot index of ticket t.
GDX_HOST_DEVICE_INLINE uint64_t slotOf(uint64_t ticket, uint32_t capacity) {
  return ticket & (capacity - 1);
}

/// Written by the kernel, read by the host (host-mapped).
struct alignas(64) Shared {
  uint64_t completed;  ///< transfers finished and signalled, in ticket order
  uint32_t stop;       ///< set by the host: leave once no transfer is being copied
  uint32_t fault;      ///< set by the kernel when a slot made no sense (kept for the host's error message)
};

// ---- device memory ----

/// A transfer as the poller mirrored it (index: ticket % capacity).
struct alignas(64) Desc {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
  uint64_t signal;  ///< address of the 64-bit signal word; 0: none
  uint64_t value;
  uint64_t chunkBytes;  ///< this transfer's chunk size (a multiple of 16, so chunks keep the alignment)
  uint32_t chunks;      ///< >= 1
  uint32_t signalOp;
};

/// A unit of work in the work ring: words[0] = tag << 48 | ticket - firstTicket, words[1] = tag << 48 |
/// count << 16 | chunk. `count` > 1: that many consecutive single-chunk transfers from the ticket on.
struct alignas(16) Work {
  uint64_t words[2];
};
constexpr unsigned kWorkTagShift = 48;
constexpr uint64_t kWorkPayloadMask = (uint64_t{1} << kWorkTagShift) - 1;

/// Tag of unit u's lap around a work ring of 2^shift entries: never 0 in the first lap, different for consecutive
/// laps.
GDX_HOST_DEVICE_INLINE uint64_t workTag(uint64_t unit, uint32_t shift) {
  return ((unit >> shift) + 1) & 0xFFFF;
}

/// Counters in device memory, each on its own 128-byte line (blocks poll and add to them independently).
struct Control {
  alignas(128) uint64_t unitCursor;  ///< next unit number to claim
  alignas(128) uint64_t signalled;   ///< transfers (from firstTicket) whose signals were raised, in ticket order
  alignas(128) uint32_t leave;       ///< set by the poller when the host stopped the queue
};

/// doneSeq[t % capacity] once transfer t is copied: (t - firstTicket + 1) << 1, | kRaised when its signal was
/// already raised by the block that completed it.
constexpr uint64_t kRaised = 1;

/// Threads of every block; warps per block.
constexpr unsigned kCopyThreads = 512;
constexpr unsigned kWarps = kCopyThreads / 32;
/// Slots the poller reads per round trip (four per warp-wide load, eight lanes per slot).
constexpr unsigned kFetch = 16;
/// Batching of small transfers: members of at most kSmallBytes each, at most kGroupMax per unit (one or more warps
/// each) and kGroupBytes in all.
constexpr uint64_t kSmallBytes = 16 * 1024;
constexpr unsigned kGroupMax = kWarps;
constexpr uint64_t kGroupBytes = 64 * 1024;
/// A transfer of at most this many bytes that the poller finds alone, with every earlier transfer signalled, is
/// copied by the poller itself (kPollerUnroll 16-byte loads in flight per lane: 4 KiB per round trip).
constexpr uint64_t kPollerCopyBytes = 8 * 1024;
constexpr int kPollerUnroll = 8;

/// Where each array lives in the queue's one device allocation. Everything before `desc` is cleared at each launch.
struct DeviceLayout {
  size_t doneSeq, chunksDone, work, desc, total;
};
GDX_HOST_DEVICE_INLINE DeviceLayout deviceLayout(uint32_t capacity, uint64_t workEntries) {
  DeviceLayout l{};
  auto up = [](size_t v) { return (v + 127) & ~size_t{127}; };
  l.doneSeq = up(sizeof(Control));
  l.chunksDone = up(l.doneSeq + sizeof(uint64_t) * capacity);
  l.work = up(l.chunksDone + sizeof(uint32_t) * capacity);
  l.desc = up(l.work + sizeof(Work) * workEntries);
  l.total = l.desc + sizeof(Desc) * capacity;
  return l;
}

struct KernelParams {
  const Slot* slots;  ///< device address of the host-mapped ring (the kernel only reads it)
  Shared* shared;     ///< device address of the host-mapped Shared
  Control* control;   ///< the rest: device memory (deviceLayout)
  uint64_t* doneSeq;
  uint32_t* chunksDone;
  Work* work;
  Desc* desc;
  uint64_t minChunkBytes;  ///< a multiple of 16
  uint64_t firstTicket;    ///< the first ticket not completed when the kernel was launched
  uint32_t capacity;
  uint32_t copyBlocks;
  uint32_t workShift;  ///< the work ring has 2^workShift entries
};

#if defined(GDX_HAVE_CUDA)
/// Launches the persistent kernel: block 0 polls and signals, `copyBlocks` blocks of kCopyThreads copy.
cudaError_t launchKernel(const KernelParams& params, unsigned copyBlocks, cudaStream_t stream);
/// Loads the kernel's code now. With CUDA's lazy loading (the default) the first launch would load it, and loading
/// may wait for the kernels running on the device, such as one waiting for this queue's transfers: a deadlock.
cudaError_t loadKernel();
/// The most copy blocks that are resident together with the control block on `device` (the current device).
unsigned maxCopyBlocks(int device);
#endif

}  // namespace gdx::copy_queue
