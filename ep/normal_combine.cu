// The normal-mode combine kernel: every received row back toward its source (into that rank's rows on this host,
// into its relay's otherwise), on a relay the sum of the rows for the sources it relays for (ep/normal_relay.cuh),
// then each token's sum of the rows that came back (as their stamps land when every rank is on this host).
// Protocol and buffer layout: ep/protocol.hpp.
#include "ep/launchers.hpp"
#include "ep/normal_relay.cuh"

namespace gdx::ep::detail {
namespace {

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

cudaError_t launchCombine(const Team& team, const CombineArgs& a, const Config& cfg, cudaStream_t stream) {
  combineKernel<<<cfg.numSms, cfg.numThreads, 0, stream>>>(team, a);
  return cudaGetLastError();
}

cudaError_t combineBlocksPerSm(int numThreads, int* out) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, combineKernel, numThreads, 0);
}

}  // namespace gdx::ep::detail
