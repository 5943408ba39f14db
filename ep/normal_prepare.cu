// The normal mode's kernels before a dispatch: the layout (getDispatchLayout: tokens per rank and per expert) and the
// prepare (every token's rows at each rank and at each other host's relay, then the exchange of the counts with every
// rank, over NVLink or through the proxy). Protocol and buffer layout: ep/protocol.hpp.
#include <algorithm>

#include "ep/device_common.cuh"
#include "ep/launchers.hpp"

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

// One block. Every token's destination ranks (from its experts, or in the by-rank form from isTokenInRank) and, with
// ranks on other hosts, the hosts among them; its row among the tokens sent to each rank and to each other host's
// relay (a block-wide scan over those columns), the tokens per rank and per expert (the by-rank form takes the
// latter from numTokensPerExpert); then the barrier, each rank's counts into every peer's Ctrl, and, once all ranks'
// counts are here, the matrix and the received counts per local expert.
__global__ void __launch_bounds__(kPrepareThreads) prepareKernel(Team t, PrepareArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk, epr = a.numExperts / R;
  const int C = t.relayMask ? 2 * R : R;  // scan columns: the ranks, then the hosts by host id
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, numWarps = blockDim.x >> 5;
  __shared__ int32_t perExpert[kMaxExperts];
  __shared__ int32_t perCol[2 * kMaxRanks];
  __shared__ int32_t warpBase[32][2 * kMaxRanks];
  __shared__ uint32_t bad;  // the ErrorKind of this rank's bad input (kNone: fine), exchanged with the counts
  __shared__ long long badValue;
  for (int i = threadIdx.x; i < a.numExperts; i += blockDim.x) perExpert[i] = 0;
  if (threadIdx.x < 2 * kMaxRanks) perCol[threadIdx.x] = 0;
  if (threadIdx.x == 0) bad = kNone;
  __syncthreads();
  const bool byRank = a.numTokensPerExpert != nullptr;
  if (byRank) {  // the caller's per-expert counts, for the counted ones (read by other threads after openOp's sync)
    for (int i = threadIdx.x; i < a.numExperts; i += blockDim.x) {
      const int32_t n = a.numTokensPerExpert[i];
      perExpert[i] = n;
      if (n < 0 && atomicExch(&bad, uint32_t(kBadExpertCount)) == kNone) badValue = packBadCount(i, n);
    }
  }

  for (int base = 0; base < a.numTokens; base += blockDim.x) {  // uniform trip count: the ballots need every lane
    const int tok = base + threadIdx.x;
    unsigned cols = 0;
    if (tok < a.numTokens) {
      if (!byRank) {
        for (int k = 0; k < K; ++k) {
          const int64_t v = a.topkIdx[int64_t(tok) * K + k];
          if (v < -1 || v >= a.numExperts) {
            if (atomicExch(&bad, uint32_t(kBadExpert)) == kNone) badValue = v;
          } else if (v >= 0) {
            atomicAdd(&perExpert[v], 1);
            cols |= 1u << (v / epr);
          }
        }
      } else {
        const uint8_t* in = a.isTokenInRank + int64_t(tok) * R;
        for (int d = 0; d < R; ++d) cols |= unsigned(in[d] != 0) << d;
      }
      for (int d = 0; d < R && t.relayMask; ++d)  // a token for a rank on another host goes to that host's relay
        if ((cols >> d) & 1u && isRemote(t, d)) cols |= 1u << (R + t.hostOf[d]);
    }
    for (int c = 0; c < C; ++c) {
      const unsigned b = __ballot_sync(0xffffffffu, (cols >> c) & 1u);
      if (lane == 0) warpBase[warp][c] = __popc(b);
    }
    __syncthreads();
    if (threadIdx.x < C) {  // exclusive scan of the warps' counts, after the tokens of earlier chunks
      const int c = threadIdx.x;
      int run = perCol[c];
      for (int w = 0; w < numWarps; ++w) {
        const int n = warpBase[w][c];
        warpBase[w][c] = run;
        run += n;
      }
      perCol[c] = run;
    }
    __syncthreads();
    for (int c = 0; c < C; ++c) {
      const unsigned b = __ballot_sync(0xffffffffu, (cols >> c) & 1u);
      const int pos = (cols >> c) & 1u ? warpBase[warp][c] + __popc(b & ((1u << lane) - 1u)) : -1;
      if (tok < a.numTokens) (c < R ? a.handle.sendPos : a.handle.hostPos)[int64_t(tok) * R + c % R] = pos;
    }
    __syncthreads();
  }
  if (threadIdx.x < R) a.handle.hostCount[threadIdx.x] = t.relayMask ? perCol[R + threadIdx.x] : 0;

  bool ok = openOp(t, e);
  if (ok) {
    for (int i = threadIdx.x; i < R * R; i += blockDim.x) ctrlFor(t, i / R)->counts[me][i % R] = perCol[i % R];
    for (int i = threadIdx.x; i < R * epr; i += blockDim.x)
      ctrlFor(t, i / epr)->expertCounts[me][i % epr] = perExpert[(i / epr) * epr + i % epr];
    if (threadIdx.x < R) {
      Ctrl* c = ctrlFor(t, threadIdx.x);
      c->status[me] = bad;
      c->statusValue[me] = bad != kNone ? badValue : 0;
      c->tokens[me][0] = a.numTokens;
      c->tokens[me][1] = a.relayCap;
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
            putCtrlToRemote(t, d, offsetof(Ctrl, tokens) + uint64_t(me) * 8, 8) &&
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
      // Every rank checks every relay alike (all saw the same numbers), so all skip the data phase together: a relay
      // keeps the positions of each source's relayed rows in its handle, which must hold that source's tokens
      // (dispatchWorst; dispatchPrepare grows the handle on the host instead).
      for (int s = 0; s < R && valid && t.relayMask; ++s)
        for (int h = 0; h < R && valid; ++h) {
          if (t.hostOf[h] != h || h == t.hostOf[s]) continue;
          const int rho = t.relayOf[s][h];
          const int32_t n = recvCtrl(t, s)->tokens[s][0], cap = recvCtrl(t, rho)->tokens[rho][1];
          if (n <= cap) continue;
          valid = 0;
          report(t, kRelayCapacity, 0, rho, n, cap, e);
        }
      int32_t n = 0;
      for (int s = 0; s < R; ++s) n += recvCtrl(t, s)->counts[s][me];
      *a.handle.numRecv = n;
      *a.handle.valid = valid;
      if (a.numRecvOut) *a.numRecvOut = n;
      a.hostCounts[0] = n;
      for (int s = 0; s < R; ++s) a.hostCounts[kHostCountsTokens + s] = recvCtrl(t, s)->tokens[s][0];
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

}  // namespace gdx::ep::detail
