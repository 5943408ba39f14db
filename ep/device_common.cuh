// Device helpers of the EP kernels: bounded flag waits that report instead of hanging, the barrier that opens
// every operation, the "all blocks sent" signal, the end of an operation, and warp copies of rows with 16-byte
// vectors. The protocol they implement is described in ep/protocol.hpp.
#pragma once

#include <cstdint>
#include <cuda/atomic>

#include "ep/protocol.hpp"
#include "gdx/device/impl/atomic.hpp"
#include "gdx/device/impl/clock.hpp"
#include "gdx/device/impl/poll.hpp"
#include "gdx/device/impl/ptx.hpp"

namespace gdx::ep::detail {

__device__ inline Ctrl* ctrlOf(const Team& t, int r) {
  return reinterpret_cast<Ctrl*>(t.base[r]);
}
__device__ inline char* rowsOf(const Team& t, int r) {
  return t.base[r] + kCtrlBytes;
}

/// Records the first error of the Buffer (later ones are dropped: the first is the cause).
__device__ inline void report(const Team& t, uint32_t kind, uint32_t where, int peer, int64_t value, int64_t value2,
                              uint64_t epoch, int token = -1) {
  if (atomicCAS(&t.state->reportClaim, 0u, 1u) != 0u) return;
  Report* r = t.report;
  r->where = where;
  r->peer = peer;
  r->token = token;
  r->value = value;
  r->value2 = value2;
  r->epoch = epoch;
  atomicStore(&r->kind, kind, kRelease);
}

/// Waits until *flag >= want, bounded by the team's timeout; false (after reporting) on timeout or a failed peer.
/// kStamp: a row stamp (protocol.hpp, "Row stamps"): == want, polled with relaxed loads (the rows are read from L2,
/// see LoadPath), and `seenTag` XORed into the values reported, so that their epochs show.
template <bool kStamp = false>
__device__ inline bool waitFlag(const Team& t, uint64_t* flag, uint64_t want, WaitKind where, int peer, uint64_t epoch,
                                uint64_t seenTag = 0, int row = -1) {
  // Stamps are waited on by hundreds of warps at once, beside warps still sending: they poll every 256 ns and read
  // the failure word every 1024 polls. Polled like a flag (naps of 32 ns, the host-mapped failure word every 64
  // polls), a dispatch of 4096 tokens on 4 H200s took 28 ms instead of 0.73.
  constexpr uint64_t kCheckEvery = kStamp ? 1023 : 63;
  uint64_t v = 0;
  const Status s = gdx::detail::pollBounded(
      t.timeoutNs, kCheckEvery, kCheckEvery,
      [&](uint64_t, Status&) {
        v = atomicLoad(flag, kStamp ? kRelaxed : kAcquire);
        return kStamp ? v == want : v >= want;
      },
      [&](Status& failed) {
        // The failure word lives in host memory: read it only now and then, the flag is what the latency needs.
        const uint32_t f = t.failure ? atomicLoad(const_cast<uint32_t*>(t.failure), kRelaxed) : 0u;
        if (f == 0) return false;
        report(t, kPeerFailed, where, peer, static_cast<int64_t>(want ^ seenTag), static_cast<int64_t>(v ^ seenTag),
               epoch, row);
        failed = Status::kPeerFailed;
        return true;
      },
      [&] {
        report(t, kTimeout, where, peer, static_cast<int64_t>(want ^ seenTag), static_cast<int64_t>(v ^ seenTag), epoch,
               row);
        return Status::kTimeout;
      },
      [](uint64_t spins) {
        if (kStamp)
          __nanosleep(256);
        else if (spins > 256)
          __nanosleep(32);
      });
  return s == Status::kOk;
}

/// Waits until a row's stamp from rank `peer` reads epoch e (protocol.hpp, "Row stamps"); a failed wait reports
/// `where` (kWaitRow or kWaitReturnedRow) and `at` (the row or the token).
__device__ inline bool waitStamp(const Team& t, uint64_t* stamp, uint64_t e, int peer, WaitKind where, int at) {
  return waitFlag<true>(t, stamp, rowStamp(e), where, peer, e, rowStamp(0), at);
}

__device__ inline bool isRemote(const Team& t, int r) {
  return (t.remoteMask >> r) & 1u;
}
/// Where this rank's stores meant for rank r's Ctrl go: r's Ctrl itself (direct path) or the staging copy.
__device__ inline Ctrl* ctrlFor(const Team& t, int r) {
  return reinterpret_cast<Ctrl*>(isRemote(t, r) ? t.stage[r] : t.base[r]);
}
/// Where the Ctrl fields that rank s sent this rank are: this rank's window (direct path) or, for a rank on another
/// host, the receive mirror in host memory.
__device__ inline const Ctrl* recvCtrl(const Team& t, int s) {
  return reinterpret_cast<const Ctrl*>(isRemote(t, s) ? t.mirror : t.base[t.rank]);
}
/// The header and the rows of this rank's staging area for remote rank r (what one put carries to r's mirror).
__device__ inline int32_t* stageHeader(const Team& t, int r) {
  return reinterpret_cast<int32_t*>(t.stage[r] + kCtrlBytes);
}
__device__ inline char* stageRows(const Team& t, int r) {
  return t.stage[r] + kCtrlBytes + kSlotHeaderBytes;
}
/// The header and the rows that remote rank s put into this rank's mirror (its slot).
__device__ inline const int32_t* mirrorHeader(const Team& t, int s) {
  return reinterpret_cast<const int32_t*>(t.mirror + kCtrlBytes + uint64_t(s) * t.slotBytes);
}
__device__ inline const char* mirrorRows(const Team& t, int s) {
  return t.mirror + kCtrlBytes + uint64_t(s) * t.slotBytes + kSlotHeaderBytes;
}
__device__ inline uint32_t flagSignal(const Team& t, FlagKind kind, int sender) {
  return t.signalBase + uint32_t(kind) * kMaxRanks + uint32_t(sender);
}
__device__ inline uint64_t* ctrlFlag(Ctrl* c, FlagKind kind, int sender) {
  return kind == kFlagArrive   ? &c->arrive[sender]
         : kind == kFlagCounts ? &c->countsReady[sender]
                               : &c->dataDone[sender];
}

/// Puts `bytes` at `offset` of this rank's staging area for remote rank r to `dstOffset` of r's window, then sets
/// r's flag `kind` of this rank to e (bytes may be 0: the flag alone). A refused command is reported, not hung on.
__device__ inline bool putToRemote(const Team& t, int r, uint64_t dstOffset, uint64_t offset, uint64_t bytes,
                                   FlagKind kind, uint64_t e) {
  ChannelDeviceHandle ch = t.net[r];
  const Status s = ch.putWithSignal(t.stageWindow, dstOffset, t.stageWindow, t.stageOffset[r] + offset, bytes,
                                    flagSignal(t, kind, t.rank), e, SignalOp::kSet);
  if (s == Status::kOk) return true;
  report(t, kPeerFailed,
         kind == kFlagArrive   ? kWaitArrive
         : kind == kFlagCounts ? kWaitCounts
                               : kWaitData,
         r, static_cast<int64_t>(e), static_cast<int64_t>(s), e);
  return false;
}

/// Puts only the fields at [offset, offset + bytes) of this rank's Ctrl-shaped staging for r (no flag).
__device__ inline bool putCtrlToRemote(const Team& t, int r, uint64_t offset, uint64_t bytes) {
  ChannelDeviceHandle ch = t.net[r];
  const Status s = ch.put(t.stageWindow, offset, t.stageWindow, t.stageOffset[r] + offset, bytes);
  if (s == Status::kOk) return true;
  report(t, kPeerFailed, kWaitCounts, r, 0, static_cast<int64_t>(s), 0);
  return false;
}

/// Threads 0..R-1 wait for dataDone of epoch e from the ranks in `fromCtrl` (stored into this rank's Ctrl by a
/// direct peer or by the relay of a remote one) and from those in `fromSignal` (a remote rank's put). True on every
/// thread of the block when all arrived.
__device__ inline bool waitData(const Team& t, uint64_t e, uint32_t fromCtrl, uint32_t fromSignal) {
  bool ok = true;
  const int s = threadIdx.x;
  if (s < t.numRanks && ((fromCtrl | fromSignal) >> s) & 1u) {
    uint64_t* flag = (fromSignal >> s) & 1u ? const_cast<uint64_t*>(&t.netSignals[flagSignal(t, kFlagData, s)])
                                            : &ctrlOf(t, t.rank)->dataDone[s];
    ok = waitFlag(t, flag, e, kWaitData, s, e);
  }
  return !__syncthreads_or(!ok);
}

/// Threads 0..R-1 each wait for one rank's flag `kind` (arrive, countsReady or dataDone) to reach `e`: the Ctrl
/// word a direct peer stores, the signal a remote peer raises. `skipSelf` leaves this rank's own entry out. True on
/// every thread of the block when all arrived.
__device__ inline bool waitAll(const Team& t, FlagKind kind, uint64_t e, WaitKind where, bool skipSelf) {
  bool ok = true;
  const int s = threadIdx.x;
  if (s < t.numRanks && !(skipSelf && s == t.rank)) {
    uint64_t* flag = isRemote(t, s) ? const_cast<uint64_t*>(&t.netSignals[flagSignal(t, kind, s)])
                                    : ctrlFlag(ctrlOf(t, t.rank), kind, s);
    ok = waitFlag(t, flag, e, where, s, e);
  }
  return !__syncthreads_or(!ok);
}

/// The barrier that opens an operation: block 0 tells every rank this one arrived at epoch e, every block waits
/// for all ranks. True when every rank arrived.
__device__ inline bool openOp(const Team& t, uint64_t e) {
  bool ok = true;
  if (blockIdx.x == 0 && threadIdx.x < t.numRanks) {
    const int r = threadIdx.x;
    if (isRemote(t, r))
      ok = putToRemote(t, r, 0, 0, 0, kFlagArrive, e);
    else
      atomicStore(&ctrlOf(t, r)->arrive[t.rank], e, kRelease);
  }
  if (__syncthreads_or(!ok)) return false;
  return waitAll(t, kFlagArrive, e, kWaitArrive, false);
}

/// What the last block of a kernel puts to remote ranks once every block's rows are staged: for each rank in
/// `putMask`, the header (the row count) and `rows[r]` rows of `rowBytes` from its staging area into this rank's slot
/// of r's mirror, with r's dataDone flag of this rank as the put's signal.
struct NetRows {
  uint32_t putMask;
  uint32_t rowBytes;
  int32_t rows[kMaxRanks];
};

/// Puts the staged header and rows for remote rank r into this rank's slot of r's mirror, flag dataDone = e.
__device__ inline bool putRowsToRemote(const Team& t, int r, int32_t rows, uint32_t rowBytes, uint64_t e) {
  *stageHeader(t, r) = rows;
  __threadfence_system();  // the header before the command that makes the proxy read it
  return putToRemote(t, r, kCtrlBytes + uint64_t(t.rank) * t.slotBytes, kCtrlBytes,
                     kSlotHeaderBytes + uint64_t(rows) * rowBytes, kFlagData, e);
}

/// Counts the blocks done with a phase in *counter; true on every thread of the last block to arrive. Every thread of
/// every block must call it. The count is one acquire-release atomic at `Scope`: the other blocks' stores and loads
/// come before their atomic (the barrier orders them before thread 0's), the last block's atomic synchronizes with
/// theirs, and causality order is transitive, so whatever the last block then publishes with a release (a flag, a
/// proxy command) covers every block's stores. The low-latency kernels take the GPU scope (each system-scope fence is
/// about a microsecond on the path of every kernel there); the normal mode keeps the system scope.
template <cuda::thread_scope Scope>
__device__ inline bool lastBlock(uint32_t* counter) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<uint32_t, Scope> count(*counter);
    last = count.fetch_add(1u, cuda::std::memory_order_acq_rel) == gridDim.x - 1;
    if (last) count.store(0u, cuda::std::memory_order_relaxed);  // for the next launch (the kernel boundary orders it)
  }
  __syncthreads();
  return last;
}
/// lastBlock at system scope, true on thread 0 of the last block only (the normal mode's single-thread tails).
__device__ inline bool lastBlockDone(uint32_t* counter) {
  return lastBlock<cuda::thread_scope_system>(counter) && threadIdx.x == 0;
}

