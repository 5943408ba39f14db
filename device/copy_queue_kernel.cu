// The persistent kernel of PeerCopyQueue. Block 0 is the control block: its warp 0 (the poller) is the only reader
// of host memory and mirrors published transfers into device memory, its warp 1 (the signaller) raises signals in
// ticket order; the other blocks copy units of work. device/copy_queue_layout.hpp describes the protocol.
#include <cuda/atomic>

#include "device/copy_queue_layout.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/copy.hpp"
#include "gdx/device/impl/ptx.hpp"
#include "gdx/types.hpp"

namespace gdx::copy_queue {
namespace {

template <typename T>
using DeviceRef = cuda::atomic_ref<T, cuda::thread_scope_device>;
constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr auto kDevRelaxed = cuda::std::memory_order_relaxed;

// Acquire for the relaxed loads before it, release for the stores after it: one fence orders a whole batch.
__device__ __forceinline__ void fenceSystem() {
  cuda::atomic_thread_fence(cuda::std::memory_order_acq_rel, cuda::thread_scope_system);
}
__device__ __forceinline__ void fenceDevice() {
  cuda::atomic_thread_fence(cuda::std::memory_order_acq_rel, cuda::thread_scope_device);
}

// A signal update with no ordering of its own: the caller fenced once for a whole batch, and updates of one word
// from one thread keep their program order, so a later kSet of the same word wins.
__device__ __forceinline__ void raiseRelaxed(uint64_t signal, uint64_t value, uint32_t op) {
  uint64_t* w = reinterpret_cast<uint64_t*>(signal);
  if (!w) return;
  if (op == static_cast<uint32_t>(SignalOp::kAdd))
    atomicFetchAdd(w, value, kRelaxed);
  else
    atomicStore(w, value, kRelaxed);
}

// ---- poller: warp 0 of block 0 ----

// Lane s < n holds slot s's transfer; the warp decides, in ticket order, how the transfers become units: a
// transfer of several chunks gets one unit per chunk, consecutive small ones share one unit. On return lane s knows
// its first unit, how many units it has (0: it is a later member of a batch) and how many transfers its unit covers.
struct UnitPlan {
  uint64_t first;
  uint32_t units;
  uint32_t count;
};
__device__ UnitPlan planUnits(unsigned n, uint64_t bytes, uint32_t chunks, uint64_t& unit) {
  const unsigned lane = ptx::laneId();
  UnitPlan mine{0, 0, 0};
  int leader = -1;
  uint32_t groupCount = 0;
  uint64_t groupBytes = 0;
  for (unsigned s = 0; s < n; ++s) {
    const uint64_t b = __shfl_sync(kFullMask, bytes, s);
    const uint32_t c = __shfl_sync(kFullMask, chunks, s);
    const bool small = c == 1 && b <= kSmallBytes;
    if (small && leader >= 0 && groupCount < kGroupMax && groupBytes + b <= kGroupBytes) {
      ++groupCount;
      groupBytes += b;
      if (lane == static_cast<unsigned>(leader)) mine.count = groupCount;
      continue;
    }
    if (lane == s) mine = UnitPlan{unit, c, 1};
    unit += c;
    leader = small ? static_cast<int>(s) : -1;
    groupCount = 1;
    groupBytes = b;
  }
  return mine;
}

// A lone small transfer on a quiet queue, copied by the poller itself: no hand-over to a copy block (a work entry
// the block polls for, the Desc it then reads, two barriers), which is most of a small forward's latency. Every
// earlier transfer was signalled, so the poller raises the signal at once, as finish() does on its fast path.
__device__ void copyAlone(const KernelParams& p, uint64_t ticket, uint64_t src, uint64_t dst, uint64_t bytes,
                          uint64_t signal, uint64_t value, uint32_t op) {
  const unsigned lane = ptx::laneId();
  // Acquire only: the slot words and `signalled` were read, so the data the host published before the slot and the
  // signals raised before `signalled` are seen. Nothing this warp wrote needs ordering here.
  ptx::fenceAcquireSys();
  device::copy<kPollerUnroll>(device::Group{lane, 32}, reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src),
                              bytes);
  __syncwarp();  // every lane's stores before lane 0's fence, whose release is cumulative
  if (lane == 0) {
    ptx::fenceReleaseSys();
    raiseRelaxed(signal, value, op);
    fenceDevice();  // the raise before doneSeq; the signaller's system fence carries it on to `completed`
    DeviceRef<uint64_t>(p.doneSeq[slotOf(ticket, p.capacity)])
        .store(((ticket - p.firstTicket + 1) << 1) | kRaised, kDevRelaxed);
  }
  __syncwarp();
}

__device__ void poller(const KernelParams& p) {
  const unsigned lane = ptx::laneId();
  const unsigned word = lane % 8;  // the slot word this lane reads; lanes reading words 6 and 7 only pad
  const uint64_t workMask = (uint64_t{1} << p.workShift) - 1;
  uint64_t head = p.firstTicket;  // next ticket to mirror
  uint64_t unit = 0;              // next unit number to write
  uint64_t raisedAlone = 0;       // transfers (from firstTicket) up to the last one copyAlone raised
  bool busy = false;              // the last round found work: read all kFetch slots, else the first four only
  for (uint64_t idle = 0;;) {
    uint64_t w[4];
    const int loads = busy ? 4 : 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t t = head + j * 4 + lane / 8;
      w[j] = j < loads && word < kSlotWords
                 ? atomicLoad(const_cast<uint64_t*>(&p.slots[slotOf(t, p.capacity)].word[word]), kRelaxed)
                 : 0;
    }
    const uint32_t stop = lane == 0 ? atomicLoad(&p.shared->stop, kRelaxed) : 0;  // in the same round trip
    // Device memory: answered before the slots are, so it costs the round nothing.
    const uint64_t signalled = lane == 0 ? DeviceRef<uint64_t>(p.control->signalled).load(kDevRelaxed) : 0;
    uint32_t valid = 0;  // bit s: slot head + s carries its lap's tag in every word
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint64_t t = head + j * 4 + lane / 8;
      const bool good = j < loads && (word >= kSlotWords || (w[j] >> kTagShift) == slotTag(t, p.capacity));
      const unsigned m = __ballot_sync(kFullMask, good);
#pragma unroll
      for (int g = 0; g < 4; ++g)
        if (((m >> (8 * g)) & 0xFFu) == 0xFFu) valid |= 1u << (j * 4 + g);
    }
    unsigned n = __ffs(~valid) - 1;  // the published prefix (valid has 16 bits, so ~valid is never 0)
    // Slot s = 4j + g lies in load j, lanes 8g..8g+7: lane s gathers its six words.
    uint64_t f[kSlotWords];
#pragma unroll
    for (unsigned k = 0; k < kSlotWords; ++k) f[k] = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (unsigned k = 0; k < kSlotWords; ++k) {
        const uint64_t v = __shfl_sync(kFullMask, w[j], (lane % 4) * 8 + k);
        if (lane / 4 == static_cast<unsigned>(j)) f[k] = v;
      }
    const uint64_t src = f[kSrcWord] & kPayloadMask, dst = f[kDstWord] & kPayloadMask;
    const uint64_t bytes = lane < n ? f[kBytesWord] & kPayloadMask : 0;
    const unsigned bad = __ballot_sync(kFullMask, lane < n && bytes > 0 && (src == 0 || dst == 0));
    if (bad) {  // the host checks this before publishing: memory was overwritten; stop taking work
      if (lane == 0) atomicStore(&p.shared->fault, 1u, kRelaxed);
      n = 0;
    }
    if (n == 0) {
      busy = false;
      if (__shfl_sync(kFullMask, stop, 0)) {  // set only once every submitted transfer completed
        if (lane == 0) DeviceRef<uint32_t>(p.control->leave).store(1u, kDevRelaxed);
        return;
      }
      if (++idle > 4096) __nanosleep(256);  // after a few ms without work (the host stops the kernel before that)
      continue;
    }
    busy = true;
    idle = 0;
    const uint64_t rel = head - p.firstTicket;
    const uint64_t quiet = __shfl_sync(kFullMask, signalled, 0);
    const uint64_t lone = __shfl_sync(kFullMask, bytes, 0);
    if (n == 1 && lone <= kPollerCopyBytes && (quiet == rel || raisedAlone == rel)) {
      copyAlone(
          p, head, __shfl_sync(kFullMask, src, 0), __shfl_sync(kFullMask, dst, 0), lone,
          __shfl_sync(kFullMask, f[kSignalWord] & kPayloadMask, 0),
          __shfl_sync(kFullMask, (f[kValueHighWord] & 0xFFFFFFFFull) << 32 | (f[kValueLowWord] & 0xFFFFFFFFull), 0),
          __shfl_sync(kFullMask, static_cast<uint32_t>((f[kValueLowWord] >> 32) & 0xFF), 0));
      raisedAlone = rel + 1;
      head += 1;
      continue;
    }
    // One chunk per block at most, each at least minChunkBytes. A chunk of a split transfer is a multiple of 4 KiB,
    // so every chunk of an aligned transfer starts on a whole 128-byte line: 64 MiB cut for 66 blocks in pieces of
    // 16 bytes' granularity left every chunk but the first off the line grid, and each warp's 512-byte stores then
    // touched five lines instead of four (about 6% slower than 32 or 132 blocks on 2 x H100).
    uint32_t chunks = 1;
    uint64_t chunkBytes = (bytes + 15) & ~uint64_t{15};
    if (bytes > p.minChunkBytes) {
      uint64_t c = (bytes + p.minChunkBytes - 1) / p.minChunkBytes;
      if (c > p.copyBlocks) c = p.copyBlocks;
      chunkBytes = ((bytes + c - 1) / c + 4095) & ~uint64_t{4095};
      chunks = static_cast<uint32_t>((bytes + chunkBytes - 1) / chunkBytes);
    }
    const UnitPlan plan = planUnits(n, bytes, chunks, unit);
    const uint64_t ticket = head + lane;
    if (lane < n) {
      Desc& d = p.desc[slotOf(ticket, p.capacity)];
      d.src = src;
      d.dst = dst;
      d.bytes = bytes;
      d.signal = f[kSignalWord] & kPayloadMask;
      d.value = (f[kValueHighWord] & 0xFFFFFFFFull) << 32 | (f[kValueLowWord] & 0xFFFFFFFFull);
      d.chunkBytes = chunkBytes;
      d.chunks = chunks;
      d.signalOp = static_cast<uint32_t>((f[kValueLowWord] >> 32) & 0xFF);
    }
    // Acquire for the slot words read above (what the host wrote before them, the data to copy included), release
    // for the Descs; the barrier carries every lane's acquire to the lanes that write the entries. (Acquire loads of
    // the slot words and a device-scope fence instead made a 4 KiB forward slower on one H100, 8.5 -> 11.5 us.)
    fenceSystem();
    __syncwarp();
    for (uint32_t c = 0; c < plan.units; ++c) {
      const uint64_t u = plan.first + c;
      const uint64_t tag = workTag(u, p.workShift) << kWorkTagShift;
      ptx::storeRelaxedGpu128(p.work[u & workMask].words, tag | (ticket - p.firstTicket),
                              tag | uint64_t{plan.count} << 16 | c);
    }
    head += n;
  }
}

