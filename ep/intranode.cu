// The EP kernels: the layout, the prepare step (routing and the exchange of counts), dispatch and combine, over the
// direct path between the ranks of a host (every such rank's buffer IPC-mapped here) and through the relays between
// hosts. Protocol and buffer layout: ep/protocol.hpp.
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

// ---- offsets --------------------------------------------------------------------------------------------------

__device__ inline bool sameHost(const Team& t, int a, int b) {
  return t.hostOf[a] == t.hostOf[b];
}

struct Offsets {
  int32_t inPrefix[kMaxRanks + 1];   // rows at this rank: those of source s start at inPrefix[s]
  int32_t atPeer[kMaxRanks];         // dispatch: where this rank's rows start at rank d; combine: at source s
  int32_t ownPrefix[kMaxRanks + 1];  // combine: rows this rank sent to d start at ownPrefix[d] (in its own buffer)
  int32_t relayAt[kMaxRanks];        // combine, remote source s: where this rank's rows for s start at s's relay
};

// Combine, at relay rho: the row where the rows that rank d returns for remote source s start. Rho's buffer holds
// first the rows of its own tokens coming back from the ranks of its host (ownPrefix), then, for each source it
// relays in rank order, each of its host's ranks' rows for that source in rank order.
__device__ inline int32_t combineRelayRow(const Team& t, const int32_t* matrix, int rho, int s, int d) {
  const int R = t.numRanks, host = t.hostOf[rho];
  int32_t at = 0;
  for (int x = 0; x < R; ++x)
    if (t.hostOf[x] == host) at += matrix[rho * R + x];
  for (int s2 = 0; s2 < s; ++s2)
    if (t.hostOf[s2] != host && t.relayOf[s2][host] == rho)
      for (int x = 0; x < R; ++x)
        if (t.hostOf[x] == host) at += matrix[s2 * R + x];
  for (int x = 0; x < d; ++x)
    if (t.hostOf[x] == host) at += matrix[s * R + x];
  return at;
}

// From the counts matrix (handle) into shared memory, by thread 0. Only ranks of this host store into each other's
// buffers; what crosses hosts goes through the relays.
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
    if (sameHost(t, d, me)) run += matrix[me * R + d];
  }
  o.ownPrefix[R] = run;
  for (int p = 0; p < R; ++p) {
    int at = 0;
    if (combine) {
      for (int d = 0; d < me; ++d)  // rows of source p from the ranks of this host before this one
        if (sameHost(t, d, me)) at += matrix[p * R + d];
      o.relayAt[p] = isRemote(t, p) ? combineRelayRow(t, matrix, t.relayOf[p][t.hostOf[me]], p, me) : 0;
    } else {
      for (int s = 0; s < me; ++s) at += matrix[s * R + p];  // rows at rank p from sources before this one
    }
    o.atPeer[p] = at;
  }
}

// ---- dispatch -------------------------------------------------------------------------------------------------

// Meta of a dispatch row: int32 source token, K int32 local expert ids, K f32 weights.
__device__ inline void writeMeta(char* meta, int tok, int localExpert, float weight, int K, int lane) {
  int32_t* m = reinterpret_cast<int32_t*>(meta);
  if (lane == 0) m[0] = tok;
  if (lane < K) {
    m[1 + lane] = localExpert;
    reinterpret_cast<float*>(m + 1 + K)[lane] = weight;
  }
}

// Meta of a relay row (protocol.hpp, relayRow): the token, its position at each rank of host h, and per top-k slot
// the rank of its expert, the local id there and the weight.
__device__ inline void writeRelayMeta(const Team& t, char* meta, int tok, const int32_t* sendPos, int h, int64_t expert,
                                      int epr, float weight, int K, int lane) {
  int32_t* m = reinterpret_cast<int32_t*>(meta);
  if (lane == 0) m[0] = tok;
  if (lane < kMaxRanks) m[1 + lane] = lane < t.numRanks && t.hostOf[lane] == h ? sendPos[lane] : -1;
  if (lane < K) {
    int32_t* slot = m + 1 + kMaxRanks + 3 * lane;
    slot[0] = expert >= 0 ? int32_t(expert / epr) : -1;
    slot[1] = expert >= 0 ? int32_t(expert % epr) : -1;
    slot[2] = __float_as_int(weight);
  }
}