/// Called by every block once its stores are issued; the last block to get here tells the ranks of this host that
/// this rank's stores of epoch e are in place (a release store of dataDone[rank] into each one's Ctrl, its own
/// included) and puts the staged rows to the remote ranks in `net`.
__device__ inline void signalSent(const Team& t, uint64_t e, const NetRows& net) {
  if (!lastBlockDone(&t.state->sendBlocks)) return;  // its fences: every block's stores before the flags
  for (int d = 0; d < t.numRanks; ++d) {
    if ((net.putMask >> d) & 1u)
      putRowsToRemote(t, d, net.rows[d], net.rowBytes, e);
    else if ((t.localMask >> d) & 1u)
      atomicStore(&ctrlOf(t, d)->dataDone[t.rank], e, kRelease);
  }
}

/// Ends an operation: the last block of its last kernel advances the epoch (every block read it at its start).
__device__ inline void finishOp(const Team& t) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned old = atomicAdd(&t.state->opBlocks, 1u);
    if (old == gridDim.x - 1) {
      t.state->opBlocks = 0;
      t.state->seq = t.state->seq + 1;
    }
  }
}

/// Which load a warp copy uses. kCached: plain loads. kInput: non-coherent loads, for memory nobody writes during
/// the kernel (the caller's inputs). kL2: loads that skip L1, for rows a peer published with a stamp: they are issued
/// only after the stamp was seen (a relaxed load) and are served by L2, where the peer's stores were performed before
/// its stamp (its release fence). The acquire that would order them instead is, on sm_90, an invalidation of the
/// whole SM's L1, which each ready row would impose on the warps of the SM still sending.
enum class LoadPath { kCached, kInput, kL2 };

