// The EP kernels over the direct path (every rank's buffer IPC-mapped here): the layout, the prepare step (routing
// and the exchange of counts), dispatch and combine. Protocol and buffer layout: ep/protocol.hpp.
#include <cuda_bf16.h>

#include "ep/device_common.cuh"

namespace gdx::ep::detail {
namespace {

constexpr int kPrepareThreads = 1024;
constexpr int kLayoutThreads = 256;

// ---- layout ---------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kLayoutThreads) layoutKernel(Team t, LayoutArgs a) {
  __shared__ int32_t perExpert[kMaxExperts];
  __shared__ int32_t perRank[kMaxRanks];
  for (int i = threadIdx.x; i < a.numExperts; i += blockDim.x) perExpert[i] = 0;
  if (threadIdx.x < kMaxRanks) perRank[threadIdx.x] = 0;
  __syncthreads();
  const int epr = a.numExperts / a.numRanks;
  for (int tok = blockIdx.x * blockDim.x + threadIdx.x; tok < a.numTokens; tok += gridDim.x * blockDim.x) {
    unsigned mask = 0;
    for (int k = 0; k < a.numTopk; ++k) {
      const int64_t v = a.topkIdx[int64_t(tok) * a.numTopk + k];
      if (v < -1 || v >= a.numExperts) {
        report(t, kBadExpert, 0, t.rank, v, a.numExperts, 0);
      } else if (v >= 0) {
        atomicAdd(&perExpert[v], 1);
        mask |= 1u << (v / epr);
      }
    }
    for (int d = 0; d < a.numRanks; ++d) {
      const bool in = (mask >> d) & 1u;
      a.inRank[int64_t(tok) * a.numRanks + d] = in;
      if (in) atomicAdd(&perRank[d], 1);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.numExperts; i += blockDim.x)
    if (perExpert[i]) atomicAdd(&a.perExpert[i], perExpert[i]);
  if (threadIdx.x < a.numRanks && perRank[threadIdx.x]) atomicAdd(&a.perRank[threadIdx.x], perRank[threadIdx.x]);
}

// ---- prepare: routing, counts, exchange ----------------------------------------------------------------------

// One block. Every token's destination ranks (from its experts), its row among the tokens sent to each rank (a
// block-wide scan), the tokens per rank and per expert; then the barrier, each rank's counts into every peer's
// Ctrl, and, once all ranks' counts are here, the matrix and the received counts per local expert.
__global__ void __launch_bounds__(kPrepareThreads) prepareKernel(Team t, PrepareArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk, epr = a.numExperts / R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, numWarps = blockDim.x >> 5;
  __shared__ int32_t perExpert[kMaxExperts];
  __shared__ int32_t perRank[kMaxRanks];
  __shared__ int32_t warpBase[32][kMaxRanks];
  __shared__ int bad;
  __shared__ long long badValue;
  for (int i = threadIdx.x; i < a.numExperts; i += blockDim.x) perExpert[i] = 0;
  if (threadIdx.x < kMaxRanks) perRank[threadIdx.x] = 0;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();

  for (int base = 0; base < a.numTokens; base += blockDim.x) {  // uniform trip count: the ballots need every lane
    const int tok = base + threadIdx.x;
    unsigned mask = 0;
    if (tok < a.numTokens) {
      for (int k = 0; k < K; ++k) {
        const int64_t v = a.topkIdx[int64_t(tok) * K + k];
        if (v < -1 || v >= a.numExperts) {
          if (atomicExch(&bad, 1) == 0) badValue = v;
        } else if (v >= 0) {
          atomicAdd(&perExpert[v], 1);
          mask |= 1u << (v / epr);
        }
      }
    }
    for (int d = 0; d < R; ++d) {
      const unsigned b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (lane == 0) warpBase[warp][d] = __popc(b);
    }
    __syncthreads();
    if (threadIdx.x < R) {  // exclusive scan of the warps' counts, after the tokens of earlier chunks
      const int d = threadIdx.x;
      int run = perRank[d];
      for (int w = 0; w < numWarps; ++w) {
        const int c = warpBase[w][d];
        warpBase[w][d] = run;
        run += c;
      }
      perRank[d] = run;
    }
    __syncthreads();
    for (int d = 0; d < R; ++d) {
      const unsigned b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
      if (tok < a.numTokens)
        a.handle.sendPos[int64_t(tok) * R + d] =
            (mask >> d) & 1u ? warpBase[warp][d] + __popc(b & ((1u << lane) - 1u)) : -1;
    }
    __syncthreads();
  }

  bool ok = openOp(t, e);
  if (ok) {
    for (int i = threadIdx.x; i < R * R; i += blockDim.x) ctrlFor(t, i / R)->counts[me][i % R] = perRank[i % R];
    for (int i = threadIdx.x; i < R * epr; i += blockDim.x)
      ctrlFor(t, i / epr)->expertCounts[me][i % epr] = perExpert[(i / epr) * epr + i % epr];
    if (threadIdx.x < R) {
      Ctrl* c = ctrlFor(t, threadIdx.x);
      c->status[me] = bad ? kBadExpert : kNone;
      c->statusValue[me] = bad ? badValue : 0;
    }
    __syncthreads();
    bool sent = true;
    if (threadIdx.x < R) {
      const int d = threadIdx.x;
      __threadfence_system();
      if (isRemote(t, d)) {  // this rank's fields of d's Ctrl, from the staging copy; the flag rides on the last
        const uint64_t statusValueAt = offsetof(Ctrl, statusValue) + uint64_t(me) * 8;
        sent =
            putCtrlToRemote(t, d, offsetof(Ctrl, counts) + uint64_t(me) * kMaxRanks * 4, uint64_t(R) * 4) &&
            putCtrlToRemote(t, d, offsetof(Ctrl, expertCounts) + uint64_t(me) * kMaxExperts * 4, uint64_t(epr) * 4) &&
            putCtrlToRemote(t, d, offsetof(Ctrl, status) + uint64_t(me) * 4, 4) &&
            putToRemote(t, d, statusValueAt, statusValueAt, 8, kFlagCounts, e);
      } else {
        atomicStore(&ctrlOf(t, d)->countsReady[me], e, kRelease);
      }
    }
    ok = !__syncthreads_or(!sent) && waitAll(t, kFlagCounts, e, kWaitCounts, false);
  }
  if (ok) {
    __shared__ int valid;
    if (threadIdx.x == 0) {
      valid = 1;
      for (int s = 0; s < R && valid; ++s) {
        const Ctrl* from = recvCtrl(t, s);
        if (from->status[s] == kNone) continue;
        valid = 0;
        if (s == me)
          report(t, from->status[s], 0, s, from->statusValue[s], a.numExperts, e);
        else
          report(t, kPeerError, 0, s, from->status[s], from->statusValue[s], e);
      }
      int32_t n = 0;
      for (int s = 0; s < R; ++s) n += recvCtrl(t, s)->counts[s][me];
      *a.handle.numRecv = n;
      *a.handle.valid = valid;
      if (a.numRecvOut) *a.numRecvOut = n;
      a.hostCounts[0] = n;
    }
    for (int i = threadIdx.x; i < R * R; i += blockDim.x) a.handle.matrix[i] = recvCtrl(t, i / R)->counts[i / R][i % R];
    for (int j = threadIdx.x; j < epr; j += blockDim.x) {
      int32_t n = 0;
      for (int s = 0; s < R; ++s) n += recvCtrl(t, s)->expertCounts[s][j];
      if (a.alignment > 1) n = (n + a.alignment - 1) / a.alignment * a.alignment;
      if (a.perExpertOut) a.perExpertOut[j] = n;
      a.hostCounts[1 + j] = n;
    }
  } else if (threadIdx.x == 0) {
    *a.handle.valid = 0;
  }
  finishOp(t);
}

// ---- dispatch -------------------------------------------------------------------------------------------------

struct Offsets {
  int32_t inPrefix[kMaxRanks + 1];   // rows at this rank: those of source s start at inPrefix[s]
  int32_t atPeer[kMaxRanks];         // dispatch: where this rank's rows start at rank d; combine: at source s
  int32_t ownPrefix[kMaxRanks + 1];  // combine: rows this rank sent to d start at ownPrefix[d] (in its own buffer)
};

// From the counts matrix (handle) into shared memory, by thread 0.
__device__ inline void computeOffsets(const Team& t, const int32_t* matrix, Offsets& o, bool combine) {
  const int R = t.numRanks, me = t.rank;
  int run = 0;
  for (int s = 0; s < R; ++s) {
    o.inPrefix[s] = run;
    run += matrix[s * R + me];
  }
  o.inPrefix[R] = run;
  run = 0;
  for (int d = 0; d < R; ++d) {
    o.ownPrefix[d] = run;
    run += matrix[me * R + d];
  }
  o.ownPrefix[R] = run;
  for (int p = 0; p < R; ++p) {
    int at = 0;
    if (combine)
      for (int d = 0; d < me; ++d) at += matrix[p * R + d];  // rows of source p from ranks before this one
    else
      for (int s = 0; s < me; ++s) at += matrix[s * R + p];  // rows at rank p from sources before this one
    o.atPeer[p] = at;
  }
}

// Meta of a dispatch row: int32 source token, K int32 local expert ids, K f32 weights.
__device__ inline void writeMeta(char* meta, int tok, int localExpert, float weight, int K, int lane) {
  int32_t* m = reinterpret_cast<int32_t*>(meta);
  if (lane == 0) m[0] = tok;
  if (lane < K) {
    m[1 + lane] = localExpert;
    reinterpret_cast<float*>(m + 1 + K)[lane] = weight;
  }
}

__global__ void __launch_bounds__(1024) dispatchKernel(Team t, DispatchArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  __shared__ Offsets o;
  __shared__ NetRows net;
  __shared__ int valid;
  if (threadIdx.x == 0) {
    valid = *a.handle.valid;
    computeOffsets(t, a.handle.matrix, o, false);
    for (int d = 0; d < R; ++d) {  // this rank's rows for d: contiguous from atPeer[d] in d's rows
      net.dstOffset[d] = uint64_t(o.atPeer[d]) * a.row.rowBytes;
      net.bytes[d] = uint64_t(a.handle.matrix[me * R + d]) * a.row.rowBytes;
    }
    const int total = o.inPrefix[R];
    if (blockIdx.x == 0 && a.out.numRecvTokens) *a.out.numRecvTokens = total;
    if (valid && blockIdx.x == 0 && total > a.out.capacity) report(t, kRecvCapacity, 0, me, total, a.out.capacity, e);
  }
  __syncthreads();
  if (!valid || !openOp(t, e)) {  // valid is alike on every rank (the prepare exchanged every rank's status)
    finishOp(t);
    return;
  }
  const int cap = a.out.capacity;
  const int epr = a.numExperts > 0 ? a.numExperts / R : 0;
  const uint32_t xb = a.row.xBytes;
  const int nScales = a.row.scaleBytes ? a.hidden / kFp8ScaleBlock : 0;
  const bool withTopk = a.topkIdx != nullptr;

  for (int tok = gw; tok < a.numTokens; tok += W) {
    const char* src = a.x + int64_t(tok) * xb;
    int64_t expert = -1;
    float weight = 0.f;
    if (withTopk && lane < K) {
      expert = a.topkIdx[int64_t(tok) * K + lane];
      weight = a.topkWeights ? a.topkWeights[int64_t(tok) * K + lane] : 0.f;
    }
    for (int i = 1; i <= R; ++i) {  // the peers first (their stores take longest), this rank last
      const int d = (me + i) % R;
      const int pos = a.handle.sendPos[int64_t(tok) * R + d];
      if (pos < 0) continue;
      const int local =
          expert >= int64_t(d) * epr && expert < int64_t(d + 1) * epr ? int(expert - int64_t(d) * epr) : -1;
      const float w = local >= 0 ? weight : 0.f;
      if (d == me) {  // straight into the outputs
        const int row = o.inPrefix[me] + pos;
        if (row >= cap) continue;
        warpCopy16FromInput(static_cast<char*>(a.out.recvX) + int64_t(row) * xb, src, xb, lane);
        if (nScales && a.out.recvXScales)
          warpCopyFloats(a.out.recvXScales + int64_t(row) * nScales, a.xScales + int64_t(tok) * nScales, nScales, lane);
        if (withTopk && lane < K) {
          if (a.out.recvTopkIdx) a.out.recvTopkIdx[int64_t(row) * K + lane] = local;
          if (a.out.recvTopkWeights) a.out.recvTopkWeights[int64_t(row) * K + lane] = w;
        }
        if (lane == 0 && a.out.recvSrcIdx) a.out.recvSrcIdx[row] = tok;
      } else {
        char* dst = rowsFor(t, d, o.atPeer[d], a.row.rowBytes) + int64_t(pos) * a.row.rowBytes;
        warpCopy16FromInput(dst, src, xb, lane);
        if (nScales)
          warpCopyFloats(reinterpret_cast<float*>(dst + a.row.scaleOffset), a.xScales + int64_t(tok) * nScales, nScales,
                         lane);
        writeMeta(dst + a.row.metaOffset, tok, local, w, K, lane);
      }
    }
  }
  signalSent(t, e, &net);
  if (!waitAll(t, kFlagData, e, kWaitData, true)) {
    finishOp(t);
    return;
  }
  // The peers' rows, from this rank's buffer into the outputs (this rank's own rows are there already).
  const int end = min(o.inPrefix[R], cap);
  for (int row = gw; row < end; row += W) {
    if (row >= o.inPrefix[me] && row < o.inPrefix[me + 1]) continue;
    int s = 0;
    while (row >= o.inPrefix[s + 1]) ++s;
    const char* r = recvRows(t, s) + int64_t(row) * a.row.rowBytes;
    warpCopy16(static_cast<char*>(a.out.recvX) + int64_t(row) * xb, r, xb, lane);
    if (nScales && a.out.recvXScales)
      warpCopyFloats(a.out.recvXScales + int64_t(row) * nScales, reinterpret_cast<const float*>(r + a.row.scaleOffset),
                     nScales, lane);
    const int32_t* m = reinterpret_cast<const int32_t*>(r + a.row.metaOffset);
    if (lane == 0 && a.out.recvSrcIdx) a.out.recvSrcIdx[row] = m[0];
    if (withTopk && lane < K) {
      if (a.out.recvTopkIdx) a.out.recvTopkIdx[int64_t(row) * K + lane] = m[1 + lane];
      if (a.out.recvTopkWeights)
        a.out.recvTopkWeights[int64_t(row) * K + lane] = reinterpret_cast<const float*>(m + 1 + K)[lane];
    }
  }
  finishOp(t);
}

// ---- combine --------------------------------------------------------------------------------------------------

__device__ inline void addBf16x8(float (&acc)[8], const int4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    acc[2 * j] += f.x;
    acc[2 * j + 1] += f.y;
  }
}

// Every received row goes back to its source rank, into the rows of that rank's buffer reserved for this rank
// (in the order the source sent them); then each rank sums, per token, the rows that came back from every rank it
// sent the token to (its own row straight from the input).
__global__ void __launch_bounds__(1024) combineKernel(Team t, CombineArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  __shared__ Offsets o;
  __shared__ NetRows net;
  __shared__ int valid;
  const uint32_t rowBytes = combineRowBytes(a.hidden, K);
  if (threadIdx.x == 0) {
    valid = *a.handle.valid;
    computeOffsets(t, a.handle.matrix, o, true);
    for (int s = 0; s < R; ++s) {  // the rows received from s go back contiguous from atPeer[s] in s's rows
      net.dstOffset[s] = uint64_t(o.atPeer[s]) * rowBytes;
      net.bytes[s] = uint64_t(o.inPrefix[s + 1] - o.inPrefix[s]) * rowBytes;
    }
  }
  __syncthreads();
  if (!valid || !openOp(t, e)) {
    finishOp(t);
    return;
  }
  const uint32_t xb = static_cast<uint32_t>(a.hidden) * 2;
  const uint32_t weightsOffset = align16(xb);
  const int total = o.inPrefix[R];
  for (int row = gw; row < total; row += W) {
    int s = 0;
    while (row >= o.inPrefix[s + 1]) ++s;
    if (s == me) continue;
    char* dst = rowsFor(t, s, o.atPeer[s], rowBytes) + int64_t(row - o.inPrefix[s]) * rowBytes;
    warpCopy16FromInput(dst, a.x + int64_t(row) * xb, xb, lane);
    if (a.topkWeights && lane < K)
      reinterpret_cast<float*>(dst + weightsOffset)[lane] = a.topkWeights[int64_t(row) * K + lane];
  }
  signalSent(t, e, &net);
  if (!waitAll(t, kFlagData, e, kWaitData, true)) {
    finishOp(t);
    return;
  }
  const uint32_t vecs = xb / 16;
  for (int tok = gw; tok < a.numTokens; tok += W) {
    const char* src[kMaxRanks];
    const float* wsrc[kMaxRanks];
    int n = 0;
    for (int d = 0; d < R; ++d) {
      const int pos = a.handle.sendPos[int64_t(tok) * R + d];
      if (pos < 0) continue;
      if (d == me) {
        src[n] = a.x + int64_t(o.inPrefix[me] + pos) * xb;
        wsrc[n] = a.topkWeights ? a.topkWeights + int64_t(o.inPrefix[me] + pos) * K : nullptr;
      } else {
        const char* r = recvRows(t, d) + int64_t(o.ownPrefix[d] + pos) * rowBytes;
        src[n] = r;
        wsrc[n] = reinterpret_cast<const float*>(r + weightsOffset);
      }
      ++n;
    }
    char* out = a.out + int64_t(tok) * xb;
    // Two vectors per lane per step, every source's loads issued before any sum: more loads in flight per warp.
    for (uint32_t c0 = lane; c0 < vecs; c0 += 64) {
      const bool second = c0 + 32 < vecs;
      float acc[2][8];
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[u][j] = 0.f;
      int4 v[kMaxRanks][2];
#pragma unroll
      for (int j = 0; j < kMaxRanks; ++j)
        if (j < n) {
          v[j][0] = reinterpret_cast<const int4*>(src[j])[c0];
          if (second) v[j][1] = reinterpret_cast<const int4*>(src[j])[c0 + 32];
        }
#pragma unroll
      for (int j = 0; j < kMaxRanks; ++j)
        if (j < n) {
          addBf16x8(acc[0], v[j][0]);
          if (second) addBf16x8(acc[1], v[j][1]);
        }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (u == 1 && !second) break;
        const uint32_t c = c0 + 32 * u;
        if (a.bias0) addBf16x8(acc[u], reinterpret_cast<const int4*>(a.bias0 + int64_t(tok) * xb)[c]);
        if (a.bias1) addBf16x8(acc[u], reinterpret_cast<const int4*>(a.bias1 + int64_t(tok) * xb)[c]);
        int4 r;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
        for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(acc[u][2 * j], acc[u][2 * j + 1]);
        reinterpret_cast<int4*>(out)[c] = r;
      }
    }
    if (a.outWeights && a.topkWeights && lane < K) {
      float w = 0.f;
      for (int j = 0; j < n; ++j) w += wsrc[j][lane];
      a.outWeights[int64_t(tok) * K + lane] = w;
    }
  }
  finishOp(t);
}

}  // namespace

cudaError_t launchLayout(const Team& team, const LayoutArgs& a, cudaStream_t stream) {
  const int blocks = a.numTokens == 0 ? 1 : std::min(132, (a.numTokens + kLayoutThreads - 1) / kLayoutThreads);
  layoutKernel<<<blocks, kLayoutThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

cudaError_t launchPrepare(const Team& team, const PrepareArgs& a, cudaStream_t stream) {
  prepareKernel<<<1, kPrepareThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

cudaError_t launchDispatch(const Team& team, const DispatchArgs& a, const Config& cfg, cudaStream_t stream) {
  dispatchKernel<<<cfg.numSms, cfg.numThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

cudaError_t launchCombine(const Team& team, const CombineArgs& a, const Config& cfg, cudaStream_t stream) {
  combineKernel<<<cfg.numSms, cfg.numThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

}  // namespace gdx::ep::detail
