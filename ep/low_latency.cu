// The low-latency kernels: dispatch send / receive, combine send / receive (protocol: ep/low_latency_protocol.hpp).
// A warp owns a token (dispatch send, combine receive) or a row (combine send): one put, or one warp's stores, per
// (token, expert) pair.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <climits>

#include "ep/device_common.cuh"
#include "ep/low_latency_protocol.hpp"

namespace gdx::ep::detail {
namespace {

__device__ inline LlCtrl* llCtrl(const char* base) {
  return reinterpret_cast<LlCtrl*>(const_cast<char*>(base));
}

__device__ inline bool isMasked(const LlTeam& lt, int r) {
  return (atomicLoad(&lt.ll->mask, kRelaxed) >> r) & 1u;
}

/// Masks rank r: later waits on it end at once, nothing more is sent to it, maskedRanks() names it.
__device__ inline void maskRank(const LlTeam& lt, int r) {
  atomicOr(&lt.ll->mask, 1u << r);
  lt.maskHost[r] = 1;  // host-mapped, read by the host without synchronisation
}

/// Waits until (*word >> shift) >= want for rank `peer`. False (rank masked) when it is or becomes masked, when a
/// rank on another host failed (its own failure word: nothing of it can arrive), or after GDX_TIMEOUT_MS.
__device__ inline bool waitOrMask(const LlTeam& lt, int peer, const uint64_t* word, uint64_t want, int shift) {
  uint64_t start = 0;
  for (uint64_t spins = 0;; ++spins) {
    if ((atomicLoad(const_cast<uint64_t*>(word), kAcquire) >> shift) >= want) return true;
    if ((spins & 63) == 63) {
      if (isMasked(lt, peer)) return false;
      // That rank's own failure word (the proxy's channel to it): a failed peer masks only itself.
      const uint32_t* pf = isRemote(lt.t, peer) ? lt.t.net[peer].failure : nullptr;
      const uint32_t f = pf ? atomicLoad(const_cast<uint32_t*>(pf), kRelaxed) : 0u;
      const uint64_t now = nowNs();
      if (start == 0) start = now;
      if (f != 0 || now - start > lt.t.timeoutNs) {
        maskRank(lt, peer);
        return false;
      }
    }
    if (spins > 256) __nanosleep(32);
  }
}

/// Every block: threads 0..R-1 wait until rank r finished reading what this rank sent it two calls ago (the buffer
/// of epoch e is then free everywhere). Masks what times out.
__device__ inline void waitFreed(const LlTeam& lt, uint64_t e) {
  const int r = threadIdx.x;
  if (e > 2 && r < lt.t.numRanks && !isMasked(lt, r)) {
    const uint64_t* w =
        isRemote(lt.t, r) ? &lt.t.netSignals[lt.freedSignal + r] : &llCtrl(lt.t.base[lt.t.rank])->freed[r];
    waitOrMask(lt, r, w, e - 2, 0);
  }
  __syncthreads();
}

/// The grid's last block to call this gets true (after every block's stores, made visible at system scope).
__device__ inline bool lastBlock(uint32_t* counter) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) {
      *counter = 0;
      __threadfence_system();
    }
  }
  __syncthreads();
  return last;
}

/// The receive side's "done with buffer e % 2" to every source (last block of a receive kernel).
__device__ inline void releaseBuffer(const LlTeam& lt, uint64_t e) {
  const int s = threadIdx.x;
  if (s < lt.t.numRanks && !isMasked(lt, s)) {
    if (isRemote(lt.t, s)) {
      ChannelDeviceHandle ch = lt.t.net[s];
      if (ch.signal(lt.freedSignal + lt.t.rank, e, SignalOp::kSet) != Status::kOk) maskRank(lt, s);
    } else {
      atomicStore(&llCtrl(lt.t.base[s])->freed[lt.t.rank], e, kRelease);
    }
  }
}

// ---- dispatch -------------------------------------------------------------------------------------------------

