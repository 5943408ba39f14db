// The relay: the internode part of the normal mode. A token crosses the network once per destination host, to the
// rank of that host with its source's local index (Team::relayOf), which forwards it over NVLink to the ranks there
// that need it; in a combine that rank sums their rows and sends one row back. Here: the meta of a relay row (the
// sender's side), the relay's forward of a dispatch and its sum of a combine, each called by the kernel of its
// operation (ep/normal_dispatch.cu, ep/normal_combine.cu) once its own sends are out. Protocol: ep/protocol.hpp,
// "The relay".
#pragma once

#include "ep/normal_device.cuh"

namespace gdx::ep::detail {

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
__device__ inline bool relayDispatch(const Team& t, const DispatchArgs& a, uint64_t e) {
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

// The relay's part of a combine: once every rank of this host stored its rows for the sources this rank relays,
// one row per relayed token (the sum of those ranks' rows, and of their weights) into the staging area for its
// source, put into the source's mirror with its dataDone flag.
__device__ inline bool relayCombine(const Team& t, const CombineArgs& a, uint64_t e, uint32_t rowBytes) {
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

}  // namespace gdx::ep::detail
