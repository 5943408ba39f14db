// The low-latency kernels: gdx::ep::ll::dispatch and gdx::ep::ll::combine, each a send phase and a receive phase
// (protocol: ep/low_latency_protocol.hpp), and the small kernels of the masks. A block owns a token in dispatch send;
// warps own received messages or pieces of them (dispatch receive, combine send) or pieces of a token's sum (combine
// receive). One put, or one set of direct stores, per (token, rank) both ways.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cub/warp/warp_scan.cuh>

#include "ep/device_common.cuh"
#include "ep/low_latency_protocol.hpp"

namespace gdx::ep::detail {
namespace {

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
  uint64_t start = 0, failureSeen = 0;
  for (uint64_t spins = 0;; ++spins) {
    if (wordReached(atomicLoad(const_cast<uint64_t*>(word), kAcquire), want, kind)) return true;
    if ((spins & 63) == 63) {
      if (isMasked(lt, peer)) return false;
      const uint64_t now = nowNs();
      if (start == 0) start = failureSeen = now;
      // That rank's own failure word (a failed peer masks only itself), once a millisecond from the first: it is host
      // memory, and reading it in waits of a few microseconds (every 64 polls, or every 20 us) stalled calls by
      // 100-200 us, each stall making the other rank's next waits long enough to read it too.
      const uint32_t* pf = lt.peerFailure[peer];
      uint32_t f = 0;
      if (pf && now - failureSeen >= 1000000) {
        f = atomicLoad(const_cast<uint32_t*>(pf), kRelaxed);
        failureSeen = now;
      }
      if (f != 0 || now - start > lt.t.timeoutNs) {
        maskRank(lt, peer);
        return false;
      }
    }
    if (spins > 256) __nanosleep(32);
  }
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

// ---- dispatch -------------------------------------------------------------------------------------------------

/// Where a token's message goes, shared by the block that sends it: the message slot at a rank of this host, one per
/// destination rank, kept at the first top-k slot naming that rank (0: none; `direct` has a bit per slot that has
/// one), and the host staging row the puts to other hosts read (null when no rank on another host needs the token).
struct TokenRows {
  unsigned long long row[kMaxTopk];
  unsigned direct;
  char* stage;
};

/// Stores one piece of a dispatch message (at byte `off`) into every message slot it goes to and the staging row.
template <typename V>
__device__ inline void storeToRows(const V& v, uint32_t off, const TokenRows& to) {
  for (unsigned m = to.direct; m; m &= m - 1)
    *reinterpret_cast<V*>(reinterpret_cast<char*>(to.row[__ffs(m) - 1]) + off) = v;
  if (to.stage) *reinterpret_cast<V*>(to.stage + off) = v;
}

/// A thread's share of a token, in pieces of 16 bytes: FP8, a half-warp owns a 128-element block (8 elements a lane),
/// the warps of the block take the block pairs in turn (piece n: step warp + n * warps); BF16, the block's threads take
/// the token's vectors in turn. Piece n of this thread: whether it exists, and its byte offset in the BF16 token.
struct TokenPieces {
  bool fp8;
  int steps, blocks, vecs;  // FP8: block-pair steps and 128-element blocks; BF16: 16-byte vectors
  int64_t tokenBytes;       // of a BF16 input token
  __device__ TokenPieces(const LlDispatchArgs& a, int H)
      : fp8(a.fp8),
        steps((H / kFp8ScaleBlock + 1) / 2),
        blocks(H / kFp8ScaleBlock),
        vecs(H * 2 / 16),
        tokenBytes(H * 2) {}
  __device__ const char* token(const LlDispatchArgs& a, int tok) const { return a.x + tok * tokenBytes; }
  __device__ int count() const {
    const int per = fp8 ? int(blockDim.x >> 5) : int(blockDim.x), mine = fp8 ? int(threadIdx.x >> 5) : int(threadIdx.x);
    const int total = fp8 ? steps : vecs;
    return mine < total ? (total - mine + per - 1) / per : 0;
  }
  /// FP8: the 128-element block of piece n (an odd block count leaves the last step's second half without one).
  __device__ int fp8Block(int n) const {
    return 2 * (int(threadIdx.x >> 5) + n * int(blockDim.x >> 5)) + ((threadIdx.x & 31) >> 4);
  }
  __device__ bool on(int n) const { return fp8 ? fp8Block(n) < blocks : true; }
  __device__ uint32_t srcOffset(int n) const {
    return fp8 ? uint32_t(fp8Block(n) * kFp8ScaleBlock + (threadIdx.x & 15) * 8) * 2
               : uint32_t(threadIdx.x + n * blockDim.x) * 16;
  }
  __device__ int4 load(const char* token, int n) const {
    return n < count() && on(n) ? __ldg(reinterpret_cast<const int4*>(token + srcOffset(n))) : make_int4(0, 0, 0, 0);
  }
};

/// The first pieces of a thread's share, loaded before the block waits for the buffer and learns where the token goes:
/// the loads are in flight while it waits and warp 0 reserves the rows (at decode sizes, memory latencies in a row
/// otherwise).
constexpr int kPrefetchPieces = 2;
struct TokenPrefetch {
  int4 v[kPrefetchPieces];
};
__device__ inline TokenPrefetch prefetchToken(const LlDispatchArgs& a, const TokenPieces& tp, int tok) {
  const char* src = tp.token(a, tok);
  TokenPrefetch p;
#pragma unroll
  for (int n = 0; n < kPrefetchPieces; ++n) p.v[n] = tp.load(src, n);
  return p;
}

/// Piece n (value v) of a thread's share of a token, packed and stored (packToken).
__device__ inline void packPiece(const LlDispatchArgs& a, const TokenPieces& tp, const int4& v, int n,
                                 const TokenRows& to) {
  if (!tp.fp8) {
    storeToRows(v, tp.srcOffset(n), to);
    return;
  }
  // FP8: every lane of the warp takes part in the half-warp reductions, a lane without a block with zeros.
  const bool on = tp.on(n);
  const int blk = tp.fp8Block(n), hl = threadIdx.x & 15;
  const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
  float2 f[4];
  float amax = 0.f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    f[q] = __bfloat1622float2(h2[q]);
    amax = fmaxf(amax, fmaxf(fabsf(f[q].x), fabsf(f[q].y)));
  }
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // within the half
  float scale = fmaxf(amax, 1e-4f) / 448.f;
  if (a.roundScale) {  // up to a power of two from the bits, exactly (a UE8M0 scale is then the f32's exponent byte)
    const uint32_t bits = __float_as_uint(scale);
    scale = __uint_as_float(((bits >> 23) + ((bits & 0x7fffffu) != 0)) << 23);
  }
  const float inv = 1.f / scale;
  uint2 packed;
  uint32_t* w = &packed.x;
#pragma unroll
  for (int q = 0; q < 4; q += 2) {
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(f[q].x * inv, f[q].y * inv), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(f[q + 1].x * inv, f[q + 1].y * inv), __NV_SATFINITE, __NV_E4M3);
    w[q / 2] = uint32_t(lo) | uint32_t(hi) << 16;
  }
  if (on) storeToRows(packed, uint32_t(blk * kFp8ScaleBlock + hl * 8), to);
  if (on && hl == 0) storeToRows(scale, a.msg.scaleOffset + uint32_t(blk) * 4, to);
}