// The relay's part of a dispatch: for each remote source it relays, once that source's rows are in the mirror, every
// row into the rows of each rank of this host that the row names (as a dispatch row, where that source would have
// stored it), its positions into the handle (for the combine); then dataDone[source] at each of those ranks.
__device__ bool relayDispatch(const Team& t, const DispatchArgs& a, uint64_t e) {
  const int R = t.numRanks, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  const RowLayout& rl = a.relay;
  const uint32_t xsBytes = a.row.xBytes + a.row.scaleBytes;  // x and scales are laid out alike in both rows
  __shared__ int32_t at[kMaxRanks];
  __shared__ int32_t n;
  for (int s = 0; s < R; ++s) {
    if (!((t.relayedFrom >> s) & 1u)) continue;
    bool ok = true;
    if (threadIdx.x == 0) {
      ok = waitFlag(t, const_cast<uint64_t*>(&t.netSignals[flagSignal(t, kFlagData, s)]), e, kWaitData, s, e);
      n = ok ? atomicLoad(const_cast<int32_t*>(mirrorHeader(t, s)), kRelaxed) : 0;
      if (n > a.handle.relayCap) {  // the prepare checked this; a handle of another dispatch may not hold it
        report(t, kRelayCapacity, 0, t.rank, n, a.handle.relayCap, e);
        n = a.handle.relayCap;
      }
      for (int d = 0; d < R; ++d) {
        int run = 0;
        for (int s2 = 0; s2 < s; ++s2) run += a.handle.matrix[s2 * R + d];
        at[d] = run;
      }
      if (blockIdx.x == 0) a.handle.relayRows[s] = n;
    }
    if (__syncthreads_or(!ok)) return false;
    for (int i = gw; i < n; i += W) {
      const char* r = mirrorRows(t, s) + int64_t(i) * rl.rowBytes;
      const int32_t* m = reinterpret_cast<const int32_t*>(r + rl.metaOffset);
      const int32_t tok = m[0];
      int32_t* keep = a.handle.relayPos + (int64_t(s) * a.handle.relayCap + i) * kMaxRanks;
      if (lane < kMaxRanks) keep[lane] = m[1 + lane];
      const int32_t* slot = m + 1 + kMaxRanks + 3 * (lane < K ? lane : 0);
      const int32_t slotRank = lane < K ? slot[0] : -1, slotLocal = slot[1];
      const float slotWeight = __int_as_float(slot[2]);
      for (int d = 0; d < R; ++d) {
        const int32_t pos = m[1 + d];
        if (pos < 0) continue;
        char* dst = rowsOf(t, d) + int64_t(at[d] + pos) * a.row.rowBytes;
        warpCopy16(dst, r, xsBytes, lane);
        const bool here = slotRank == d;
        writeMeta(dst + a.row.metaOffset, tok, here ? slotLocal : -1, here ? slotWeight : 0.f, K, lane);
      }
    }
    if (lastBlockDone(&t.state->relayBlocks[s]))
      for (int d = 0; d < R; ++d)
        if ((t.localMask >> d) & 1u) atomicStore(&ctrlOf(t, d)->dataDone[s], e, kRelease);
  }
  return true;
}

// How many warps share a row in sender s's send loop: from the counts matrix, so that every rank computes it alike
// (the receiver needs it to know whether s stamps its rows; protocol.hpp, "Row stamps").
__device__ inline int sendParts(const int32_t* matrix, int R, int s, int warps, uint32_t xb) {
  int most = 0;
  for (int d = 0; d < R; ++d) most = max(most, matrix[s * R + d]);
  return rowParts(most, warps, xb);
}

// Rows this rank receives from the senders that stamp them, as units of work: unit u is row u / n of the u % n-th
// such sender (n of them), so that each warp's units run through every sender's rows in the order they are stored.
struct StampedRows {
  int numSources, mostRows;
  int8_t source[kMaxRanks];
};

