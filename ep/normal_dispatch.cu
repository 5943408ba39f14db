// The normal-mode dispatch kernel: every token's row into the rows of each rank of this host it goes to (direct
// stores over NVLink, stamped whole rows read as they land), into the staging area of each other host's relay (put
// through the proxy once every block is done), then, on a relay, the forward of what other hosts sent it
// (ep/normal_relay.cuh), and the received rows into the outputs. Protocol and buffer layout: ep/protocol.hpp.
#include "ep/launchers.hpp"
#include "ep/normal_relay.cuh"

namespace gdx::ep::detail {
namespace {

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

}  // namespace

cudaError_t launchDispatch(const Team& team, const DispatchArgs& a, const Config& cfg, cudaStream_t stream) {
  dispatchKernel<<<cfg.numSms, cfg.numThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

cudaError_t dispatchBlocksPerSm(int numThreads, int* out) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dispatchKernel, numThreads, 0);
}

}  // namespace gdx::ep::detail