// ---- signaller: warp 1 of block 0 ----

__device__ void signaller(const KernelParams& p) {
  const unsigned lane = ptx::laneId();
  uint64_t rel = 0;  // transfers signalled so far, from firstTicket
  for (uint64_t spins = 0;;) {
    const uint64_t t = p.firstTicket + rel + lane;
    const uint64_t v = DeviceRef<uint64_t>(p.doneSeq[slotOf(t, p.capacity)]).load(kDevRelaxed);
    const uint64_t expect = (rel + lane + 1) << 1;
    const unsigned doneMask = __ballot_sync(kFullMask, (v | kRaised) == (expect | kRaised));
    const unsigned k = doneMask == kFullMask ? 32 : __ffs(~doneMask) - 1;  // the done prefix
    if (k == 0) {
      if ((++spins & 31) == 0 && DeviceRef<uint32_t>(p.control->leave).load(kDevRelaxed)) return;
      if (spins > 64) __nanosleep(spins < 4096 ? 32 : 256);
      continue;
    }
    spins = 0;
    const unsigned toRaise = __ballot_sync(kFullMask, lane < k && !(v & kRaised));
    fenceSystem();  // acquire: the data of the done transfers (and of what their blocks saw); release: the raises
    __syncwarp();
    if (toRaise) {
      uint64_t signal = 0, value = 0;
      uint32_t op = 0;
      if ((toRaise >> lane) & 1) {
        const Desc& d = p.desc[slotOf(t, p.capacity)];
        signal = d.signal;
        value = d.value;
        op = d.signalOp;
      }
      for (unsigned i = 0; i < k; ++i) {  // one lane raises them all, in ticket order
        const uint64_t s = __shfl_sync(kFullMask, signal, i), val = __shfl_sync(kFullMask, value, i);
        const uint32_t o = __shfl_sync(kFullMask, op, i);
        if (lane == 0 && ((toRaise >> i) & 1)) raiseRelaxed(s, val, o);
      }
      fenceSystem();  // the raises are visible before `completed` and `signalled` say so
    }
    rel += k;
    if (lane == 0) {
      atomicStore(&p.shared->completed, p.firstTicket + rel, kRelaxed);
      DeviceRef<uint64_t>(p.control->signalled).store(rel, kDevRelaxed);
    }
  }
}