/// The block packs token `tok`: FP8 e4m3 with one scale per 128 elements (amax / 448, optionally rounded up to a power
/// of two), or the BF16 bytes as they are, each piece stored straight from registers into every message slot it goes
/// to (the token is read once, nothing is read back). FP8: amax over the 16 lanes of a half-warp. The meta is the
/// caller's.
__device__ inline void packToken(const LlDispatchArgs& a, const TokenPieces& tp, int tok, const TokenPrefetch& pre,
                                 const TokenRows& to) {
  const char* src = tp.token(a, tok);
  const int count = tp.count();
  for (int n = 0; n < count; ++n) packPiece(a, tp, n < kPrefetchPieces ? pre.v[n] : tp.load(src, n), n, to);
}

/// The block counts the call's top-k entries per expert (every block alike, from topkIdx alone, so that all reach the
/// same verdict on whether the call fits without talking to each other) and, when `messages` is given, the tokens that
/// go to each rank (the messages it gets): the counts the dispatch publishes, known before any token is sent. No
/// trailing sync.
__device__ inline void countEntries(const LlDispatchArgs& a, const LlLayout& y, int* entries, int* messages) {
  for (int i = threadIdx.x; i < y.E; i += blockDim.x) entries[i] = 0;
  if (messages)
    for (int i = threadIdx.x; i < kMaxRanks; i += blockDim.x) messages[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < a.numTokens * a.numTopk; i += blockDim.x) {
    const int64_t ex = a.topkIdx[i];
    if (ex >= 0 && ex < y.E) atomicAdd(&entries[ex], 1);
  }
  if (!messages) return;
  // A lane per token, its top-k loaded all at once (in a loop, one memory latency after another: 5 us at 128 tokens,
  // on the path of every receiver), then per rank the warp's count in one atomic.
  const int lane = threadIdx.x & 31;
  for (int base = threadIdx.x & ~31; base < a.numTokens; base += blockDim.x) {
    const int tok = base + lane;
    uint32_t to = 0;
    int ex[kMaxTopk];  // int, not the caller's int64: half the registers of a kernel at its 64-register bound
#pragma unroll
    for (int k = 0; k < kMaxTopk; ++k) {
      const int64_t v = tok < a.numTokens && k < a.numTopk ? a.topkIdx[int64_t(tok) * a.numTopk + k] : -1;
      ex[k] = v >= 0 && v < y.E ? int(v) : -1;
    }
#pragma unroll
    for (int k = 0; k < kMaxTopk; ++k)
      if (ex[k] >= 0) to |= 1u << (ex[k] / y.L);
    for (int d = 0; d < kMaxRanks; ++d) {
      const int n = __popc(__ballot_sync(0xffffffffu, (to >> d) & 1u));
      if (lane == 0 && n > 0) atomicAdd(&messages[d], n);
    }
  }
}

/// The count block of a dispatch send (after countEntries with messages): this call's counts to every rank of this host
/// not masked (refused: zeros, nothing comes), each word tagged with the epoch (taggedWord(e, n)). Plain stores, no
/// release: the receiver takes a word once its tag reads e, so the counts leave without a system-scope fence (about
/// 1.5 us on this block's path, and then on every receiver's). Its receivers build their rows' layout from them while
/// the tokens are still being packed.
__device__ inline void publishCounts(const LlTeam& lt, uint64_t e, uint32_t masked, bool refused, const int* entries,
                                     const int* messages) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const int words = y.L + 1, R = t.numRanks, c = countSlot(e);
  const uint32_t to = ((1u << R) - 1u) & ~masked & ~t.remoteMask;
  __syncthreads();  // countEntries' counts
  for (int i = threadIdx.x; i < R * words; i += blockDim.x) {
    const int d = i / words, j = i % words;
    if (!((to >> d) & 1u)) continue;
    const int n = refused ? 0 : j < y.L ? entries[d * y.L + j] : messages[d];
    atomicStore(&llCtrl(t.base[d])->dispCount[c][t.rank][j], taggedWord(e, uint32_t(min(n, y.T))), kRelaxed);
  }
}

/// Second half (after a sync): a rank may send one expert at most T rows (the receiver's area for it), which only a
/// token naming the expert in several slots can exceed. Returns the lowest expert the call would overfill, or -1;
/// block 0 reports it with a token naming it twice (there is one: without such tokens an expert gets <= N <= T).
__device__ inline int overfullExpert(const LlTeam& lt, const LlDispatchArgs& a, const int* entries, uint64_t e) {
  const LlLayout& y = lt.lay;
  __shared__ int over, token;
  if (threadIdx.x == 0) over = token = INT_MAX;
  __syncthreads();
  for (int i = threadIdx.x; i < y.E; i += blockDim.x)
    if (entries[i] > y.T) atomicMin(&over, i);
  __syncthreads();
  if (over == INT_MAX) return -1;
  if (blockIdx.x == 0) {
    for (int tok = threadIdx.x; tok < a.numTokens; tok += blockDim.x) {
      int m = 0;
      for (int k = 0; k < a.numTopk; ++k) m += a.topkIdx[int64_t(tok) * a.numTopk + k] == over;
      if (m > 1) atomicMin(&token, tok);
    }
    __syncthreads();
    if (threadIdx.x == 0) report(lt.t, kExpertRows, 0, lt.t.rank, over, entries[over], e, token);
  }
  return over;
}

/// What the warp's token reserves (lane k: top-k slot k naming `expert`, -1 for none): its row among those sent that
/// expert (`row`, -1: nothing sent for the slot) and, on the first slot naming each destination rank, the token's
/// message slot there (`message`, -1 elsewhere). Slots naming one expert get consecutive rows in slot order, reserved
/// at once by the first of them. Both atomics are issued before either answer is used (one round trip, not two).
/// `masked`: ranks nothing is sent to.
struct SlotReservation {
  int row, message, rank;  // rank: the destination (-1: none)
};
__device__ inline SlotReservation reserveSlots(const LlTeam& lt, int b, int64_t expert, int lane, uint32_t masked) {
  const int d = expert >= 0 ? int(expert / lt.lay.L) : -1;
  const bool sends = d >= 0 && !((masked >> d) & 1u);
  const unsigned sameExpert = __match_any_sync(0xffffffffu, sends ? expert : int64_t(-1));
  const unsigned sameRank = __match_any_sync(0xffffffffu, sends ? d : -1);
  const int firstOfExpert = __ffs(sameExpert) - 1;
  int row = -1, message = -1;
  if (sends && lane == firstOfExpert) row = atomicAdd(&lt.ll->sendCount[b][expert], __popc(sameExpert));
  if (sends && lane == __ffs(sameRank) - 1) message = atomicAdd(&lt.ll->sendMsgs[b][d], 1);
  row = __shfl_sync(0xffffffffu, row, firstOfExpert);
  SlotReservation r;
  r.row = sends ? row + __popc(sameExpert & ((1u << lane) - 1u)) : -1;
  r.message = message;
  r.rank = sends ? d : -1;
  return r;
}

