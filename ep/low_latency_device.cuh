// What the low-latency kernels (ep/low_latency_dispatch.cu, ep/low_latency_combine.cu, ep/low_latency_mask.cu) share:
// the wait for the kernel before them, the masks, the tagged words and the bounded waits that mask a rank instead of
// hanging, the buffer-freed handshake, the warp prefix sums, and the launch with programmatic serialization. Each of
// those files is one kernel's translation unit (device code is not linked across them), so these live in a header.
// Protocol: ep/low_latency_protocol.hpp.
#pragma once

#include <cub/warp/warp_scan.cuh>

#include "ep/device_common.cuh"
#include "ep/low_latency_protocol.hpp"

namespace gdx::ep::detail {

__device__ inline LlCtrl* llCtrl(const char* base) {
  return reinterpret_cast<LlCtrl*>(const_cast<char*>(base));
}

/// The first thing every kernel here does: wait until the kernel before it in the stream has ended and its writes are
/// visible (at once without programmatic launch). Each kernel reads state the previous one wrote (the epochs, the
/// caller's inputs), so nothing may come before the wait; the next kernel makes the same wait, so no kernel here ever
/// starts reading before the one it follows has ended. With LlTeam::nextKernelEarly it then lets the next kernel be
/// launched (after every block started: the next kernel's blocks, which only wait, never keep one of these from
/// running); otherwise the next one starts as this one's blocks exit.
__device__ inline void followPreviousKernel(bool nextKernelEarly) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  if (nextKernelEarly) cudaTriggerProgrammaticLaunchCompletion();
#endif
}

__device__ inline bool isMasked(const LlTeam& lt, int r) {
  return (atomicLoad(&lt.ll->mask, kRelaxed) >> r) & 1u;
}

/// Masks rank r for good (a wait on it failed or timed out, or a put to it was refused): later waits on it end at once,
/// nothing more is sent to it, maskedRanks() names it, and no unmask brings it back (it missed this call).
__device__ inline void maskRank(const LlTeam& lt, int r) {
  atomicOr(&lt.ll->failedMask, 1u << r);
  atomicOr(&lt.ll->mask, 1u << r);
  lt.maskHost[r] = kMaskedByKernel;  // host-mapped, read by the host without synchronisation
}

/// A tagged word (dispatch counts, combine weights) is (epochTag(e) << 32) | a 32-bit value, written by the call of
/// epoch e. The tag is never 0, which a word never written holds, and differs between any two epochs less than
/// 2^32 - 1 apart, so a reader takes the word once its tag equals its own epoch's: after any number of calls (the
/// 64-bit epoch itself does not fit beside the value, and its low 32 bits compared with >= would stop matching after
/// 2^32 calls, a few days of decoding).
__device__ inline uint64_t epochTag(uint64_t e) {
  return e % 0xffffffffull + 1;
}
__device__ inline uint64_t taggedWord(uint64_t e, uint32_t value) {
  return epochTag(e) << 32 | value;
}
/// How a waited-for word is compared with the epoch wanted: a flag or stamp (the epoch, 64 bits) with >=, a tagged
/// word by its tag.
enum class WordKind { kEpoch, kTagged };
__device__ inline bool wordReached(uint64_t word, uint64_t want, WordKind kind) {
  return kind == WordKind::kTagged ? (word >> 32) == epochTag(want) : word >= want;
}

/// Waits until `word` reaches `want` (wordReached) for rank `peer`. False (rank masked) when it is or becomes masked,
/// when it failed (its own failure word: nothing more of it can arrive), or after GDX_TIMEOUT_MS.
__device__ inline bool waitOrMask(const LlTeam& lt, int peer, const uint64_t* word, uint64_t want, WordKind kind) {
  uint64_t failureSeen = 0;
  const Status s = gdx::detail::pollBounded(
      lt.t.timeoutNs, 63, 63,
      [&](uint64_t, Status&) { return wordReached(atomicLoad(const_cast<uint64_t*>(word), kAcquire), want, kind); },
      [&](uint64_t now, Status& ended) {
        ended = Status::kPeerFailed;
        if (isMasked(lt, peer)) return true;
        if (failureSeen == 0) failureSeen = now;
        // That rank's own failure word (a failed peer masks only itself), once a millisecond from the first: it is
        // host memory, and reading it in waits of a few microseconds (every 64 polls, or every 20 us) stalled calls by
        // 100-200 us, each stall making the other rank's next waits long enough to read it too.
        const uint32_t* pf = lt.peerFailure[peer];
        uint32_t f = 0;
        if (pf && now - failureSeen >= 1000000) {
          f = atomicLoad(const_cast<uint32_t*>(pf), kRelaxed);
          failureSeen = now;
        }
        if (f == 0) return false;
        maskRank(lt, peer);
        return true;
      },
      [&] {
        maskRank(lt, peer);
        return Status::kTimeout;
      },
      [](uint64_t spins) {
        if (spins > 256) __nanosleep(32);
      });
  return s == Status::kOk;
}