/// The warp packs token `tok` into `row`: FP8 e4m3 with one scale per 128 elements (amax / 448, optionally rounded
/// up to a power of two), or the BF16 bytes as they are; then the meta (token, top-k ids).
__device__ inline void packToken(const LlDispatchArgs& a, int H, int maxTopk, int tok, int64_t expert, char* row,
                                 int lane) {
  const char* src = a.x + int64_t(tok) * H * 2;
  if (a.fp8) {
    for (int blk = 0; blk < H / kFp8ScaleBlock; ++blk) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(src + (blk * kFp8ScaleBlock + lane * 4) * 2));
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      float amax = fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y)));
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      float scale = fmaxf(amax, 1e-4f) / 448.f;
      if (a.roundScale) scale = exp2f(ceilf(log2f(scale)));
      const float inv = 1.f / scale;
      const __nv_fp8x2_storage_t q0 =
          __nv_cvt_float2_to_fp8x2(make_float2(lo.x * inv, lo.y * inv), __NV_SATFINITE, __NV_E4M3);
      const __nv_fp8x2_storage_t q1 =
          __nv_cvt_float2_to_fp8x2(make_float2(hi.x * inv, hi.y * inv), __NV_SATFINITE, __NV_E4M3);
      *reinterpret_cast<uint32_t*>(row + blk * kFp8ScaleBlock + lane * 4) = uint32_t(q0) | uint32_t(q1) << 16;
      if (lane == 0) reinterpret_cast<float*>(row + a.msg.scaleOffset)[blk] = scale;
    }
  } else {
    warpCopy16FromInput(row, src, a.msg.xBytes, lane);
  }
  int32_t* meta = reinterpret_cast<int32_t*>(row + a.msg.metaOffset);
  if (lane == 0) meta[0] = tok;
  if (lane < maxTopk) meta[1 + lane] = lane < a.numTopk ? int32_t(expert) : -1;
}