/// The send phase of a dispatch (every block; a `return` ends the phase, not the block's kernel).
__device__ __forceinline__ void dispatchSend(const LlTeam& lt, const LlDispatchArgs& a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->sendSeq + 1;
  const int b = int(e & 1), me = t.rank, lane = threadIdx.x & 31;
  __shared__ int entries[kMaxExperts], messages[kMaxRanks];
  const bool mayOverfill = a.numTokens * a.numTopk > y.T;  // else no expert can get more than T entries
  // The last block counts and publishes the call's counts (it has the fewest tokens, often none).
  const bool countBlock = blockIdx.x == gridDim.x - 1;
  if (mayOverfill || countBlock) countEntries(a, y, entries, countBlock ? messages : nullptr);
  // The block's first token: its share of x and (warp 0) its top-k, loaded before the wait (caller inputs, final
  // since followPreviousKernel), so that the wait's round trips and theirs overlap.
  const TokenPieces pieces(a, y.H);
  const int warp = threadIdx.x >> 5, numWarps = blockDim.x >> 5;
  auto topkOf = [&](int tok) -> int64_t {
    return warp == 0 && lane < a.numTopk && tok < a.numTokens ? a.topkIdx[int64_t(tok) * a.numTopk + lane] : -1;
  };
  TokenPrefetch pre = blockIdx.x < a.numTokens ? prefetchToken(a, pieces, blockIdx.x) : TokenPrefetch{};
  int64_t firstExpert = topkOf(blockIdx.x);
  const bool refused = mayOverfill && overfullExpert(lt, a, entries, e) >= 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.refused = refused;  // read by this handle's combine
  // The counts go out before the buffer wait: they have a slot of their own (e % 4), which no receive still reads.
  if (countBlock) publishCounts(lt, e, atomicLoad(&lt.ll->mask, kRelaxed), refused, entries, messages);
  uint32_t masked = waitFreed(lt, e);
  // A block per token: warp 0 reserves its rows and messages, every warp packs a share of it into the messages, then
  // one warp per rank on another host puts the staged message there. Spread over the block, a decode-size call (a
  // token or a few per block) is not one warp's serial work: about 30 us for a 7168-wide FP8 token packed by one warp.
  __shared__ TokenRows to;
  __shared__ int slotRank[kMaxTopk], slotMessage[kMaxTopk];
  __shared__ unsigned remoteSlots;
  for (int tok = refused ? a.numTokens : blockIdx.x; tok < a.numTokens; tok += gridDim.x) {  // refused: no token sends
    if (tok != int(blockIdx.x)) {
      pre = prefetchToken(a, pieces, tok);
      firstExpert = topkOf(tok);
      // Ranks masked since (a failed put, another block's wait): nothing more is reserved for them. Loaded beside the
      // token, used by warp 0 only.
      if (warp == 0) masked |= atomicLoad(&lt.ll->mask, kRelaxed);
    }
    int64_t expert = -1;
    int row = -1;
    if (warp == 0) {
      expert = firstExpert;
      if (expert < -1 || expert >= y.E) {
        report(t, kBadExpert, 0, me, expert, y.E, e, tok);
        expert = -1;
      }
      const SlotReservation r = reserveSlots(lt, b, expert, lane, masked);
      row = r.row;
      if (row >= y.T) {  // cannot happen after overfullExpert's check; guards the other sources' rows
        report(t, kRecvCapacity, 0, me, row + 1, y.T, e, tok);
        row = -1;
      }
      const bool far = r.message >= 0 && isRemote(t, r.rank);
      const unsigned long long dst =
          r.message >= 0 && !far ? reinterpret_cast<unsigned long long>(t.base[r.rank] + y.gpuDispMsg(b, me, r.message))
                                 : 0ull;
      const unsigned direct = __ballot_sync(0xffffffffu, dst != 0), remote = __ballot_sync(0xffffffffu, far);
      if (lane < kMaxTopk) {
        to.row[lane] = dst;
        slotRank[lane] = r.rank;
        slotMessage[lane] = r.message;
      }
      if (lane == 0) {
        to.direct = direct;
        // Once per token into host staging when a rank on another host needs it; each such rank is then one put.
        to.stage = remote ? t.mirror + y.dispStageRow(b, tok) : nullptr;
        remoteSlots = remote;
      }
    }
    __syncthreads();
    packToken(a, pieces, tok, pre, to);
    if (warp == 0) {  // the meta (LlMeta): the token, and per slot the expert and its row (-1, -1: nothing sent)
      if (lane == 0) storeToRows(tok, a.msg.metaOffset, to);
      if (lane < y.K) {
        storeToRows(row >= 0 ? int32_t(expert) : -1, a.msg.metaOffset + LlMeta::expertAt(lane), to);
        storeToRows(int32_t(row), a.msg.metaOffset + LlMeta::rowAt(y.K, lane), to);
      }
    }
    __syncthreads();  // the whole message written before its stamp, and staged before a put reads it
    // Each message to a rank of this host is stamped with the epoch, released after the block's stores (the barrier).
    if (warp == 0 && lane < kMaxTopk && ((to.direct >> lane) & 1u))
      atomicStore(reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(to.row[lane]) + y.stampOffset()), e, kRelease);
    int nth = 0;
    for (unsigned m = remoteSlots; m; m &= m - 1, ++nth) {
      if (nth % numWarps != warp) continue;
      const int k = __ffs(m) - 1, dk = slotRank[k];
      if (isMasked(lt, dk)) continue;  // a put to it failed since the reservation: its counts will not be sent either
      ChannelDeviceHandle ch = t.net[dk];
      const Status st = ch.putWarp(t.stageWindow, y.mirrorDispMsg(b, lt.mirrorSlot[dk], slotMessage[k]), t.stageWindow,
                                   y.dispStageRow(b, tok), a.msg.bytes);
      if (__any_sync(0xffffffffu, st != Status::kOk) && lane == 0) maskRank(lt, dk);
    }
    __syncthreads();  // `to` and the slots are rewritten for the next token
  }
  if (!lastBlock<cuda::thread_scope_device>(&lt.ll->sendBlocks)) return;
  // Every block's messages are out. To each rank of another host, the counts that the reservations made, per local
  // expert and the messages (entry L), staged, then put with the signal sent[me] after the messages on that ring (the
  // ranks of this host had theirs from the count block). The reservation counters are reset for buffer b's next call.
  const int words = y.L + 1;
  for (int i = threadIdx.x; i < t.numRanks * words; i += blockDim.x) {
    const int d = i / words, j = i % words;
    int32_t* counter = j < y.L ? &lt.ll->sendCount[b][d * y.L + j] : &lt.ll->sendMsgs[b][d];
    const uint64_t word = taggedWord(e, uint32_t(min(*counter, y.T)));
    *counter = 0;
    if (isRemote(t, d) && !isMasked(lt, d)) reinterpret_cast<uint64_t*>(t.mirror + y.countStageOf(b, d))[j] = word;
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (d < t.numRanks && isRemote(t, d) && !isMasked(lt, d)) {
    __threadfence_system();
    ChannelDeviceHandle ch = t.net[d];
    const uint64_t at = offsetof(LlCtrl, dispCount) + (uint64_t(countSlot(e)) * kMaxRanks + me) * (kMaxExperts + 1) * 8;
    if (ch.putWithSignal(t.stageWindow, at, t.stageWindow, y.countStageOf(b, d), uint64_t(words) * 8,
                         lt.sentSignal + me, e, SignalOp::kSet) != Status::kOk)
      maskRank(lt, d);
  }
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->sendSeq = e;
}