// The received row `row` of a dispatch (its bytes in this rank's buffer at r) into the outputs: the slice [lo, lo +
// len) of x, and when `first` its scales, source token and top-k.
__device__ inline void copyOutRow(const DispatchArgs& a, const char* r, int row, uint32_t lo, uint32_t len, bool first,
                                  int nScales, bool withTopk, int lane) {
  const int K = a.numTopk;
  const uint32_t xb = a.row.xBytes;
  warpCopy16<LoadPath::kL2>(static_cast<char*>(a.out.recvX) + int64_t(row) * xb + lo, r + lo, len, lane);
  if (!first) return;
  if (nScales && a.out.recvXScales)
    warpCopyFloats<LoadPath::kL2>(a.out.recvXScales + int64_t(row) * nScales,
                                  reinterpret_cast<const float*>(r + a.row.scaleOffset), nScales, lane);
  const int32_t* m = reinterpret_cast<const int32_t*>(r + a.row.metaOffset);
  if (lane == 0 && a.out.recvSrcIdx) a.out.recvSrcIdx[row] = __ldcg(m);
  if (withTopk && lane < K) {
    if (a.out.recvTopkIdx) a.out.recvTopkIdx[int64_t(row) * K + lane] = __ldcg(m + 1 + lane);
    if (a.out.recvTopkWeights)
      a.out.recvTopkWeights[int64_t(row) * K + lane] = __ldcg(reinterpret_cast<const float*>(m + 1 + K) + lane);
  }
}

// A warp's walk over its units of StampedRows, copying each row out once its stamp reads e. walk(false) copies the
// ready ones and stops at the first that is not (between the warp's own sends); walk(true) waits for each of the rest,
// bounded, and returns false when a wait failed (reported).
struct StampedReceiver {
  const Team& t;
  const DispatchArgs& a;
  const Offsets& o;
  const StampedRows& sr;
  uint64_t e;
  int unit, stride, end, cap, nScales, lane;
  bool withTopk;

  // The row of `unit`, or -1 when that unit has none (the sender has fewer rows, or the row is past the capacity).
  __device__ int rowOf(int u, int* source) const {
    const int s = sr.source[u % sr.numSources], pos = u / sr.numSources;
    *source = s;
    if (pos >= o.inPrefix[s + 1] - o.inPrefix[s]) return -1;
    const int row = o.inPrefix[s] + pos;
    return row < cap ? row : -1;
  }
  __device__ const char* rowAt(int row) const { return rowsOf(t, t.rank) + int64_t(row) * a.row.rowBytes; }
  __device__ uint64_t* stampOf(int row) const {
    return reinterpret_cast<uint64_t*>(const_cast<char*>(rowAt(row)) + a.row.stampOffset);
  }
  __device__ bool walk(bool wait) {
    for (; unit < end; unit += stride) {
      int s;
      const int row = rowOf(unit, &s);
      if (row < 0) continue;
      bool ready = true;
      if (lane == 0)  // the row itself is read from L2 (LoadPath)
        ready =
            wait ? waitStamp(t, stampOf(row), e, s, kWaitRow, row) : atomicLoad(stampOf(row), kRelaxed) == rowStamp(e);
      if (!__shfl_sync(0xffffffffu, ready, 0)) return false;
      copyOutRow(a, rowAt(row), row, 0, a.row.xBytes, true, nScales, withTopk, lane);
    }
    return true;
  }
};

