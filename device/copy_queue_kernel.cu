// The persistent kernel of PeerCopyQueue: copy blocks take chunks of the published transfers and copy them with
// copyCooperative; one signaller thread completes transfers in ticket order. device/copy_queue_layout.hpp
// describes the protocol.
#include <cuda/atomic>

#include "device/copy_queue_layout.hpp"
#include "gdx/detail/atomic.hpp"
#include "gdx/detail/copy_device.hpp"
#include "gdx/types.hpp"

namespace gdx::copy_queue {
namespace {

template <typename T>
using DeviceRef = cuda::atomic_ref<T, cuda::thread_scope_device>;

// Polls of host memory back off up to this long, so idle blocks read PCIe a few hundred thousand times a second
// at most rather than flooding it.
constexpr unsigned kMaxIdleSleepNs = 2000;

// Thread 0 of a copy block: finds the transfer that owns `chunk`, starting at `ticket` (chunks are taken in
// increasing order, so owners only move forward). False when the queue is stopping or a slot made no sense.
// The block's own chunk is not copied yet, so its owner is not complete: a slot already recycled for a later
// ticket (or being rewritten, seq == kWriting) belonged to a complete transfer, and the search moves past it. A slot
// is read seqlock-style: its fields count only if seq was ticket + 1 both before and after reading them.
__device__ bool findOwner(const KernelParams& p, uint64_t chunk, uint64_t& ticket, Slot& out) {
  for (uint64_t spins = 0;; ++spins) {
    Slot* s = &p.slots[ticket % p.capacity];
    const uint64_t seq = atomicLoad(&s->seq, kAcquire);
    if (seq == ticket + 1) {
      out = *s;
      // Orders the field loads before the second load of seq. A GPU-scope fence suffices to order this thread's
      // own loads and, unlike a system-scope one, does not stall the SM.
      __threadfence();
      if (atomicLoad(&s->seq, kRelaxed) == ticket + 1) {
        if (out.chunks == 0 || chunk < out.firstChunk) {
          atomicStore(&p.shared->fault, 1u, kRelaxed);
          return false;
        }
        if (chunk < out.firstChunk + out.chunks) return true;
      }
      ++ticket;
      spins = 0;
      continue;
    }
    if (seq > ticket + 1) {  // recycled, or being rewritten (kWriting)
      ++ticket;
      spins = 0;
      continue;
    }
    if (atomicLoad(&p.shared->stop, kAcquire)) return false;
    if (spins > 8) __nanosleep(spins * 32 < kMaxIdleSleepNs ? static_cast<unsigned>(spins * 32) : kMaxIdleSleepNs);
  }
}

__device__ void copyBlock(const KernelParams& p) {
  __shared__ Slot slot;
  __shared__ uint64_t chunk;
  __shared__ uint64_t owner;
  __shared__ int leave;
  uint64_t ticket = p.firstTicket;
  if (threadIdx.x == 0) owner = ~uint64_t{0};  // no transfer known yet
  for (;;) {
    if (threadIdx.x == 0) {
      chunk = DeviceRef<uint64_t>(*p.chunkCursor).fetch_add(1, cuda::std::memory_order_relaxed);
      // Most chunks belong to the transfer of the block's previous chunk: no need to read its slot again (it is not
      // complete, since this chunk is not copied yet, so the slot still holds it).
      const bool known = owner == ticket && chunk >= slot.firstChunk && chunk < slot.firstChunk + slot.chunks;
      leave = known ? 0 : !findOwner(p, chunk, ticket, slot);
      owner = ticket;
    }
    __syncthreads();
    if (leave) return;
    const uint64_t off = (chunk - slot.firstChunk) * p.chunkBytes;
    if (off < slot.bytes) {
      const uint64_t left = slot.bytes - off;
      copyCooperative<4>(reinterpret_cast<char*>(slot.dst) + off, reinterpret_cast<const char*>(slot.src) + off,
                         left < p.chunkBytes ? left : p.chunkBytes, threadIdx.x, blockDim.x);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // The barrier above and this acq_rel count carry the block's stores to the block that completes the transfer,
      // whose release carries them to the signaller, whose system-scope release publishes them with the signal
      // (causality is transitive). No system fence per chunk: it stalls the SM for microseconds.
      Progress& pr = p.progress[owner % p.capacity];
      if (DeviceRef<uint32_t>(pr.chunksDone).fetch_add(1, cuda::std::memory_order_acq_rel) + 1 == slot.chunks) {
        pr.chunksDone = 0;
        pr.signal = slot.signal;
        pr.value = slot.value;
        pr.signalOp = slot.signalOp;
        DeviceRef<uint64_t>(pr.doneSeq).store(owner + 1, cuda::std::memory_order_release);
      }
    }
    __syncthreads();  // `slot` is rewritten by the next iteration
  }
}

__device__ void signaller(const KernelParams& p) {
  uint64_t t = p.firstTicket;
  for (uint64_t spins = 0;; ++spins) {
    Progress& pr = p.progress[t % p.capacity];
    if (DeviceRef<uint64_t>(pr.doneSeq).load(cuda::std::memory_order_acquire) == t + 1) {
      uint64_t* word = reinterpret_cast<uint64_t*>(pr.signal);
      if (word && pr.signalOp == static_cast<uint64_t>(SignalOp::kAdd))
        atomicFetchAdd(word, pr.value, kRelease);
      else if (word)
        atomicStore(word, pr.value, kRelease);
      atomicStore(&p.shared->completed, t + 1, kRelease);
      ++t;
      spins = 0;
      continue;
    }
    // The host stops the queue only once every submitted transfer completed.
    if (atomicLoad(&p.shared->stop, kAcquire)) return;
    if (spins > 64) __nanosleep(64);
  }
}

// Block 0 signals (it is scheduled first); the copy blocks must all be resident with it (maxCopyBlocks()).
__global__ void __launch_bounds__(kCopyThreads) copyQueueKernel(const __grid_constant__ KernelParams p) {
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) signaller(p);
    return;
  }
  copyBlock(p);
}

}  // namespace

unsigned maxCopyBlocks(int device) {
  int perSm = 0, sms = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, copyQueueKernel, kCopyThreads, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return static_cast<unsigned>(perSm * sms > 1 ? perSm * sms - 1 : 1);
}

cudaError_t launchKernel(const KernelParams& params, unsigned copyBlocks, cudaStream_t stream) {
  copyQueueKernel<<<copyBlocks + 1, kCopyThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace gdx::copy_queue