/// Message m that rank `src` sent this rank in buffer b: this rank's window (direct path) or the receive mirror.
__device__ inline const char* dispatchedMessage(const LlTeam& lt, int b, int src, int m) {
  return isRemote(lt.t, src) ? lt.t.mirror + lt.lay.mirrorDispMsg(b, lt.remoteSlot[src], m)
                             : lt.t.base[lt.t.rank] + lt.lay.gpuDispMsg(b, src, m);
}

/// A round of a warp's copy: lane l holds vectors i0 + l + 32 u (u < kRoundVecs) of `src` that are below `vecs`.
constexpr int kRoundVecs = 4;
__device__ inline void loadRound(int4 (&v)[kRoundVecs], const int4* src, uint32_t i0, uint32_t vecs, int lane) {
#pragma unroll
  for (int u = 0; u < kRoundVecs; ++u) {
    const uint32_t i = i0 + lane + 32u * u;
    if (i < vecs) v[u] = src[i];
  }
}
/// Stores a round (loadRound) into row r of `out` (rows of `rowBytes`) for each lane r's row in `hits` holds.
__device__ inline void storeRound(const int4 (&v)[kRoundVecs], char* out, uint32_t rowBytes, int64_t row, unsigned hits,
                                  uint32_t i0, uint32_t vecs, int lane) {
  for (unsigned h = hits; h; h &= h - 1) {
    int4* d = reinterpret_cast<int4*>(out + __shfl_sync(0xffffffffu, row, __ffs(h) - 1) * rowBytes);
#pragma unroll
    for (int u = 0; u < kRoundVecs; ++u) {
      const uint32_t i = i0 + lane + 32u * u;
      if (i < vecs) d[i] = v[u];
    }
  }
}

/// Whether message m from rank src of this host, of epoch e, is all here (its stamp reads e; never more, as src's next
/// write of the slot, at e + 2, waits for this receive's "freed"): lane 0 waits for it (waitOrMask: false once src is
/// masked, failed or timed out), the warp follows.
__device__ inline bool messageArrived(const LlTeam& lt, int src, const char* m, uint64_t e, int lane) {
  bool ok = true;
  if (lane == 0)
    ok = waitOrMask(lt, src, reinterpret_cast<const uint64_t*>(m + lt.lay.stampOffset()), e, WordKind::kEpoch);
  ok = __shfl_sync(0xffffffffu, ok, 0);
  __syncwarp();  // lane 0's acquire of the stamp orders the warp's reads of the message after it
  return ok;
}

/// Where the scales of received row `row` (j * rows + i: row i of local expert j, rows = T * R) start in the layout of
/// LowLatencyDispatchOutputs::recvXScales: f32 element j * nScales * rows + i, UE8M0 byte (j * G * rows + i) * 4
/// (G = ceil(nScales / 4)); storeScale puts scale c from there.
__device__ inline int64_t scaleBase(bool ue8m0, int rows, int nScales, int64_t row) {
  const int j = int(row) / rows, i = int(row) - j * rows;
  return ue8m0 ? (int64_t(j) * ((nScales + 3) / 4) * rows + i) * 4 : int64_t(j) * nScales * rows + i;
}
/// Scale c (f: a power of two with UE8M0, whose exponent byte is stored) of the row whose scales start at `base`.
__device__ inline void storeScale(const LlDispatchArgs& a, int64_t base, int rows, int c, float f) {
  if (a.ue8m0)
    static_cast<uint8_t*>(a.out.recvXScales)[base + int64_t(c / 4) * rows * 4 + (c & 3)] =
        uint8_t(__float_as_uint(f) >> 23);
  else
    static_cast<float*>(a.out.recvXScales)[base + int64_t(c) * rows] = f;
}

/// Rank src's counts arrived but one of its messages never did (src failed mid-call): one warp of the grid (the first
/// to get here in receive epoch e) zeroes every row the counts gave src, and their source token (-1), so that none
/// holds what an earlier call left there; rows of src that other warps copied may be zeroed too. src is masked.
__device__ inline void zeroRowsOf(const LlTeam& lt, const LlDispatchArgs& a, int src, const int* first, uint64_t e,
                                  int lane) {
  const LlLayout& y = lt.lay;
  const int R = lt.t.numRanks, nScales = y.H / kFp8ScaleBlock, rowsPerExpert = y.T * R;
  const uint32_t xOut = a.fp8 ? y.H : y.H * 2;
  unsigned long long was = 0;
  if (lane == 0) was = atomicMax(reinterpret_cast<unsigned long long*>(&lt.ll->recvZeroed[src]), e);
  if (__shfl_sync(0xffffffffu, was, 0) >= e) return;
  for (int j = 0; j < y.L; ++j) {
    const int q = j * R + src;
    const int64_t begin = int64_t(j) * y.T * R + (first[q] - first[j * R]);
    for (int64_t r = begin; r < begin + (first[q + 1] - first[q]); ++r) {
      int4* row = reinterpret_cast<int4*>(static_cast<char*>(a.out.recvX) + r * xOut);
      for (uint32_t c = lane; c < xOut / 16; c += 32) row[c] = make_int4(0, 0, 0, 0);
      if (a.fp8) {
        const int64_t base = scaleBase(a.ue8m0, rowsPerExpert, nScales, r);
        for (int c = lane; c < nScales; c += 32) storeScale(a, base, rowsPerExpert, c, 0.f);
      }
      if (lane == 0) a.srcInfo[r] = -1;
    }
  }
}

