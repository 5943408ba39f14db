// The low-latency combine, gdx::ep::ll::combine: its send phase (the source's top-k weights to every rank first, then
// per received message one weighted sum of the experts' rows back to its source: stored in chunks with stamps on the
// direct path, put through the proxy otherwise) and its receive phase (warps sum pieces of each token's rows as their
// chunks land), in one kernel, whose `phases` say which of the two a launch runs. Protocol:
// ep/low_latency_protocol.hpp; the helpers it shares with the dispatch: ep/low_latency_device.cuh.
#include <cuda_bf16.h>

#include "ep/launchers.hpp"
#include "ep/low_latency_device.cuh"

namespace gdx::ep::detail {
namespace {

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

}  // namespace
}  // namespace gdx::ep::detail

// The combine kernel is named as DeepEP's (a profiler's line "...::combine(...)"; no other kernel a call launches has
// the word in its name): `phases` (LlPhase) says whether the launch sends, receives, or both, each block doing its
// sends first. Its parameters are plain ones: as grid constants (the dispatch's form) they spilled more, 324 bytes of
// spill stores where these have 296.
namespace gdx::ep::ll {

__global__ void __launch_bounds__(1024) combine(detail::LlTeam lt, detail::LlCombineArgs a, int phases) {
  detail::followPreviousKernel(lt.nextKernelEarly);
  if (phases & detail::kLlSend) detail::combineSend(lt, a);
  if (phases & detail::kLlRecv) detail::combineRecv(lt, a);
}

}  // namespace gdx::ep::ll

namespace gdx::ep::detail {

cudaError_t llCombineBlocksPerSm(int threads, int* out) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, ll::combine, threads, 0);
}

cudaError_t launchLlCombine(const LlTeam& team, const LlCombineArgs& a, int phases, cudaStream_t stream) {
  const int blocks = phases == kLlBoth ? team.bothBlocks : team.blocks;
  return launchLlKernel(ll::combine, team, blocks, team.threads, stream, team, a, phases);
}

}  // namespace gdx::ep::detail