__global__ void __launch_bounds__(1024) dispatchKernel(Team t, DispatchArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  const uint32_t xb = a.row.xBytes;
  __shared__ Offsets o;
  __shared__ NetRows net;
  __shared__ StampedRows sr;
  __shared__ uint32_t stampedFrom;  // the senders whose rows this rank takes by their stamps
  __shared__ int valid;
  if (threadIdx.x == 0) {
    valid = *a.handle.valid;
    computeOffsets(t, a.handle.matrix, o, false);
    net.putMask = t.relayMask;  // one relay row per token and other host it is needed on
    net.rowBytes = a.relay.rowBytes;
    for (int d = 0; d < R; ++d) net.rows[d] = (t.relayMask >> d) & 1u ? a.handle.hostCount[t.hostOf[d]] : 0;
    const int total = o.inPrefix[R];
    if (blockIdx.x == 0 && a.out.numRecvTokens) *a.out.numRecvTokens = total;
    if (valid && blockIdx.x == 0 && total > a.out.capacity) report(t, kRecvCapacity, 0, me, total, a.out.capacity, e);
    stampedFrom = 0;
    sr.numSources = 0;
    sr.mostRows = 0;
    for (int i = 1; i < R; ++i) {  // in the order the senders store (each starts with the rank after it)
      const int s = (me + R - i) % R;
      if (isRemote(t, s) || sendParts(a.handle.matrix, R, s, W, xb) != 1) continue;
      stampedFrom |= 1u << s;
      sr.source[sr.numSources++] = int8_t(s);
      sr.mostRows = max(sr.mostRows, o.inPrefix[s + 1] - o.inPrefix[s]);
    }
  }
  __syncthreads();
  if (!valid || !openOp(t, e)) {  // valid is alike on every rank (the prepare exchanged every rank's status)
    finishOp(t);
    return;
  }
  const int cap = a.out.capacity;
  const int epr = a.numExperts > 0 ? a.numExperts / R : 1;
  const int nScales = a.row.scaleBytes ? a.hidden / kFp8ScaleBlock : 0;
  const bool withTopk = a.topkIdx != nullptr;
  StampedReceiver rx{t, a, o, sr, e, gw, W, sr.numSources * sr.mostRows, cap, nScales, lane, withTopk};

  // Few tokens: several warps a token, each its slice of the row; the slice-0 warp also writes scales and meta.
  const int parts = sendParts(a.handle.matrix, R, me, W, xb);
  const bool stamp = parts == 1;  // whole rows: each stamped once stored (protocol.hpp, "Row stamps")
  for (int unit = gw; unit < a.numTokens * parts; unit += W) {
    const int tok = unit / parts, part = unit - tok * parts;
    const bool first = part == 0;
    uint32_t lo, len;
    rowSlice(xb, part, parts, &lo, &len);
    const char* src = a.x + int64_t(tok) * xb;
    int64_t expert = -1;
    float weight = 0.f;
    if (withTopk && lane < K) {
      expert = a.topkIdx[int64_t(tok) * K + lane];
      weight = a.topkWeights ? a.topkWeights[int64_t(tok) * K + lane] : 0.f;
    }
    const int32_t* sendPos = a.handle.sendPos + int64_t(tok) * R;
    for (int i = 1; i <= R; ++i) {  // the peers first (their stores take longest), this rank last
      const int d = (me + i) % R;
      const int pos = sendPos[d];
      if (pos < 0 || isRemote(t, d)) continue;  // ranks on other hosts: through their host's relay, below
      const int local =
          expert >= int64_t(d) * epr && expert < int64_t(d + 1) * epr ? int(expert - int64_t(d) * epr) : -1;
      const float w = local >= 0 ? weight : 0.f;
      if (d == me) {  // straight into the outputs
        const int row = o.inPrefix[me] + pos;
        if (row >= cap) continue;
        warpCopy16<LoadPath::kInput>(static_cast<char*>(a.out.recvX) + int64_t(row) * xb + lo, src + lo, len, lane);
        if (!first) continue;
        if (nScales && a.out.recvXScales)
          warpCopyFloats(a.out.recvXScales + int64_t(row) * nScales, a.xScales + int64_t(tok) * nScales, nScales, lane);
        if (withTopk && lane < K) {
          if (a.out.recvTopkIdx) a.out.recvTopkIdx[int64_t(row) * K + lane] = local;
          if (a.out.recvTopkWeights) a.out.recvTopkWeights[int64_t(row) * K + lane] = w;
        }
        if (lane == 0 && a.out.recvSrcIdx) a.out.recvSrcIdx[row] = tok;
      } else {
        char* dst = rowsOf(t, d) + int64_t(o.atPeer[d] + pos) * a.row.rowBytes;
        warpCopy16<LoadPath::kInput>(dst + lo, src + lo, len, lane);
        if (!first) continue;
        if (nScales)
          warpCopyFloats(reinterpret_cast<float*>(dst + a.row.scaleOffset), a.xScales + int64_t(tok) * nScales, nScales,
                         lane);
        writeMeta(dst + a.row.metaOffset, tok, local, w, K, lane);
      }
    }
    if (stamp) {  // every lane's stores of this token's rows, then the stamps that let the receivers read them
      __syncwarp();
      if (lane == 0) {
        ptx::fenceReleaseSys();
        for (int d = 0; d < R; ++d)
          if (d != me && sendPos[d] >= 0 && !isRemote(t, d))
            atomicStore(reinterpret_cast<uint64_t*>(rowsOf(t, d) + int64_t(o.atPeer[d] + sendPos[d]) * a.row.rowBytes +
                                                    a.row.stampOffset),
                        rowStamp(e), kRelaxed);
      }
      __syncwarp();
    }
    for (int rho = 0; rho < R && t.relayMask; ++rho) {  // once per other host, to its relay
      if (!((t.relayMask >> rho) & 1u)) continue;
      const int h = t.hostOf[rho];
      const int pos = a.handle.hostPos[int64_t(tok) * R + h];
      if (pos < 0) continue;
      char* dst = stageRows(t, rho) + int64_t(pos) * a.relay.rowBytes;
      warpCopy16<LoadPath::kInput>(dst + lo, src + lo, len, lane);
      if (!first) continue;
      if (nScales)
        warpCopyFloats(reinterpret_cast<float*>(dst + a.relay.scaleOffset), a.xScales + int64_t(tok) * nScales, nScales,
                       lane);
      writeRelayMeta(t, dst + a.relay.metaOffset, tok, sendPos, h, expert, epr, weight, K, lane);
    }
    rx.walk(false);  // what has arrived from the other senders, between this warp's own tokens
  }
  const bool received = rx.walk(true);
  signalSent(t, e, net);
  if (__syncthreads_or(!received) || (t.relayedFrom && !relayDispatch(t, a, e))) {
    finishOp(t);
    return;
  }
  // The other senders' rows are in this rank's buffer: stored by the ranks of this host, by this host's relays for
  // the ranks of other hosts; each raised dataDone here.
  const uint32_t others = ((1u << R) - 1u) & ~(1u << me) & ~stampedFrom;
  if (!others) {
    finishOp(t);
    return;
  }
  if (!waitData(t, e, others, 0u)) {
    finishOp(t);
    return;
  }
  const int end = min(o.inPrefix[R], cap);
  const char* rows = rowsOf(t, me);
  const int outParts = rowParts(end, W, xb);
  for (int unit = gw; unit < end * outParts; unit += W) {
    const int row = unit / outParts, part = unit - row * outParts;
    int s = 0;
    while (row >= o.inPrefix[s + 1]) ++s;
    if (!((others >> s) & 1u)) continue;  // this rank's own rows are there already, stamped ones were taken above
    uint32_t lo, len;
    rowSlice(xb, part, outParts, &lo, &len);
    copyOutRow(a, rows + int64_t(row) * a.row.rowBytes, row, lo, len, part == 0, nScales, withTopk, lane);
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

__device__ inline int4 toBf16x8(const float (&acc)[8]) {
  int4 r;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
  return r;
}

// A warp sums n BF16 rows of `vecs` 16-byte vectors (+ the bias rows, when not null) into `out`, in f32, rounded
// once, sources in order. Two sources at a time, two vectors per lane each: four loads in flight per lane, and no
// register array indexed by the runtime count n (such an array lives on the stack: the form that loaded every source
// into int4 v[kMaxRanks][2] first spilled 3.7 KB per thread and made the combine twice as slow as the dispatch).
__device__ inline void warpSumRows(char* out, const char* const* src, int n, const char* bias0, const char* bias1,
                                   uint32_t vecs, int lane) {
  for (uint32_t c0 = lane; c0 < vecs; c0 += 64) {
    const uint32_t c1 = c0 + 32;
    const bool second = c1 < vecs;
    float acc0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 1 < n; j += 2) {
      const int4* p = reinterpret_cast<const int4*>(src[j]);
      const int4* q = reinterpret_cast<const int4*>(src[j + 1]);
      const int4 p0 = loadVec<LoadPath::kL2>(p + c0), q0 = loadVec<LoadPath::kL2>(q + c0);
      int4 p1{}, q1{};
      if (second) {
        p1 = loadVec<LoadPath::kL2>(p + c1);
        q1 = loadVec<LoadPath::kL2>(q + c1);
      }
      addBf16x8(acc0, p0);
      addBf16x8(acc0, q0);
      if (second) {
        addBf16x8(acc1, p1);
        addBf16x8(acc1, q1);
      }
    }
    if (j < n) {
      const int4* p = reinterpret_cast<const int4*>(src[j]);
      const int4 p0 = loadVec<LoadPath::kL2>(p + c0);
      int4 p1{};
      if (second) p1 = loadVec<LoadPath::kL2>(p + c1);
      addBf16x8(acc0, p0);
      if (second) addBf16x8(acc1, p1);
    }
    if (bias0) {
      addBf16x8(acc0, reinterpret_cast<const int4*>(bias0)[c0]);
      if (second) addBf16x8(acc1, reinterpret_cast<const int4*>(bias0)[c1]);
    }
    if (bias1) {
      addBf16x8(acc0, reinterpret_cast<const int4*>(bias1)[c0]);
      if (second) addBf16x8(acc1, reinterpret_cast<const int4*>(bias1)[c1]);
    }
    reinterpret_cast<int4*>(out)[c0] = toBf16x8(acc0);
    if (second) reinterpret_cast<int4*>(out)[c1] = toBf16x8(acc1);
  }
}

// The relay's part of a combine: once every rank of this host stored its rows for the sources this rank relays,
// one row per relayed token (the sum of those ranks' rows, and of their weights) into the staging area for its
// source, put into the source's mirror with its dataDone flag.
__device__ bool relayCombine(const Team& t, const CombineArgs& a, uint64_t e, uint32_t rowBytes) {
  const int R = t.numRanks, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  const uint32_t weightsOffset = align16(uint64_t(a.hidden) * 2), vecs = uint32_t(a.hidden) * 2 / 16;
  if (!waitData(t, e, t.localMask, 0u)) return false;
  __shared__ int32_t at[kMaxRanks];
  __shared__ int32_t n;
  for (int s = 0; s < R; ++s) {
    if (!((t.relayedFrom >> s) & 1u)) continue;
    if (threadIdx.x == 0) {
      n = min(a.handle.relayRows[s], a.handle.relayCap);
      for (int d = 0; d < R; ++d)
        at[d] = (t.localMask >> d) & 1u ? combineRelayRow(t, a.handle.matrix, t.rank, s, d) : 0;
    }
    __syncthreads();
    for (int i = gw; i < n; i += W) {
      const int32_t* pos = a.handle.relayPos + (int64_t(s) * a.handle.relayCap + i) * kMaxRanks;
      const char* src[kMaxRanks];
      int m = 0;
      for (int d = 0; d < R; ++d)
        if (pos[d] >= 0) src[m++] = rowsOf(t, t.rank) + int64_t(at[d] + pos[d]) * rowBytes;
      char* out = stageRows(t, s) + int64_t(i) * rowBytes;
      warpSumRows(out, src, m, nullptr, nullptr, vecs, lane);
      if (a.topkWeights && lane < K) {
        float w = 0.f;
        for (int j = 0; j < m; ++j) w += reinterpret_cast<const float*>(src[j] + weightsOffset)[lane];
        reinterpret_cast<float*>(out + weightsOffset)[lane] = w;
      }
    }
    if (lastBlockDone(&t.state->relayBlocks[s])) putRowsToRemote(t, s, n, rowBytes, e);
  }
  return true;
}

// Rows a combine sender d sends back (all it received): from the counts matrix, alike on every rank.
__device__ inline int combineSendParts(const int32_t* matrix, int R, int d, int warps, uint32_t xb) {
  int rows = 0;
  for (int s = 0; s < R; ++s) rows += matrix[s * R + d];
  return rowParts(rows, warps, xb);
}

// What a combine's sum reads for token `tok`: the rows that came back from the ranks of this host it was sent to
// (its own row straight from the inputs) and the one row of each other host, their weights alongside.
struct SumSources {
  const char* src[kMaxRanks];
  const float* weights[kMaxRanks];
  int n;
};

__device__ inline SumSources sumSourcesOf(const Team& t, const CombineArgs& a, const Offsets& o, int tok,
                                          uint32_t rowBytes) {
  const int R = t.numRanks, me = t.rank, K = a.numTopk;
  const uint32_t xb = static_cast<uint32_t>(a.hidden) * 2, weightsOffset = align16(xb);
  SumSources ss;
  ss.n = 0;
  for (int d = 0; d < R; ++d) {
    const int pos = a.handle.sendPos[int64_t(tok) * R + d];
    if (pos < 0 || isRemote(t, d)) continue;
    if (d == me) {  // this rank's own row: straight from the inputs
      ss.src[ss.n] = a.x + int64_t(o.inPrefix[me] + pos) * xb;
      ss.weights[ss.n] = a.topkWeights ? a.topkWeights + int64_t(o.inPrefix[me] + pos) * K : nullptr;
    } else {
      ss.src[ss.n] = rowsOf(t, me) + int64_t(o.ownPrefix[d] + pos) * rowBytes;
      ss.weights[ss.n] = reinterpret_cast<const float*>(ss.src[ss.n] + weightsOffset);
    }
    ++ss.n;
  }
  for (int rho = 0; rho < R && t.relayMask; ++rho) {  // one row per other host, from its relay
    if (!((t.relayMask >> rho) & 1u)) continue;
    const int pos = a.handle.hostPos[int64_t(tok) * R + t.hostOf[rho]];
    if (pos < 0) continue;
    ss.src[ss.n] = mirrorRows(t, rho) + int64_t(pos) * rowBytes;
    ss.weights[ss.n] = reinterpret_cast<const float*>(ss.src[ss.n] + weightsOffset);
    ++ss.n;
  }
  return ss;
}

// The slice [lo, lo + len) of token tok's sum (and, when `first`, its weights) into the outputs.
__device__ inline void sumToken(const CombineArgs& a, SumSources ss, int tok, uint32_t lo, uint32_t len, bool first,
                                int lane) {
  const int K = a.numTopk;
  const uint32_t xb = static_cast<uint32_t>(a.hidden) * 2;
  for (int j = 0; j < ss.n; ++j) ss.src[j] += lo;
  warpSumRows(a.out + int64_t(tok) * xb + lo, ss.src, ss.n, a.bias0 ? a.bias0 + int64_t(tok) * xb + lo : nullptr,
              a.bias1 ? a.bias1 + int64_t(tok) * xb + lo : nullptr, len / 16, lane);
  if (first && a.outWeights && a.topkWeights && lane < K) {
    float w = 0.f;
    for (int j = 0; j < ss.n; ++j) w += __ldcg(ss.weights[j] + lane);
    a.outWeights[int64_t(tok) * K + lane] = w;
  }
}

// A warp's walk over its tokens of a stamped combine, summing each once the rows it reads all carry e's stamp.
// walk(false) sums the ready ones and stops at the first that is not (between the warp's own sends); walk(true) waits
// for each of the rest, bounded, and returns false when a wait failed (reported, with the token).
struct StampedSummer {
  const Team& t;
  const CombineArgs& a;
  const Offsets& o;
  uint64_t e;
  int tok, stride;
  uint32_t rowBytes, stampOffset;
  int lane;

  // Lane d (< R): the stamp of the row that rank d sent back for token `tok`, or null when there is none to wait for.
  __device__ uint64_t* laneStamp() const {
    const int R = t.numRanks;
    if (lane >= R || lane == t.rank) return nullptr;
    const int pos = a.handle.sendPos[int64_t(tok) * R + lane];
    if (pos < 0) return nullptr;
    return reinterpret_cast<uint64_t*>(rowsOf(t, t.rank) + int64_t(o.ownPrefix[lane] + pos) * rowBytes + stampOffset);
  }
  __device__ bool walk(bool wait) {
    const uint32_t xb = static_cast<uint32_t>(a.hidden) * 2;
    for (; tok < a.numTokens; tok += stride) {
      uint64_t* stamp = laneStamp();  // the rows themselves are read from L2 (LoadPath)
      const bool ready = !stamp || (wait ? waitStamp(t, stamp, e, lane, kWaitReturnedRow, tok)
                                         : atomicLoad(stamp, kRelaxed) == rowStamp(e));
      if (!__all_sync(0xffffffffu, ready)) return false;
      sumToken(a, sumSourcesOf(t, a, o, tok, rowBytes), tok, 0, xb, true, lane);
    }
    return true;
  }
};

// Every received row goes back toward its source rank: into the rows of that rank's buffer reserved for this rank
// when it is on this host, into those of its relay on this host otherwise (the relay sums a token's rows from this
// host and sends one row back). Then each rank sums, per token, the rows that came back from the ranks of its host
// it sent the token to (its own row straight from the input) and the one row of each other host. With every rank on
// this host and whole rows everywhere, the sums run between the sends, token by token as their rows' stamps arrive.
__global__ void __launch_bounds__(1024) combineKernel(Team t, CombineArgs a) {
  const uint64_t e = t.state->seq + 1;
  const int R = t.numRanks, me = t.rank, K = a.numTopk;
  const int lane = threadIdx.x & 31, numWarps = blockDim.x >> 5;
  const int gw = blockIdx.x * numWarps + (threadIdx.x >> 5), W = gridDim.x * numWarps;
  const uint32_t xb = static_cast<uint32_t>(a.hidden) * 2;
  __shared__ Offsets o;
  __shared__ NetRows net;
  __shared__ int valid;
  __shared__ bool stamped;  // this rank sums by the rows' stamps
  __shared__ int parts;     // warps a row of this rank's sends: combineSendParts, as every rank computes it
  const uint32_t rowBytes = combineRowBytes(a.hidden, K), stampOffset = combineStampOffset(a.hidden, K);
  const int sumParts = rowParts(a.numTokens, W, xb);
  if (threadIdx.x == 0) {
    valid = *a.handle.valid;
    computeOffsets(t, a.handle.matrix, o, true);
    net.putMask = 0;  // the relays put
    stamped = !t.relayMask && !t.relayedFrom && sumParts == 1;
    for (int d = 0; d < R; ++d) {
      const int p = combineSendParts(a.handle.matrix, R, d, W, xb);
      if (d == me)
        parts = p;
      else if (p != 1)
        stamped = false;
    }
  }
  __syncthreads();
  if (!valid || !openOp(t, e)) {
    finishOp(t);
    return;
  }
  const uint32_t weightsOffset = align16(xb);
  const int total = o.inPrefix[R];
  StampedSummer sum{t, a, o, e, gw, W, rowBytes, stampOffset, lane};
  // The rows go out by their source rank starting with the rank after this one (me + 1, me + 2, ...), as the dispatch
  // stores: in rank order, the warps of every rank would store into rank 0's memory first, then all into rank 1's,
  // each rank's NVLink ingress taking every sender's rows in turn while the others idle.
  const int rotation = o.inPrefix[(me + 1) % R];
  for (int unit = gw; unit < total * parts; unit += W) {
    const int k = unit / parts, part = unit - k * parts;
    const int row = k + rotation < total ? k + rotation : k + rotation - total;
    int s = 0;
    while (row >= o.inPrefix[s + 1]) ++s;
    if (s == me) continue;
    const int pos = row - o.inPrefix[s];
    const bool direct = !isRemote(t, s);
    char* dst = direct ? rowsOf(t, s) + int64_t(o.atPeer[s] + pos) * rowBytes
                       : rowsOf(t, t.relayOf[s][t.hostOf[me]]) + int64_t(o.relayAt[s] + pos) * rowBytes;
    uint32_t lo, len;
    rowSlice(xb, part, parts, &lo, &len);
    warpCopy16<LoadPath::kInput>(dst + lo, a.x + int64_t(row) * xb + lo, len, lane);
    if (part == 0 && a.topkWeights && lane < K)
      reinterpret_cast<float*>(dst + weightsOffset)[lane] = a.topkWeights[int64_t(row) * K + lane];
    if (parts == 1 && direct) {  // the row's stores, then its stamp (protocol.hpp, "Row stamps")
      __syncwarp();
      if (lane == 0) {
        ptx::fenceReleaseSys();
        atomicStore(reinterpret_cast<uint64_t*>(dst + stampOffset), rowStamp(e), kRelaxed);
      }
      __syncwarp();
    }
    if (stamped) sum.walk(false);
  }
  if (stamped) {
    sum.walk(true);         // a failed wait was reported: the host turns it into the error
    signalSent(t, e, net);  // dataDone still goes out: ranks that sum after it wait for it
    finishOp(t);
    return;
  }
  signalSent(t, e, net);
  if (t.relayedFrom && !relayCombine(t, a, e, rowBytes)) {
    finishOp(t);
    return;
  }
  if (!waitData(t, e, t.localMask & ~(1u << me), t.relayMask)) {
    finishOp(t);
    return;
  }
  for (int unit = gw; unit < a.numTokens * sumParts; unit += W) {
    const int tok = unit / sumParts, part = unit - tok * sumParts;
    uint32_t lo, len;
    rowSlice(xb, part, sumParts, &lo, &len);
    sumToken(a, sumSourcesOf(t, a, o, tok, rowBytes), tok, lo, len, part == 0, lane);
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

cudaError_t maxCoResidentBlocks(int device, int numThreads, int* out) {
  int sms = 0, dispatchPerSm = 0, combinePerSm = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dispatchPerSm, dispatchKernel, numThreads, 0);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&combinePerSm, combineKernel, numThreads, 0);
  *out = sms * std::min(dispatchPerSm, combinePerSm);
  return e;
}

}  // namespace gdx::ep::detail