/// The receive phase of a dispatch (every block, after its send phase when the launch has both).
__device__ __forceinline__ void dispatchRecv(const LlTeam& lt, const LlDispatchArgs& a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->recvSeq + 1;
  const int b = int(e & 1), me = t.rank, R = t.numRanks, lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5, numWarps = blockDim.x >> 5;
  const uint32_t xOut = a.fp8 ? y.H : y.H * 2;
  const int nScales = y.H / kFp8ScaleBlock;
  const int64_t rowsPerExpert = int64_t(y.T) * R;
  const int gw = blockIdx.x * numWarps + warp, W = gridDim.x * numWarps;
  // Every block alike: once each source's counts are here (lane s of the last warp waits for its messages' count word
  // to be tagged e or, on another host, for its signal), the rows of each (local expert j, source s), entry q = j * R +
  // s, and their prefix; and the messages of each source and theirs. Whether a source counts is the grid's verdict:
  // every block builds its own prefix, and each row is written by one block, by its own prefix.
  const int Q = y.L * R;
  __shared__ int first[kMaxExperts + 1], firstMessage[kMaxRanks + 1];
  // A source of this host: its messages' count word (entry L) tagged e; of another host: its signal, after its counts.
  const auto countWord = [&](int s, int j) -> const uint64_t* {
    return &llCtrl(isRemote(t, s) ? t.mirror : t.base[me])->dispCount[countSlot(e)][s][j];
  };
  const auto sentOf = [&](int s) -> const uint64_t* {
    return isRemote(t, s) ? &t.netSignals[lt.sentSignal + s] : countWord(s, y.L);
  };
  const uint32_t absent = lastWarpWaits(lt, sentOf, e, true, ~t.remoteMask, a.out.waitRecvCostStats);
  const auto countOf = [&](int s, int j) {  // entry j of source s's counts (j == L: its messages), 0 when absent
    if ((absent >> s) & 1u) return 0;
    // Each word is taken once its tag reads e: a source of this host stores them without a release, in any order.
    uint32_t n = 0;
    return taggedValue(lt, s, countWord(s, j), e, &n) ? int(n) : 0;
  };
  for (int q = threadIdx.x; q < Q; q += blockDim.x) first[q] = countOf(q % R, q / R);
  if (threadIdx.x < R) firstMessage[threadIdx.x] = countOf(threadIdx.x, y.L);
  prefixesInPlace(first, Q, firstMessage, R);
  if (blockIdx.x == 0) {
    for (int q = threadIdx.x; q < Q; q += blockDim.x) {
      const int j = q / R, s = q % R, begin = first[q] - first[j * R];
      a.layoutRange[q] = int64_t(begin) << 32 | (first[q + 1] - first[q]);
      if (s == 0) a.out.recvCount[j] = first[(j + 1) * R] - first[j * R];
      if (s == 0 && a.out.cumulativeRecvStats)
        atomicAdd(a.out.cumulativeRecvStats + j, first[(j + 1) * R] - first[j * R]);
    }
    if (threadIdx.x <= R) a.msgs.first[threadIdx.x] = firstMessage[threadIdx.x];
  }
  // The messages of all sources, flattened: any warp takes any (message, part). Lane k reads slot k of the meta; the
  // warp copies its part of the message into the row of each slot naming an expert of this rank. A decode-size call
  // has fewer messages than warps, and each is then cut into parts of at least 512 bytes (a message a warp left most
  // of the grid idle and each busy warp waiting on its loads round after round); the last part also copies the
  // scales, part 0 writes the handle's source token and slot of each row.
  const int messages = firstMessage[R], parts = max(1, min(W / max(messages, 1), int(xOut / 512)));
  for (int unit = gw; unit < messages * parts; unit += W) {
    const int v = unit / parts, part = unit % parts;
    const int src = sourceOf(firstMessage, v);
    const char* m = dispatchedMessage(lt, b, src, v - firstMessage[src]);
    // From this host, each message as its stamp lands (from another host, all were here with the counts).
    if (!isRemote(t, src) && !messageArrived(lt, src, m, e, lane)) {
      zeroRowsOf(lt, a, src, first, e, lane);
      if (part == 0 && lane < y.K) a.msgs.rows[int64_t(v) * y.K + lane] = -1;
      if (part == 0 && lane == 0) a.msgs.token[v] = -1;
      continue;
    }
    // The part's first round of vectors is loaded before the meta (one memory latency for both) and every round is
    // stored from registers into each row the message fills: a copy per row loaded the message once per row, one
    // latency each, and left a 128-token receive latency-bound (about four rows a message on two ranks).
    uint32_t offset, len;
    rowSlice(xOut, part, parts, &offset, &len);
    const int4* piece = reinterpret_cast<const int4*>(m + offset);
    const uint32_t vecs = len / 16;
    int4 loaded[kRoundVecs];
    loadRound(loaded, piece, 0, vecs, lane);
    const int32_t* meta = reinterpret_cast<const int32_t*>(m + a.msg.metaOffset);
    const int expert = lane < y.K ? meta[LlMeta::expertAt(lane) / 4] : -1;
    const int pos = lane < y.K ? meta[LlMeta::rowAt(y.K, lane) / 4] : -1;
    const int j = expert - me * y.L, q = j * R + src;
    // A slot names one of this rank's experts at a row the counts hold (anything else is not this rank's to write).
    const bool mine = j >= 0 && j < y.L && pos >= 0 && pos < first[q + 1] - first[q];
    const int64_t row = mine ? int64_t(j) * rowsPerExpert + (first[q] - first[j * R]) + pos : -1;
    const unsigned hits = __ballot_sync(0xffffffffu, mine);
    for (uint32_t i0 = 0; i0 < vecs; i0 += kRoundVecs * 32) {
      if (i0 > 0) loadRound(loaded, piece, i0, vecs, lane);
      storeRound(loaded, static_cast<char*>(a.out.recvX) + offset, xOut, row, hits, i0, vecs, lane);
    }
    if (a.fp8 && part == parts - 1) {  // the scales, likewise loaded once
      const float* scales = reinterpret_cast<const float*>(m + a.msg.scaleOffset);
      const int64_t base = mine ? scaleBase(a.ue8m0, int(rowsPerExpert), nScales, row) : 0;
      for (int c0 = 0; c0 < nScales; c0 += 32) {
        const int c = c0 + lane;
        const float f = c < nScales ? scales[c] : 0.f;
        for (unsigned h = hits; h; h &= h - 1) {
          const int64_t at = __shfl_sync(0xffffffffu, base, __ffs(h) - 1);
          if (c < nScales) storeScale(a, at, int(rowsPerExpert), c, f);
        }
      }
    }
    if (part == 0) {  // the handle: each row's source token and slot, and the message's rows for the combine
      if (mine) {
        a.srcInfo[row] = meta[0];
        a.srcSlot[row] = lane;
      }
      if (lane == 0) a.msgs.token[v] = meta[0];
      if (lane < y.K) a.msgs.rows[int64_t(v) * y.K + lane] = int32_t(row);
    }
  }
  if (!lastBlock<cuda::thread_scope_device>(&lt.ll->recvBlocks)) return;
  releaseBuffer(lt, e);
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->recvSeq = e;
}

// ---- combine --------------------------------------------------------------------------------------------------

__device__ inline void addScaledBf16x8(float (&acc)[8], const int4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    acc[2 * q] += w * f.x;
    acc[2 * q + 1] += w * f.y;
  }
}

/// The warp writes vectors [begin, end) (8 BF16 each) of sum_i wt[i] * src[i] to `out`, in f32 and in the order of the
/// sources, rounded once; four sources' loads are issued before any is summed. P: how `src` is read (kInput: the
/// caller's inputs, which nothing writes during the kernel).
template <LoadPath P>
__device__ inline void warpWeightedSum(int4* out, const char* const (&src)[kMaxTopk], const float (&wt)[kMaxTopk],
                                       int n, uint32_t begin, uint32_t end, int lane) {
  for (uint32_t c = begin + lane; c < end; c += 32) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int q0 = 0; q0 < n; q0 += 4) {
      int4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (q0 + u < n) v[u] = loadVec<P>(reinterpret_cast<const int4*>(src[q0 + u]) + c);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (q0 + u < n) addScaledBf16x8(acc, v[u], wt[q0 + u]);
    }
    int4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int q = 0; q < 4; ++q) h[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    out[c] = r;
  }
}

/// Vectors (16 bytes) per combine chunk.
constexpr uint32_t kChunkVecs = kCombChunkBytes / 16;