/// First half of the check that the call fits: the block counts the call's top-k entries per expert (every block
/// alike, from topkIdx alone, so that all reach the same verdict without talking to each other). No trailing sync.
__device__ inline void countEntries(const LlDispatchArgs& a, int E, int* entries) {
  for (int i = threadIdx.x; i < E; i += blockDim.x) entries[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < a.numTokens * a.numTopk; i += blockDim.x) {
    const int64_t ex = a.topkIdx[i];
    if (ex >= 0 && ex < E) atomicAdd(&entries[ex], 1);
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

/// The row positions of the warp's token at the experts its slots name (lane k: slot k; -1: nothing to send). Slots
/// naming one expert get consecutive positions in slot order, reserved at once by the first of them: the receiver
/// relies on that order to tell them apart (low_latency_protocol.hpp).
__device__ inline int reserveRows(const LlTeam& lt, int b, int64_t expert, int lane) {
  const unsigned same = __match_any_sync(0xffffffffu, expert);
  const int first = __ffs(same) - 1;
  int pos = -1;
  if (lane == first && expert >= 0 && !isMasked(lt, int(expert / lt.lay.L)))
    pos = atomicAdd(&lt.ll->sendCount[b][expert], __popc(same));
  pos = __shfl_sync(0xffffffffu, pos, first);
  return pos < 0 ? -1 : pos + __popc(same & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(1024) llDispatchSend(LlTeam lt, LlDispatchArgs a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->sendSeq + 1;
  const int b = int(e & 1), me = t.rank, lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), W = gridDim.x * (blockDim.x >> 5);
  __shared__ int entries[kMaxExperts];
  const bool mayOverfill = a.numTokens * a.numTopk > y.T;  // else no expert can get more than T entries
  if (mayOverfill) countEntries(a, y.E, entries);
  waitFreed(lt, e);  // its sync completes the counts
  const bool refused = mayOverfill && overfullExpert(lt, a, entries, e) >= 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.refused = refused;             // read by this handle's combine
  for (int tok = refused ? a.numTokens : gw; tok < a.numTokens; tok += W) {  // refused: no token sends
    int64_t expert = lane < a.numTopk ? a.topkIdx[int64_t(tok) * a.numTopk + lane] : -1;
    if (expert < -1 || expert >= y.E) {
      report(t, kBadExpert, 0, me, expert, y.E, e, tok);
      expert = -1;
    }
    const int myPos = reserveRows(lt, b, expert, lane);
    const bool remoteHere = expert >= 0 && isRemote(t, int(expert / y.L)) && !isMasked(lt, int(expert / y.L));
    const bool anyRemote = __any_sync(0xffffffffu, remoteHere);
    char* row = lt.scratch + (uint64_t(b) * y.T + tok) * y.slotBytes;
    packToken(a, y.H, y.K, tok, expert, row, lane);
    __syncwarp();
    if (anyRemote) {  // once per token into host staging; each remote (token, expert) pair is then one put of it
      warpCopy16(t.mirror + y.dispStageRow(b, tok), row, a.msg.bytes, lane);
      __syncwarp();
    }
    for (int k = 0; k < a.numTopk; ++k) {
      const int64_t ex = __shfl_sync(0xffffffffu, expert, k);
      const int pos = __shfl_sync(0xffffffffu, myPos, k);
      if (ex < 0 || pos < 0) continue;  // no expert, or its rank is masked
      const int d = int(ex / y.L), j = int(ex % y.L);
      if (pos >= y.T) {  // cannot happen after overfullExpert's check; guards the other sources' rows
        if (lane == 0) report(t, kRecvCapacity, 0, me, pos + 1, y.T, e, tok);
        continue;
      }
      if (!isRemote(t, d)) {
        warpCopy16(t.base[d] + y.gpuDispRow(b, j, me, pos), row, a.msg.bytes, lane);
      } else {
        ChannelDeviceHandle ch = t.net[d];
        const Status s = ch.putWarp(t.stageWindow, y.mirrorDispRow(b, j, lt.mirrorSlot[d], pos), t.stageWindow,
                                    y.dispStageRow(b, tok), a.msg.bytes);
        if (__any_sync(0xffffffffu, s != Status::kOk) && lane == 0) maskRank(lt, d);
      }
    }
  }
  if (!lastBlock(&lt.ll->sendBlocks)) return;
  // Every block's rows are out: the counts, per (destination, local expert), after them.
  for (int i = threadIdx.x; i < t.numRanks * y.L; i += blockDim.x) {
    const int d = i / y.L, j = i % y.L;
    const uint64_t word = e << 32 | uint32_t(min(lt.ll->sendCount[b][i], y.T));
    lt.ll->sendCount[b][i] = 0;
    if (isMasked(lt, d)) continue;
    if (isRemote(t, d))
      reinterpret_cast<uint64_t*>(t.mirror + y.countStageOf(b, d))[j] = word;
    else
      atomicStore(&llCtrl(t.base[d])->dispCount[b][me][j], word, kRelease);
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (d < t.numRanks && isRemote(t, d) && !isMasked(lt, d)) {
    __threadfence_system();
    ChannelDeviceHandle ch = t.net[d];
    const uint64_t at = offsetof(LlCtrl, dispCount) + (uint64_t(b) * kMaxRanks + me) * kMaxExperts * 8;
    if (ch.putWithSignal(t.stageWindow, at, t.stageWindow, y.countStageOf(b, d), uint64_t(y.L) * 8, lt.sentSignal + me,
                         e, SignalOp::kSet) != Status::kOk)
      maskRank(lt, d);
  }
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->sendSeq = e;
}

/// The message rank `src` put at position `pos` of local expert j's rows in buffer b: this rank's window (direct
/// path) or the receive mirror.
__device__ inline const char* dispatchedMessage(const LlTeam& lt, int b, int j, int src, int pos) {
  return isRemote(lt.t, src) ? lt.t.mirror + lt.lay.mirrorDispRow(b, j, lt.remoteSlot[src], pos)
                             : lt.t.base[lt.t.rank] + lt.lay.gpuDispRow(b, j, src, pos);
}
__device__ inline int dispatchedToken(const LlTeam& lt, const LlDispatchArgs& a, int b, int j, int src, int pos) {
  return reinterpret_cast<const int32_t*>(dispatchedMessage(lt, b, j, src, pos) + a.msg.metaOffset)[0];
}

__global__ void __launch_bounds__(1024) llDispatchRecv(LlTeam lt, LlDispatchArgs a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->recvSeq + 1;
  const int b = int(e & 1), me = t.rank, R = t.numRanks, lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5, numWarps = blockDim.x >> 5;
  const uint32_t xOut = a.fp8 ? y.H : y.H * 2;
  const int nScales = y.H / kFp8ScaleBlock;
  const int64_t rowsPerExpert = int64_t(y.T) * R;
  __shared__ int count[kMaxRanks], first[kMaxRanks + 1];
  for (int j = blockIdx.x; j < y.L; j += gridDim.x) {
    const int s = threadIdx.x;
    if (s < R) {
      int c = 0;
      if (!isMasked(lt, s)) {
        if (isRemote(t, s)) {
          if (waitOrMask(lt, s, &t.netSignals[lt.sentSignal + s], e, 0))
            c = int(atomicLoad(&llCtrl(t.mirror)->dispCount[b][s][j], kAcquire) & 0xffffffffu);
        } else {
          const uint64_t* w = &llCtrl(t.base[me])->dispCount[b][s][j];
          if (waitOrMask(lt, s, w, e, 32)) c = int(atomicLoad(const_cast<uint64_t*>(w), kAcquire) & 0xffffffffu);
        }
      }
      count[s] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int run = 0;
      for (int r = 0; r < R; ++r) {
        first[r] = run;
        a.layoutRange[int64_t(j) * R + r] = int64_t(run) << 32 | count[r];
        run += count[r];
      }
      first[R] = run;
      a.out.recvCount[j] = run;
    }
    __syncthreads();
    for (int i = warp; i < first[R]; i += numWarps) {
      int src = 0;
      while (i >= first[src + 1]) ++src;
      const int pos = i - first[src];
      const char* m = dispatchedMessage(lt, b, j, src, pos);
      const int64_t row = int64_t(j) * rowsPerExpert + i;
      warpCopy16(static_cast<char*>(a.out.recvX) + row * xOut, m, xOut, lane);
      if (a.fp8)
        warpCopyFloats(a.out.recvXScales + row * nScales, reinterpret_cast<const float*>(m + a.msg.scaleOffset),
                       nScales, lane);
      const int32_t* meta = reinterpret_cast<const int32_t*>(m + a.msg.metaOffset);
      // Every slot of the message's top-k (maxTopk entries, -1 past the sender's numTopk) naming this expert.
      const bool mine = lane < y.K && meta[1 + lane] == me * y.L + j;
      unsigned hit = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) {
        const int tok = meta[0];
        // Several slots name it: this row is the n-th of their consecutive rows (n rows before it carry the token).
        for (int p = pos - 1, n = __popc(hit) - 1; n > 0 && p >= 0 && dispatchedToken(lt, a, b, j, src, p) == tok;
             --p, --n)
          hit &= hit - 1;
        a.srcInfo[row] = tok;
        a.srcSlot[row] = hit ? __ffs(hit) - 1 : -1;
      }
    }
    __syncthreads();
  }
  if (!lastBlock(&lt.ll->recvBlocks)) return;
  releaseBuffer(lt, e);
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->recvSeq = e;
}

// ---- combine --------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(1024) llCombineSend(LlTeam lt, LlCombineArgs a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->sendSeq + 1;
  const int b = int(e & 1), me = t.rank, R = t.numRanks, lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), W = gridDim.x * (blockDim.x >> 5);
  const int64_t rowsPerExpert = int64_t(y.T) * R;
  const uint32_t xb = uint32_t(y.combRowBytes);
  waitFreed(lt, e);
  for (int64_t idx = gw; idx < int64_t(y.L) * rowsPerExpert; idx += W) {
    const int j = int(idx / rowsPerExpert), i = int(idx % rowsPerExpert);
    int s = -1, pos = 0;
    for (int r = 0; r < R; ++r) {
      const int64_t range = a.layoutRange[int64_t(j) * R + r];
      const int begin = int(range >> 32), n = int(range & 0xffffffff);
      if (i >= begin && i < begin + n) {
        s = r;
        pos = i - begin;
      }
    }
    if (s < 0 || isMasked(lt, s)) continue;
    const int tok = a.srcInfo[idx], k = a.srcSlot[idx];
    if (k < 0) continue;
    const char* src = a.x + idx * xb;
    if (!isRemote(t, s)) {
      warpCopy16FromInput(t.base[s] + y.gpuCombRow(b, tok, k), src, xb, lane);
    } else {
      const uint64_t stage = y.combStageRow(b, j, lt.remoteSlot[s], pos);
      warpCopy16FromInput(t.mirror + stage, src, xb, lane);
      __syncwarp();
      ChannelDeviceHandle ch = t.net[s];
      const Status st = ch.putWarp(t.stageWindow, y.mirrorCombRow(b, tok, k), t.stageWindow, stage, xb);
      if (__any_sync(0xffffffffu, st != Status::kOk) && lane == 0) maskRank(lt, s);
    }
  }
  if (!lastBlock(&lt.ll->sendBlocks)) return;
  const int d = threadIdx.x;  // every rank learns that this rank's rows of epoch e are in place
  if (d < R && !isMasked(lt, d)) {
    if (isRemote(t, d)) {
      ChannelDeviceHandle ch = t.net[d];
      if (ch.signal(lt.sentSignal + me, e, SignalOp::kSet) != Status::kOk) maskRank(lt, d);
    } else {
      atomicStore(&llCtrl(t.base[d])->combDone[b][me], e, kRelease);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->sendSeq = e;
}

__device__ inline void addScaledBf16x8(float (&acc)[8], const int4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    acc[2 * q] += w * f.x;
    acc[2 * q + 1] += w * f.y;
  }
}

__global__ void __launch_bounds__(1024) llCombineRecv(LlTeam lt, LlCombineArgs a) {
  const Team& t = lt.t;
  const LlLayout& y = lt.lay;
  const uint64_t e = lt.ll->recvSeq + 1;
  const int b = int(e & 1), me = t.rank, R = t.numRanks, K = a.numTopk, lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), W = gridDim.x * (blockDim.x >> 5);
  const int s = threadIdx.x;
  if (s < R && !isMasked(lt, s)) {
    const uint64_t* w = isRemote(t, s) ? &t.netSignals[lt.sentSignal + s] : &llCtrl(t.base[me])->combDone[b][s];
    waitOrMask(lt, s, w, e, 0);
  }
  __syncthreads();
  __shared__ uint32_t mask;
  if (threadIdx.x == 0) mask = atomicLoad(&lt.ll->mask, kRelaxed);
  __syncthreads();
  const uint32_t vecs = uint32_t(y.H) / 8;
  const bool refused = *a.refused != 0;  // its dispatch sent nothing: no row comes back, every sum is zero
  for (int tok = gw; tok < a.numTokens; tok += W) {
    const char* src[kMaxTopk];
    float wt[kMaxTopk];
    int n = 0;
    for (int k = 0; k < (refused ? 0 : K); ++k) {
      const int64_t ex = a.topkIdx[int64_t(tok) * K + k];
      if (ex < 0 || ex >= y.E) continue;
      const int d = int(ex / y.L);
      if ((mask >> d) & 1u) continue;  // a masked rank's experts add nothing
      src[n] = isRemote(t, d) ? t.mirror + y.mirrorCombRow(b, tok, k) : t.base[me] + y.gpuCombRow(b, tok, k);
      wt[n] = a.topkWeights[int64_t(tok) * K + k];
      ++n;
    }
    int4* out = reinterpret_cast<int4*>(a.out + int64_t(tok) * y.H * 2);
    for (uint32_t c = lane; c < vecs; c += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int q = 0; q < n; ++q) addScaledBf16x8(acc, reinterpret_cast<const int4*>(src[q])[c], wt[q]);
      int4 r;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
      for (int q = 0; q < 4; ++q) h[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
      out[c] = r;
    }
  }
  if (!lastBlock(&lt.ll->recvBlocks)) return;
  releaseBuffer(lt, e);
  __syncthreads();
  if (threadIdx.x == 0) lt.ll->recvSeq = e;
}

}  // namespace

cudaError_t launchLlDispatchSend(const LlTeam& team, const LlDispatchArgs& a, cudaStream_t stream) {
  llDispatchSend<<<team.blocks, team.threads, 0, stream>>>(team, a);
  return cudaGetLastError();
}
cudaError_t launchLlDispatchRecv(const LlTeam& team, const LlDispatchArgs& a, cudaStream_t stream) {
  llDispatchRecv<<<team.blocks, team.threads, 0, stream>>>(team, a);
  return cudaGetLastError();
}
cudaError_t launchLlCombineSend(const LlTeam& team, const LlCombineArgs& a, cudaStream_t stream) {
  llCombineSend<<<team.blocks, team.threads, 0, stream>>>(team, a);
  return cudaGetLastError();
}
cudaError_t launchLlCombineRecv(const LlTeam& team, const LlCombineArgs& a, cudaStream_t stream) {
  llCombineRecv<<<team.blocks, team.threads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

}  // namespace gdx::ep::detail