/// Whether rank `peer`'s word has reached `want` (wordReached), waiting (waitOrMask) only when the first look says not:
/// false when the rank is or becomes masked. The mask and the word are both loaded before either is looked at, the
/// word last (an acquire load stalls until it is answered): with the caller's epoch load before them, one round trip
/// to memory where checking each before loading the next cost three, on every kernel's critical path.
__device__ inline bool reachedOrWait(const LlTeam& lt, int peer, const uint64_t* word, uint64_t want, WordKind kind) {
  const uint32_t masked = atomicLoad(&lt.ll->mask, kRelaxed);
  const uint64_t seen = atomicLoad(const_cast<uint64_t*>(word), kAcquire);
  if ((masked >> peer) & 1u) return false;
  return wordReached(seen, want, kind) || waitOrMask(lt, peer, word, want, kind);
}

/// The value of rank `peer`'s tagged word once its tag is epoch e's, waiting (waitOrMask) only when the first look says
/// not; false when the rank is or becomes masked first. Relaxed loads: the word carries its value with its tag.
__device__ inline bool taggedValue(const LlTeam& lt, int peer, const uint64_t* word, uint64_t e, uint32_t* value) {
  uint64_t v = atomicLoad(const_cast<uint64_t*>(word), kRelaxed);
  if (!wordReached(v, e, WordKind::kTagged)) {
    if (!waitOrMask(lt, peer, word, e, WordKind::kTagged)) return false;
    v = atomicLoad(const_cast<uint64_t*>(word), kRelaxed);
  }
  *value = uint32_t(v);
  return true;
}

/// Whether source s's word of epoch e counts in this call, decided once for the whole grid (LlState::recvVerdict): the
/// first block to decide records what its own wait saw (`here`), every other block takes that record. A source whose
/// word lands just as another block's wait for it times out is then in every block's view or in none: no row or token
/// is assembled from some pieces with it and some without. A block that takes "arrived" from the record acquired it,
/// released after the recording block's acquire of the word, so it sees what the word announced.
__device__ inline bool agreedArrival(const LlTeam& lt, int s, bool here, uint64_t e) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_device> verdict(lt.ll->recvVerdict[s]);
  uint64_t cur = verdict.load(cuda::std::memory_order_acquire);
  while ((cur >> 1) != e &&
         !verdict.compare_exchange_weak(cur, e << 1 | uint64_t(here), cuda::std::memory_order_acq_rel,
                                        cuda::std::memory_order_acquire)) {
  }
  return (cur >> 1) == e ? (cur & 1) != 0 : here;
}

/// Lane r of the block's last warp waits (reachedOrWait) until rank r's word, wordOf(r) (null: none), reaches `want`
/// (for the `tagged` ranks, its high 32 bits); returns, on every thread, the ranks whose wait found them masked (or
/// masked them): what the block then goes by, with no load of LlState::mask after the waits (one memory latency more
/// on the path of a decode-size call). No barrier comes before the waits, so loads the other warps issued before the
/// call overlap them. `agree`: the receive kernels' waits for epoch `want`, whose outcome per rank is the grid's
/// (agreedArrival), not the block's. `waitCost` (null: none): lane r adds the clock64() cycles of its wait for a rank
/// not masked when it started (LowLatencyDispatchOutputs::waitRecvCostStats).
template <typename WordOf>
__device__ inline uint32_t lastWarpWaits(const LlTeam& lt, WordOf wordOf, uint64_t want, bool agree = false,
                                         uint32_t tagged = 0, int64_t* waitCost = nullptr) {
  static_assert(kMaxRanks <= 32, "one warp waits for every rank");
  __shared__ uint32_t masked;
  if (threadIdx.x >= blockDim.x - 32) {
    const int r = int(threadIdx.x & 31);
    const uint64_t* word = r < lt.t.numRanks ? wordOf(r) : nullptr;  // null: nothing to wait for
    const bool timed = waitCost && word && !isMasked(lt, r);
    const long long start = timed ? clock64() : 0;
    bool ok = !word || reachedOrWait(lt, r, word, want, (tagged >> r) & 1u ? WordKind::kTagged : WordKind::kEpoch);
    if (timed) atomicAdd(reinterpret_cast<unsigned long long*>(waitCost + r), (unsigned long long)(clock64() - start));
    if (agree && r < lt.t.numRanks) ok = agreedArrival(lt, r, ok, want);
    const uint32_t off = __ballot_sync(0xffffffffu, !ok);
    if (r == 0) masked = off;
  }
  __syncthreads();
  return masked;
}