/// How `chunks`-chunk rows of `rows` tokens (or messages) are cut for `warps` warps: into as many pieces of whole
/// chunks as give every warp one, at least a chunk each.
struct RowPieces {
  int perPiece;  // chunks per piece (the last may have fewer)
  int pieces;    // per row
};
__device__ inline RowPieces cutIntoPieces(int chunks, int warps, int rows) {
  const int wanted = max(1, min(warps / max(rows, 1), chunks)), perPiece = (chunks + wanted - 1) / wanted;
  return {perPiece, (chunks + perPiece - 1) / perPiece};
}

/// Entry i of this rank's combine weights as they are sent, [N][K] at the layout's K (0 past the top-k or the tokens).
__device__ inline float weightOf(const LlCombineArgs& a, int K, int i) {
  const int tok = i / K, k = i % K;
  return i < a.numTokens * K && k < a.numTopk ? a.topkWeights[int64_t(tok) * a.numTopk + k] : 0.f;
}

/// Block 0 of a combine's send: this rank's top-k weights to every other rank not masked (its own experts read the
/// caller's): stored into the window of a rank of this host as tagged words (taggedWord: the weight's bits), each taken
/// once its tag reads e (taggedWeight), so no flag waits for a fence behind them; staged once in pinned host memory and
/// put with the signal weights[me] to a rank of another host. The experts' sums wait for them, so this comes first.
/// Every thread of block 0 calls it, with its first entry (weightOf at threadIdx.x) loaded before the buffer wait.
__device__ inline void publishWeights(const LlTeam& lt, const LlCombineArgs& a, int b, uint64_t e, uint32_t masked,
                                      float first) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const int R = t.numRanks, me = t.rank, n = a.numTokens * y.K;
  const uint32_t to = ((1u << R) - 1u) & ~masked & ~(1u << me), remote = to & t.remoteMask;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float w = i == int(threadIdx.x) ? first : weightOf(a, y.K, i);
    const uint64_t word = taggedWord(e, __float_as_uint(w));
    for (uint32_t m = to & ~remote; m; m &= m - 1)
      atomicStore(reinterpret_cast<uint64_t*>(t.base[__ffs(m) - 1] + y.gpuWeightsOf(b, me)) + i, word, kRelaxed);
    if (remote) reinterpret_cast<float*>(t.mirror + y.weightStageOf(b))[i] = w;
  }
  if (!remote) return;
  __syncthreads();
  const int d = threadIdx.x;
  if (d >= R || !((remote >> d) & 1u)) return;
  __threadfence_system();  // the staged weights (every thread's, through the barrier) before the put's command
  ChannelDeviceHandle ch = t.net[d];
  if (ch.putWithSignal(t.stageWindow, y.mirrorWeightsOf(b, lt.mirrorSlot[d]), t.stageWindow, y.weightStageOf(b),
                       uint64_t(n) * 4, lt.weightsSignal + me, e, SignalOp::kSet) != Status::kOk)
    maskRank(lt, d);
}

/// Top-k weight `slot` of token `tok` that source s of this host published for epoch e (publishWeights), once its
/// word's tag is e's; false when s is or becomes masked first (waitOrMask). The word holds 0, or e - 2's or e's: the
/// source writes buffer b again at e + 2 only after this rank's receive of e freed it.
__device__ inline bool taggedWeight(const LlTeam& lt, int b, int s, int tok, int slot, uint64_t e, float* w) {
  const uint64_t* word = reinterpret_cast<const uint64_t*>(lt.t.base[lt.t.rank] + lt.lay.gpuWeightsOf(b, s)) +
                         int64_t(tok) * lt.lay.K + slot;
  uint32_t bits = 0;
  if (!taggedValue(lt, s, word, e, &bits)) return false;
  *w = __uint_as_float(bits);
  return true;
}

/// The send phase of a combine (every block; a `return` ends the phase, not the block's kernel).
__device__ __forceinline__ void combineSend(const LlTeam& lt, const LlCombineArgs& a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->sendSeq + 1;
  const int b = int(e & 1), me = t.rank, R = t.numRanks, K = y.K, lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), W = gridDim.x * (blockDim.x >> 5);
  const uint32_t xb = uint32_t(y.combRowBytes);
  const int64_t rows = int64_t(y.L) * y.T * R;  // of x
  // The messages the dispatch received, per source (LlMessages), loaded beside the wait.
  __shared__ int firstMessage[kMaxRanks + 1];
  if (threadIdx.x <= R) firstMessage[threadIdx.x] = a.msgs.first[threadIdx.x];
  const float firstWeight = blockIdx.x == 0 ? weightOf(a, K, threadIdx.x) : 0.f;  // loaded beside the wait
  const uint32_t masked = waitFreed(lt, e);                                       // its sync covers firstMessage
  if (blockIdx.x == 0) publishWeights(lt, a, b, e, masked, firstWeight);
  // The weights of a rank of another host come with its signal; those of this host are taken word by word.
  const auto remoteWeightsOf = [&](int s) -> const uint64_t* {
    return isRemote(t, s) ? &t.netSignals[lt.weightsSignal + s] : nullptr;
  };
  const uint32_t absent = masked | (t.remoteMask ? lastWarpWaits(lt, remoteWeightsOf, e) : 0u);
  // Per message: the sum of its token's rows here, weighted by the source's weights, into one row for the source (the
  // combine row of the token's first slot naming this rank). A row for a rank of this host is cut into pieces of whole
  // chunks (kCombChunkBytes) so that every warp has work at decode sizes, and the warp stamps each chunk of its piece
  // once its stores are done (the source sums each chunk as it lands); one for another host is summed into staging
  // whole by one warp (its piece 0) and put.
  const int messages = firstMessage[R], chunks = y.combChunks();
  const auto [perPiece, pieces] = cutIntoPieces(chunks, W, messages);
  const uint32_t vecs = xb / 16;
  for (int unit = gw; unit < messages * pieces; unit += W) {
    const int v = unit / pieces, piece = unit % pieces;
    const int s = sourceOf(firstMessage, v);
    const bool far = isRemote(t, s);
    if (((absent >> s) & 1u) || (piece > 0 && far)) continue;
    if (far && isMasked(lt, s)) continue;  // a put to it failed since the waits (this or another warp's)
    const int tok = a.msgs.token[v];
    const int row = lane < K ? a.msgs.rows[int64_t(v) * K + lane] : -1;
    // The rows the dispatch wrote for this message (a handle of another call could name others: none is read then).
    const unsigned slots = __ballot_sync(0xffffffffu, row >= 0 && row < rows);
    if (tok < 0 || tok >= y.T || !slots) continue;
    // Lane k's weight, for a slot with a row (< the dispatch's numTopk): the caller's own, the mirror's (another
    // host: here with its signal), or the tagged word of a source of this host.
    float w = 0.f;
    bool weighed = true;
    if ((slots >> lane) & 1u) {
      if (s == me)
        w = a.topkWeights[int64_t(tok) * a.numTopk + lane];
      else if (far)
        w = reinterpret_cast<const float*>(t.mirror + y.mirrorWeightsOf(b, lt.remoteSlot[s]))[int64_t(tok) * K + lane];
      else
        weighed = taggedWeight(lt, b, s, tok, lane, e, &w);
    }
    if (!__all_sync(0xffffffffu, weighed)) continue;  // s was masked while this waited: nothing goes back to it
    const char* src[kMaxTopk];
    float wt[kMaxTopk];
    int n = 0;
    for (unsigned m = slots; m; m &= m - 1, ++n) {
      const int k = __ffs(m) - 1;
      src[n] = a.x + int64_t(__shfl_sync(0xffffffffu, row, k)) * xb;
      wt[n] = __shfl_sync(0xffffffffu, w, k);
    }
    const int k0 = __ffs(slots) - 1;
    if (!far) {
      const int c0 = piece * perPiece, c1 = min(chunks, c0 + perPiece);
      warpWeightedSum<LoadPath::kInput>(reinterpret_cast<int4*>(t.base[s] + y.gpuCombRow(b, tok, k0)), src, wt, n,
                                        c0 * kChunkVecs, min(vecs, c1 * kChunkVecs), lane);
      __syncwarp();  // every lane's stores of the piece before any of its stamps
      for (int c = c0 + lane; c < c1; c += 32)
        atomicStore(reinterpret_cast<uint64_t*>(t.base[s] + y.gpuCombStamp(b, tok, k0, c)), e, kRelease);
    } else {
      const uint64_t stage = y.combStageRow(b, lt.remoteSlot[s], v - firstMessage[s]);
      warpWeightedSum<LoadPath::kInput>(reinterpret_cast<int4*>(t.mirror + stage), src, wt, n, 0, vecs, lane);
      __syncwarp();
      ChannelDeviceHandle ch = t.net[s];
      const Status st = ch.putWarp(t.stageWindow, y.mirrorCombRow(b, tok, k0), t.stageWindow, stage, xb);
      if (__any_sync(0xffffffffu, st != Status::kOk) && lane == 0) maskRank(lt, s);
    }
  }
  if (!lastBlock<cuda::thread_scope_device>(&lt.ll->sendBlocks)) return;
  // Every rank of another host learns that this rank's rows of epoch e are there: the signal on the ring of the puts,
  // after them. The ranks of this host had each chunk's stamp.
  const int d = threadIdx.x;
  if (d < R && isRemote(t, d) && !isMasked(lt, d)) signalRemoteRank(lt, d, lt.sentSignal, e);
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->sendSeq = e;
}

