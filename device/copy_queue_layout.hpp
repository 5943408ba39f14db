// The memory shared by a PeerCopyQueue (host side, device/peer_copy_queue.cpp) and its persistent kernel
// (device/copy_queue_kernel.cu). Internal to the library; users see include/gdx/peer_copy_queue.hpp.
//
// Protocol (one host producer at a time, under the queue's mutex; the kernel is the consumer):
//  * Transfers get consecutive tickets t = 0, 1, 2, ... and live in slot t % capacity of a ring of Slots in
//    host-mapped memory. The host marks the slot kWriting, fills its fields, then stores seq = t + 1 with release;
//    the kernel takes the fields only if seq read t + 1 both before and after it read them (a seqlock: a block
//    that lags behind may look at a slot the host is recycling).
//  * A transfer is cut into chunks of `chunkBytes` (a signal-only transfer is one empty chunk). The chunks of all
//    transfers form one sequence: transfer t owns chunks [firstChunk, firstChunk + chunks). Copy blocks take
//    chunk numbers from `chunkCursor` (device memory, one atomicAdd per chunk), wait for the transfer that owns
//    the chunk to be published, copy it, and count it in chunksDone[t % capacity]; the block that completes the
//    count resets it and publishes doneSeq[t % capacity] = t + 1 (release), with the transfer's signal beside it.
//  * One signaller thread completes transfers in ticket order: it waits for doneSeq of the next ticket, raises
//    that transfer's signal with a system-scope release atomic (so whoever sees the signal sees the data, and
//    the data of every earlier transfer of the queue), then publishes completed = t + 1 to the host.
//  * The host reuses slot t % capacity only once completed > t - capacity, so a slot (and its counters) is
//    never rewritten while the kernel may still read it.
//  * The kernel runs while there is work; the host sets `stop` once everything submitted completed and the
//    queue stayed idle, every block then leaves, and a later submit launches the kernel again (chunkCursor is
//    reset to the first unpublished chunk at each launch). So a user's cudaDeviceSynchronize() waits at most
//    for the idle period, never forever.
#pragma once

#include <cstdint>

#if defined(GDX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gdx::copy_queue {

constexpr uint64_t kWriting = ~uint64_t{0};  ///< Slot::seq while the host rewrites the slot

/// One transfer, in host-mapped memory, written by the host (64 bytes: one PCIe burst for the kernel).
struct alignas(64) Slot {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
  uint64_t signal;  ///< device address of the 64-bit signal word to update; 0: none
  uint64_t value;
  uint64_t firstChunk;  ///< first chunk of this transfer in the queue's chunk sequence
  uint32_t chunks;      ///< >= 1
  uint32_t signalOp;    ///< a SignalOp (used when `signal` is not 0)
  uint64_t seq;         ///< ticket + 1 once the fields above are valid (written last, release)
};
static_assert(sizeof(Slot) == 64, "one slot per 64-byte line");

/// Written by the kernel, read by the host (host-mapped).
struct alignas(64) Shared {
  uint64_t completed;  ///< transfers finished and signalled, in ticket order
  uint32_t stop;       ///< set by the host: leave once no transfer is being copied
  uint32_t fault;      ///< set by the kernel when a slot made no sense (kept for the host's error message)
};

/// Device memory, one entry per slot.
struct Progress {
  uint32_t chunksDone;
  uint32_t pad;
  uint64_t doneSeq;  ///< ticket + 1 once every chunk of the transfer is copied
  uint64_t signal;   ///< the slot's signal fields, copied here so the signaller reads device memory only
  uint64_t value;
  uint64_t signalOp;
};

struct KernelParams {
  Slot* slots;            ///< device address of the host-mapped ring (the kernel only reads it)
  Shared* shared;         ///< device address of the host-mapped Shared
  Progress* progress;     ///< device memory, `capacity` entries
  uint64_t* chunkCursor;  ///< device memory
  uint64_t chunkBytes;    ///< a multiple of 16, so every chunk keeps its transfer's alignment
  uint32_t capacity;
  uint64_t firstTicket;  ///< the first ticket not completed when the kernel was launched
};

/// Threads of a copy block.
constexpr unsigned kCopyThreads = 512;

#if defined(GDX_HAVE_CUDA)
/// Launches the persistent kernel: `copyBlocks` blocks of kCopyThreads copy, one more block signals.
cudaError_t launchKernel(const KernelParams& params, unsigned copyBlocks, cudaStream_t stream);
/// The most copy blocks that are resident together with the signalling block on `device` (the current device).
unsigned maxCopyBlocks(int device);
#endif

}  // namespace gdx::copy_queue