/// Every block: waits until each rank r finished reading what this rank sent it two calls ago (the buffer of epoch e
/// is then free everywhere). Masks what times out; returns the ranks found masked (lastWarpWaits).
__device__ inline uint32_t waitFreed(const LlTeam& lt, uint64_t e) {
  const auto freedOf = [&](int r) -> const uint64_t* {
    return isRemote(lt.t, r) ? &lt.t.netSignals[lt.freedSignal + r] : &llCtrl(lt.t.base[lt.t.rank])->freed[r];
  };
  return lastWarpWaits(lt, freedOf, e > 2 ? e - 2 : 0);  // the first two calls wait for nothing (words are >= 0)
}

/// Signal signalBase + this rank := e to rank d of another host, on the ring of this rank's puts to d (after them);
/// masks d if the signal is refused.
__device__ inline void signalRemoteRank(const LlTeam& lt, int d, uint32_t signalBase, uint64_t e) {
  ChannelDeviceHandle ch = lt.t.net[d];
  if (ch.signal(signalBase + lt.t.rank, e, SignalOp::kSet) != Status::kOk) maskRank(lt, d);
}

/// Thread d of the calling block tells rank d (unless masked) that this rank's word reads e: a store into wordIn(d's
/// LlCtrl) on the direct path (`order`), signalRemoteRank otherwise.
template <typename WordIn>
__device__ inline void tellEveryRank(const LlTeam& lt, uint32_t signalBase, WordIn wordIn, uint64_t e,
                                     MemoryOrder order) {
  const int d = threadIdx.x;
  if (d >= lt.t.numRanks || isMasked(lt, d)) return;
  if (isRemote(lt.t, d))
    signalRemoteRank(lt, d, signalBase, e);
  else
    atomicStore(wordIn(llCtrl(lt.t.base[d])), e, order);
}

/// The receive side's "done with buffer e % 2" to every source (last block of a receive kernel, after lastBlock).
/// A relaxed store, not a release: it announces that reads are over, and every read of the buffer by every block has
/// returned its value before lastBlock's acquire-release count (each value was stored to the outputs, which that
/// count orders first), so no write the source makes after seeing it can reach a read. A system-scope release here
/// was a fence of about 1.6 us at the end of every receive kernel, on the path of the next call (2 x H100, per call
/// of a dispatch and of a combine alike).
__device__ inline void releaseBuffer(const LlTeam& lt, uint64_t e) {
  tellEveryRank(
      lt, lt.freedSignal, [&](LlCtrl* c) { return &c->freed[lt.t.rank]; }, e, kRelaxed);
}

/// The source of message v of a receive, from the first message of each source (first[0..R], nondecreasing, v <
/// first[R]): the loop is bounded by R.
__device__ inline int sourceOf(const int* first, int v) {
  int s = 0;
  while (v >= first[s + 1]) ++s;
  return s;
}

/// Turns the counts first[0..n) (shared memory) into their exclusive prefix, first[n] the total: one warp, each lane
/// over a run of consecutive entries.
__device__ inline void warpPrefixInPlace(int* first, int n, cub::WarpScan<int>::TempStorage& scan) {
  const int lane = threadIdx.x & 31, per = (n + 31) / 32, lo = min(n, lane * per), hi = min(n, lo + per);
  int sum = 0;
  for (int q = lo; q < hi; ++q) sum += first[q];
  int base, total;
  cub::WarpScan<int>(scan).ExclusiveSum(sum, base, total);
  for (int q = lo; q < hi; ++q) {
    const int c = first[q];
    first[q] = base;
    base += c;
  }
  if (lane == 0) first[n] = total;
}

/// Both prefixes of a dispatch receive at once (the rows per (local expert, source), and the messages per source),
/// warps 0 and 1, between one pair of barriers. Every thread of the block calls it.
__device__ inline void prefixesInPlace(int* rows, int numRows, int* messages, int numSources) {
  __shared__ cub::WarpScan<int>::TempStorage scan[2];
  __syncthreads();
  const int warp = threadIdx.x >> 5, second = blockDim.x > 32 ? 1 : 0;
  if (warp == 0) warpPrefixInPlace(rows, numRows, scan[0]);
  if (warp == second) warpPrefixInPlace(messages, numSources, scan[1]);
  __syncthreads();
}

/// Launches kernel k with `blocks` blocks of the team's threads, programmatically serialized after the stream's
/// previous kernel when the team asks for it (followPreviousKernel is the kernel's side of that).
template <typename... Params, typename... Args>
cudaError_t launchLlKernel(void (*k)(Params...), const LlTeam& team, int blocks, int threads, cudaStream_t stream,
                           const Args&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = team.programmaticLaunch ? 1 : 0;
  return cudaLaunchKernelEx(&config, k, args...);
}

}  // namespace gdx::ep::detail