/// Whether every chunk [c0, c1) of the combine row (tok, slot k) that rank d of this host sends this rank is here (the
/// chunks' stamps). Called by the lane of slot k; false once d is (or becomes) masked, failed or timed out
/// (reachedOrWait). Its acquires order the warp's reads of the chunks after them once the warp syncs.
__device__ inline bool combineRowArrived(const LlTeam& lt, int b, uint64_t e, int tok, int k, int d, int c0, int c1) {
  const char* base = lt.t.base[lt.t.rank];
  for (int c = c0; c < c1; ++c)
    if (!reachedOrWait(lt, d, reinterpret_cast<const uint64_t*>(base + lt.lay.gpuCombStamp(b, tok, k, c)), e,
                       WordKind::kEpoch))
      return false;
  return true;
}

/// The warp sums chunks [c0, c1) of token tok's combined row: one row per rank the token went to (laneExpert: lane k's
/// top-k expert), in the combine row of its first slot naming that rank (weighted there), each read once it arrived
/// (combineRowArrived; a rank of another host: `masked` excludes it unless its block saw its signal). A rank that is
/// masked, or is masked while the warp waits, adds nothing (see combineRecv). `cycles` (shared [kMaxRanks], null:
/// none): each wait's clock64() cycles are added to its rank's.
__device__ inline void sumCombinedChunks(const LlTeam& lt, const LlCombineArgs& a, int b, uint64_t e, int tok,
                                         int64_t laneExpert, bool refused, uint32_t masked, int c0, int c1, int lane,
                                         unsigned long long* cycles) {
  const LlLayout& y = lt.lay;
  const int rank = !refused && laneExpert >= 0 && laneExpert < y.E ? int(laneExpert / y.L) : -1;
  const unsigned sameRank = __match_any_sync(0xffffffffu, rank);
  bool first = rank >= 0 && lane == __ffs(sameRank) - 1 && !((masked >> rank) & 1u);
  if (first && !isRemote(lt.t, rank)) {
    const long long start = cycles ? clock64() : 0;
    first = combineRowArrived(lt, b, e, tok, lane, rank, c0, c1);
    if (cycles) atomicAdd(cycles + rank, (unsigned long long)(clock64() - start));
  }
  const unsigned rows = __ballot_sync(0xffffffffu, first);
  __syncwarp();  // each row's lane acquired its stamps before any lane reads the row
  const char* src[kMaxTopk];
  float wt[kMaxTopk];
  int n = 0;
  for (unsigned m = rows; m; m &= m - 1, ++n) {
    const int k = __ffs(m) - 1, d = __shfl_sync(0xffffffffu, rank, k);
    src[n] =
        isRemote(lt.t, d) ? lt.t.mirror + y.mirrorCombRow(b, tok, k) : lt.t.base[lt.t.rank] + y.gpuCombRow(b, tok, k);
    wt[n] = 1.f;
  }
  const uint32_t vecs = uint32_t(y.H) / 8;
  warpWeightedSum<LoadPath::kCached>(reinterpret_cast<int4*>(a.out + int64_t(tok) * y.H * 2), src, wt, n,
                                     c0 * kChunkVecs, min(vecs, c1 * kChunkVecs), lane);
}