// ---- copy blocks ----

struct Member {
  uint64_t src, dst, bytes, signal, value;
  uint32_t op;
};
struct Task {
  Member m[kGroupMax];
  uint64_t rel;        // ticket of the first member, from firstTicket
  uint64_t signalled;  // Control::signalled when the task was taken: the fast path applies when it equals rel
  uint32_t count;      // transfers in the unit
  uint32_t chunks;     // chunks of the transfer when count == 1
  int leave;
};

// Warp 0: waits for work entry `u`, fills `task`, and claims the block's next unit (returned) while the block copies.
__device__ uint64_t prepare(const KernelParams& p, uint64_t u, Task& task) {
  const unsigned lane = ptx::laneId();
  uint64_t w0 = 0, w1 = 0;
  int leave = 0;
  if (lane == 0) {
    const uint64_t* e = p.work[u & ((uint64_t{1} << p.workShift) - 1)].words;
    const uint64_t tag = workTag(u, p.workShift);
    for (uint32_t spins = 0;; ++spins) {
      ptx::loadRelaxedGpu128(e, w0, w1);
      if ((w0 >> kWorkTagShift) == tag && (w1 >> kWorkTagShift) == tag) break;
      if ((spins & 31) == 31 && DeviceRef<uint32_t>(p.control->leave).load(kDevRelaxed)) {
        leave = 1;
        break;
      }
      // Idle blocks poll their own entry in device memory; after a while, more gently. The longer nap is paid by the
      // next transfer: half of it on average, before a block starts copying.
      if (spins >= 64) __nanosleep(spins < 2048 ? 64 : 256);
    }
    fenceDevice();  // acquire: the Descs the poller wrote before the entry
  }
  __syncwarp();
  leave = __shfl_sync(kFullMask, leave, 0);
  if (leave) {
    if (lane == 0) task.leave = 1;
    return u;
  }
  w0 = __shfl_sync(kFullMask, w0, 0);
  w1 = __shfl_sync(kFullMask, w1, 0);
  const uint64_t rel = w0 & kWorkPayloadMask;
  const uint32_t count = static_cast<uint32_t>((w1 >> 16) & 0xFFFF), chunk = static_cast<uint32_t>(w1 & 0xFFFF);
  uint64_t next = 0;
  if (lane == 0) next = DeviceRef<uint64_t>(p.control->unitCursor).fetch_add(1, kDevRelaxed);
  if (lane < count) {
    const Desc& d = p.desc[slotOf(p.firstTicket + rel + lane, p.capacity)];
    const uint64_t off = chunk * d.chunkBytes;
    const uint64_t len = d.bytes - off < d.chunkBytes ? d.bytes - off : d.chunkBytes;
    task.m[lane] = Member{d.src + off, d.dst + off, len, d.signal, d.value, d.signalOp};
    if (lane == 0) task.chunks = d.chunks;
  }
  if (lane == 31) task.signalled = DeviceRef<uint64_t>(p.control->signalled).load(kDevRelaxed);
  if (lane == 0) {
    task.rel = rel;
    task.count = count;
    task.leave = 0;
  }
  return __shfl_sync(kFullMask, next, 0);
}

