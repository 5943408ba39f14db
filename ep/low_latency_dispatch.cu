// The low-latency dispatch, gdx::ep::ll::dispatch: its send phase (a block owns a token: packs it, FP8 or BF16, and
// stores or puts one message per destination rank, then publishes the counts) and its receive phase (warps own
// received messages or pieces of them and copy each into the rows of the experts it names), in one kernel, whose
// `phases` say which of the two a launch runs. Protocol: ep/low_latency_protocol.hpp; the helpers it shares with the
// combine: ep/low_latency_device.cuh.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <climits>

#include "ep/launchers.hpp"
#include "ep/low_latency_device.cuh"

namespace gdx::ep::detail {
namespace {

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

}  // namespace
}  // namespace gdx::ep::detail

// The dispatch kernel is named as DeepEP's (a profiler's line "...::dispatch(...)"; no other kernel a call launches
// has the word in its name): `phases` (LlPhase) says whether the launch sends, receives, or both, each block doing its
// sends first. Its parameters are grid constants: its phases take them by reference, and ptxas then spills less (64
// registers: 196 bytes of spill stores where the plain parameters had 324).
namespace gdx::ep::ll {

__global__ void __launch_bounds__(1024)
    dispatch(const __grid_constant__ detail::LlTeam lt, const __grid_constant__ detail::LlDispatchArgs a, int phases) {
  detail::followPreviousKernel(lt.nextKernelEarly);
  if (phases & detail::kLlSend) detail::dispatchSend(lt, a);
  if (phases & detail::kLlRecv) detail::dispatchRecv(lt, a);
}

}  // namespace gdx::ep::ll

namespace gdx::ep::detail {

bool llKernelsWaitForPrevious() {
  cudaFuncAttributes f{};
  return cudaFuncGetAttributes(&f, ll::dispatch) == cudaSuccess && f.ptxVersion >= 90;
}

cudaError_t llDispatchBlocksPerSm(int threads, int* out) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, ll::dispatch, threads, 0);
}

cudaError_t launchLlDispatch(const LlTeam& team, const LlDispatchArgs& a, int phases, cudaStream_t stream) {
  const int blocks = phases == kLlBoth ? team.bothBlocks : team.blocks;
  return launchLlKernel(ll::dispatch, team, blocks, team.threads, stream, team, a, phases);
}

}  // namespace gdx::ep::detail