template <LoadPath P>
__device__ inline int4 loadVec(const int4* p) {
  if constexpr (P == LoadPath::kInput) return __ldg(p);
  if constexpr (P == LoadPath::kL2) return __ldcg(p);
  return *p;
}

/// A warp copies `bytes` (a multiple of 16, both sides 16-byte aligned): four vectors in flight per lane, the last
/// round too (its loads are predicated rather than taken one after another: a slice of a row, see rowSlice, often
/// ends in a partial round, and three dependent loads there cost three memory latencies).
template <LoadPath P = LoadPath::kCached>
__device__ inline void warpCopy16(char* dst, const char* src, uint32_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const uint32_t n = bytes / 16;
  for (uint32_t i = lane; i < n; i += 128) {
    int4 v0 = loadVec<P>(s + i), v1{}, v2{}, v3{};
    if (i + 32 < n) v1 = loadVec<P>(s + i + 32);
    if (i + 64 < n) v2 = loadVec<P>(s + i + 64);
    if (i + 96 < n) v3 = loadVec<P>(s + i + 96);
    d[i] = v0;
    if (i + 32 < n) d[i + 32] = v1;
    if (i + 64 < n) d[i + 64] = v2;
    if (i + 96 < n) d[i + 96] = v3;
  }
}

/// How many warps share one row when a kernel has fewer rows than warps: up to 8, each slice at least one full round
/// of warpCopy16 (2 KiB). With one warp a row, a call of 128 BF16 tokens left 448 of 576 warps idle and took as long
/// as one of 512 tokens (each warp's rows are copied round after round, latency-bound). Alike in every warp of the
/// grid (rows and warps are), so each (row, slice) unit has exactly one warp.
__device__ inline int rowParts(int rows, int warps, uint32_t rowBytes) {
  if (rows <= 0 || rows >= warps) return 1;
  const int byWarps = warps / rows, byBytes = static_cast<int>(rowBytes / 2048);
  return max(1, min(8, min(byWarps, byBytes)));
}

/// Slice `part` of `parts` of a row of `bytes` (a multiple of 16): `*offset` and `*len`, both multiples of 16.
__device__ inline void rowSlice(uint32_t bytes, int part, int parts, uint32_t* offset, uint32_t* len) {
  const uint32_t vecs = bytes / 16, per = (vecs + parts - 1) / parts;
  const uint32_t lo = min(vecs, per * part), hi = min(vecs, lo + per);
  *offset = lo * 16;
  *len = (hi - lo) * 16;
}

/// A warp copies `n` floats (no alignment beyond 4 bytes).
template <LoadPath P = LoadPath::kCached>
__device__ inline void warpCopyFloats(float* dst, const float* src, int n, int lane) {
  for (int i = lane; i < n; i += 32) dst[i] = P == LoadPath::kL2 ? __ldcg(src + i) : src[i];
}

}  // namespace gdx::ep::detail