// Thread 0, after the block copied `task`: counts the chunk, and when the unit completed its transfers, raises their
// signals itself (every earlier transfer is signalled) or hands them to the signaller.
__device__ void finish(const KernelParams& p, const Task& task) {
  const uint64_t first = p.firstTicket + task.rel;
  if (task.count == 1 && task.chunks > 1) {
    // The barrier before this and the acq_rel count carry every chunk's data to the block that completes it.
    uint32_t& done = p.chunksDone[slotOf(first, p.capacity)];
    if (DeviceRef<uint32_t>(done).fetch_add(1, cuda::std::memory_order_acq_rel) + 1 < task.chunks) return;
    DeviceRef<uint32_t>(done).store(0, kDevRelaxed);  // published by the release below, before the slot is reused
  }
  const bool raiseHere = task.signalled == task.rel;
  if (raiseHere) {
    fenceSystem();  // cumulative: this transfer's data and, through `signalled`, the earlier transfers' signals
    for (uint32_t i = 0; i < task.count; ++i) raiseRelaxed(task.m[i].signal, task.m[i].value, task.m[i].op);
  }
  // Release, device scope: the data (slow path) or the raised signals (fast path) before the signaller sees doneSeq;
  // the signaller's system-scope fence after it carries them on to its raises and to `completed` (causality is
  // transitive), so this fence need not be a system-scope one of its own.
  fenceDevice();
  for (uint32_t i = 0; i < task.count; ++i)
    DeviceRef<uint64_t>(p.doneSeq[slotOf(first + i, p.capacity)])
        .store(((task.rel + i + 1) << 1) | (raiseHere ? kRaised : 0), kDevRelaxed);
}