/// The receive phase of a combine (every block, after its send phase when the launch has both).
__device__ __forceinline__ void combineRecv(const LlTeam& lt, const LlCombineArgs& a) {
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->recvSeq + 1;
  const int b = int(e & 1), K = a.numTopk, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * (blockDim.x >> 5) + warp, W = gridDim.x * (blockDim.x >> 5);
  // A token's row is cut into pieces of whole chunks so that every warp has work at decode sizes (one warp per token
  // left most of the grid idle and each busy warp waiting on its loads), and each piece is summed as its chunks land.
  const int chunks = y.combChunks();
  const auto [perPiece, pieces] = cutIntoPieces(chunks, W, a.numTokens);
  // Lane k holds slot k's expert of the warp's token: the whole top-k in one round trip (loaded slot after slot, they
  // cost a memory latency each, 3 us of a one-token call). The weights were applied by the experts' ranks.
  int64_t laneExpert = -1;
  const auto loadTopk = [&](int tok) {
    laneExpert = lane < K && tok < a.numTokens ? a.topkIdx[int64_t(tok) * K + lane] : -1;
  };
  const bool refused = *a.refused != 0;  // its dispatch sent nothing: no row comes back, every sum is zero
  // The ranks this block goes by: those masked when it starts, and any its waits find masked. The rows of another
  // host's rank all come before its signal, which the block's last warp waits for (one lane per such rank: polled by
  // every warp, that host memory took the PCIe link from the send kernel's puts beside it).
  const auto remoteSentOf = [&](int s) -> const uint64_t* {
    return isRemote(lt.t, s) ? &lt.t.netSignals[lt.sentSignal + s] : nullptr;
  };
  // The waits' cycles per rank (LowLatencyCombineInputs::waitRecvCostStats), added up in the block first.
  __shared__ unsigned long long waitCycles[kMaxRanks];
  if (a.waitCost && threadIdx.x < kMaxRanks) waitCycles[threadIdx.x] = 0;  // lastWarpWaits' barrier orders it
  const uint32_t masked = atomicLoad(&lt.ll->mask, kRelaxed) |
                          (lt.t.remoteMask ? lastWarpWaits(lt, remoteSentOf, e, false, 0, a.waitCost) : 0u);
  if (a.waitCost && !lt.t.remoteMask) __syncthreads();  // waitCycles zeroed
  for (int unit = gw; unit < a.numTokens * pieces; unit += W) {
    const int tok = unit / pieces, c0 = (unit % pieces) * perPiece;
    loadTopk(tok);
    sumCombinedChunks(lt, a, b, e, tok, laneExpert, refused, masked, c0, min(chunks, c0 + perPiece), lane,
                      a.waitCost ? waitCycles : nullptr);
  }
  // Every sum must go by the same ranks. Each block notes the ranks it started without masked; if one of them is
  // masked by the end (a wait here timed out, or a put of the send failed), some sums may hold its rows and others
  // not, and the last block sums every token again without the ranks masked then, until no more are masked.
  __syncthreads();
  if (threadIdx.x == 0) atomicOr(&lt.ll->combUnmaskedAtStart, ~masked);
  if (a.waitCost && threadIdx.x < lt.t.numRanks && waitCycles[threadIdx.x])
    atomicAdd(reinterpret_cast<unsigned long long*>(a.waitCost) + threadIdx.x, waitCycles[threadIdx.x]);
  if (!lastBlock<cuda::thread_scope_device>(&lt.ll->recvBlocks)) return;
  __shared__ uint32_t now, seen;
  if (threadIdx.x == 0) {
    now = atomicLoad(&lt.ll->mask, kRelaxed);
    seen = lt.ll->combUnmaskedAtStart;
    lt.ll->combUnmaskedAtStart = 0;  // for the next combine receive, which starts after this kernel ends
  }
  __syncthreads();
  for (uint32_t before = ~now; (seen & now) != 0 && before != now;) {
    before = now;
    for (int tok = warp; tok < a.numTokens; tok += blockDim.x >> 5) {
      loadTopk(tok);
      sumCombinedChunks(lt, a, b, e, tok, laneExpert, refused, before, 0, chunks, lane, nullptr);
    }
    __syncthreads();
    if (threadIdx.x == 0) now = atomicLoad(&lt.ll->mask, kRelaxed);
    __syncthreads();
  }
  releaseBuffer(lt, e);
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->recvSeq = e;
}

/// Masks (kMaskedByUser) the ranks of `mask`, unmasks those of `unmask` unless a kernel masked them (failedMask: they
/// stay masked, reported as kUnmaskRefused). One thread: the masks are small.
__global__ void llSetMask(LlTeam lt, uint32_t mask, uint32_t unmask) {
  followPreviousKernel(lt.nextKernelEarly);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const uint32_t failed = atomicLoad(&lt.ll->failedMask, kRelaxed), refused = unmask & failed;
  unmask &= ~failed;
  atomicOr(&lt.ll->mask, mask);
  atomicAnd(&lt.ll->mask, ~unmask);
  for (int r = 0; r < lt.t.numRanks; ++r) {
    if ((mask >> r) & 1u && !((failed >> r) & 1u)) lt.maskHost[r] = kMaskedByUser;
    if ((unmask >> r) & 1u) lt.maskHost[r] = 0;
  }
  if (refused) report(lt.t, kUnmaskRefused, 0, __ffs(refused) - 1, refused, 0, lt.ll->sendSeq);
}

__global__ void llQueryMask(LlTeam lt, int32_t* out) {
  followPreviousKernel(lt.nextKernelEarly);
  const uint32_t mask = atomicLoad(&lt.ll->mask, kRelaxed);
  for (int r = threadIdx.x; r < lt.t.numRanks; r += blockDim.x) out[r] = int32_t((mask >> r) & 1u);
}

/// Launches kernel k with `blocks` blocks of the team's threads, programmatically serialized after the stream's
/// previous kernel when the team asks for it (followPreviousKernel is the kernel's side of that).
template <typename... Params, typename... Args>
cudaError_t launch(void (*k)(Params...), const LlTeam& team, int blocks, int threads, cudaStream_t stream,
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

}  // namespace
}  // namespace gdx::ep::detail

// The two kernels of the low-latency mode, named as DeepEP's (a profiler's line "...::dispatch(...)" and one
// "...::combine(...)"; no other kernel a call launches has either word in its name): `phases` (LlPhase) says whether
// the launch sends, receives, or both, each block doing its sends first. The dispatch's parameters are grid constants:
// its phases take them by reference, and ptxas then spills less (64 registers: 196 bytes of spill stores where the
// plain parameters had 324; the combine's spill more so: 324, plain 296).
namespace gdx::ep::ll {

__global__ void __launch_bounds__(1024)
    dispatch(const __grid_constant__ detail::LlTeam lt, const __grid_constant__ detail::LlDispatchArgs a, int phases) {
  detail::followPreviousKernel(lt.nextKernelEarly);
  if (phases & detail::kLlSend) detail::dispatchSend(lt, a);
  if (phases & detail::kLlRecv) detail::dispatchRecv(lt, a);
}

__global__ void __launch_bounds__(1024) combine(detail::LlTeam lt, detail::LlCombineArgs a, int phases) {
  detail::followPreviousKernel(lt.nextKernelEarly);
  if (phases & detail::kLlSend) detail::combineSend(lt, a);
  if (phases & detail::kLlRecv) detail::combineRecv(lt, a);
}

}  // namespace gdx::ep::ll

namespace gdx::ep::detail {

bool llKernelsWaitForPrevious() {
  cudaFuncAttributes f{};
  return cudaFuncGetAttributes(&f, ll::dispatch) == cudaSuccess && f.ptxVersion >= 90;
}

int llMaxResidentBlocks(int threads) {
  int device = 0, sms = 0, dispatchPerSm = 0, combinePerSm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dispatchPerSm, ll::dispatch, threads, 0) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&combinePerSm, ll::combine, threads, 0) != cudaSuccess)
    return 0;
  return sms * std::min(dispatchPerSm, combinePerSm);
}

cudaError_t launchLlDispatch(const LlTeam& team, const LlDispatchArgs& a, int phases, cudaStream_t stream) {
  const int blocks = phases == kLlBoth ? team.bothBlocks : team.blocks;
  return launch(ll::dispatch, team, blocks, team.threads, stream, team, a, phases);
}
cudaError_t launchLlCombine(const LlTeam& team, const LlCombineArgs& a, int phases, cudaStream_t stream) {
  const int blocks = phases == kLlBoth ? team.bothBlocks : team.blocks;
  return launch(ll::combine, team, blocks, team.threads, stream, team, a, phases);
}
cudaError_t launchLlSetMask(const LlTeam& team, uint32_t mask, uint32_t unmask, cudaStream_t stream) {
  return launch(llSetMask, team, 1, 32, stream, team, mask, unmask);
}
cudaError_t launchLlQueryMask(const LlTeam& team, int32_t* out, cudaStream_t stream) {
  return launch(llQueryMask, team, 1, 32, stream, team, out);
}

}  // namespace gdx::ep::detail
