// What the normal-mode dispatch and combine (ep/normal_dispatch.cu, ep/normal_combine.cu) and the relay between
// them (ep/normal_relay.cuh) share: where each rank's rows start, from the counts matrix of the handle, the meta of a
// dispatch row, and a warp's f32 sum of BF16 rows. Device code is not linked across those files' translation units,
// so it lives in this header. Protocol and buffer layout: ep/protocol.hpp.
#pragma once

#include <cuda_bf16.h>

#include "ep/device_common.cuh"

namespace gdx::ep::detail {

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

// ---- rows -----------------------------------------------------------------------------------------------------

// Meta of a dispatch row: int32 source token, K int32 local expert ids, K f32 weights.
__device__ inline void writeMeta(char* meta, int tok, int localExpert, float weight, int K, int lane) {
  int32_t* m = reinterpret_cast<int32_t*>(meta);
  if (lane == 0) m[0] = tok;
  if (lane < K) {
    m[1 + lane] = localExpert;
    reinterpret_cast<float*>(m + 1 + K)[lane] = weight;
  }
}

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

}  // namespace gdx::ep::detail