__device__ void copyBlock(const KernelParams& p) {
  __shared__ Task task;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t u = 0;  // warp 0: the unit this block works on next
  if (warp == 0) {
    uint64_t first = 0;
    if (lane == 0) first = DeviceRef<uint64_t>(p.control->unitCursor).fetch_add(1, kDevRelaxed);
    u = __shfl_sync(kFullMask, first, 0);
  }
  for (;;) {
    if (warp == 0) u = prepare(p, u, task);
    __syncthreads();
    if (task.leave) return;
    // Member i of a batch is copied by the warps w with w % count == i; a single transfer by the whole block.
    const unsigned count = task.count, member = warp % count;
    const unsigned team = (kWarps - member + count - 1) / count, rank = warp / count;
    const Member& m = task.m[member];
    if (m.bytes)
      device::copy<4>(device::Group{rank * 32 + lane, team * 32}, reinterpret_cast<char*>(m.dst),
                      reinterpret_cast<const char*>(m.src), m.bytes);
    __syncthreads();
    if (threadIdx.x == 0) finish(p, task);
  }
}

__global__ void __launch_bounds__(kCopyThreads) copyQueueKernel(const __grid_constant__ KernelParams p) {
  if (blockIdx.x == 0) {
    const unsigned warp = threadIdx.x / 32;
    if (warp == 0)
      poller(p);
    else if (warp == 1)
      signaller(p);
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

cudaError_t loadKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, copyQueueKernel);
}

cudaError_t launchKernel(const KernelParams& params, unsigned copyBlocks, cudaStream_t stream) {
  copyQueueKernel<<<copyBlocks + 1, kCopyThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace gdx::copy_queue
