// Device helpers of the EP kernels: bounded flag waits that report instead of hanging, the barrier that opens
// every operation, the "all blocks sent" signal, the end of an operation, and warp copies of rows with 16-byte
// vectors. The protocol they implement is described in ep/protocol.hpp.
#pragma once

#include <cstdint>

#include "ep/protocol.hpp"
#include "gdx/detail/atomic.hpp"
#include "gdx/detail/clock.hpp"

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
__device__ inline bool waitFlag(const Team& t, uint64_t* flag, uint64_t want, WaitKind where, int peer,
                                uint64_t epoch) {
  uint64_t start = 0;
  for (uint64_t spins = 0;; ++spins) {
    const uint64_t v = atomicLoad(flag, kAcquire);
    if (v >= want) return true;
    if ((spins & 63) == 63) {
      // The failure word lives in host memory: read it only now and then, the flag is what the latency needs.
      const uint32_t f = t.failure ? atomicLoad(const_cast<uint32_t*>(t.failure), kRelaxed) : 0u;
      if (f != 0) {
        report(t, kPeerFailed, where, peer, static_cast<int64_t>(want), static_cast<int64_t>(v), epoch);
        return false;
      }
      const uint64_t now = nowNs();
      if (start == 0) start = now;
      if (now - start > t.timeoutNs) {
        report(t, kTimeout, where, peer, static_cast<int64_t>(want), static_cast<int64_t>(v), epoch);
        return false;
      }
    }
    if (spins > 256) __nanosleep(32);
  }
}

__device__ inline bool isRemote(const Team& t, int r) {
  return (t.remoteMask >> r) & 1u;
}
/// Where this rank's stores meant for rank r's Ctrl go: r's Ctrl itself (direct path) or the staging copy.
__device__ inline Ctrl* ctrlFor(const Team& t, int r) {
  return reinterpret_cast<Ctrl*>(isRemote(t, r) ? t.stage[r] : t.base[r]);
}
/// Where this rank's rows for rank r start: at `atPeer` rows into r's rows (direct path) or at the staging rows.
__device__ inline char* rowsFor(const Team& t, int r, int atPeer, uint32_t rowBytes) {
  return isRemote(t, r) ? t.stage[r] + kCtrlBytes : rowsOf(t, r) + int64_t(atPeer) * rowBytes;
}
/// Where the Ctrl fields and the rows that rank s sent this rank are: this rank's window (direct path) or, for a
/// rank on another host, the receive mirror in host memory.
__device__ inline const Ctrl* recvCtrl(const Team& t, int s) {
  return reinterpret_cast<const Ctrl*>(isRemote(t, s) ? t.mirror : t.base[t.rank]);
}
__device__ inline const char* recvRows(const Team& t, int s) {
  return (isRemote(t, s) ? t.mirror : t.base[t.rank]) + kCtrlBytes;
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

/// Bytes of this rank's rows for each remote rank in the current operation, and where they go in its window.
struct NetRows {
  uint64_t dstOffset[kMaxRanks];
  uint64_t bytes[kMaxRanks];
};

/// Called by every block once its stores to the peers are issued; the last block to get here tells every other
/// rank that this rank's rows of epoch e are in place: a release store for a direct peer, the put of the staged
/// rows with the flag as its signal for a remote one (`net`; may be null when there is no remote rank).
__device__ inline void signalSent(const Team& t, uint64_t e, const NetRows* net) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // this block's stores (ordered before by the barrier) reach the peers first
    const unsigned old = atomicAdd(&t.state->sendBlocks, 1u);
    if (old == gridDim.x - 1) {
      t.state->sendBlocks = 0;
      __threadfence_system();  // every block's stores, seen through the counter, before the flags
      for (int d = 0; d < t.numRanks; ++d) {
        if (d == t.rank) continue;
        if (isRemote(t, d))
          putToRemote(t, d, kCtrlBytes + net->dstOffset[d], kCtrlBytes, net->bytes[d], kFlagData, e);
        else
          atomicStore(&ctrlOf(t, d)->dataDone[t.rank], e, kRelease);
      }
    }
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

/// A warp copies `bytes` (a multiple of 16, both sides 16-byte aligned): four vectors in flight per lane.
__device__ inline void warpCopy16(char* dst, const char* src, uint32_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const uint32_t n = bytes / 16;
  uint32_t i = lane;
  for (; i + 96 < n; i += 128) {
    const int4 v0 = s[i], v1 = s[i + 32], v2 = s[i + 64], v3 = s[i + 96];
    d[i] = v0;
    d[i + 32] = v1;
    d[i + 64] = v2;
    d[i + 96] = v3;
  }
  for (; i < n; i += 32) d[i] = s[i];
}

/// The same from memory nobody writes during the kernel (the caller's inputs): non-coherent streaming loads.
__device__ inline void warpCopy16FromInput(char* dst, const char* src, uint32_t bytes, int lane) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  const uint32_t n = bytes / 16;
  uint32_t i = lane;
  for (; i + 96 < n; i += 128) {
    const int4 v0 = __ldg(s + i), v1 = __ldg(s + i + 32), v2 = __ldg(s + i + 64), v3 = __ldg(s + i + 96);
    d[i] = v0;
    d[i + 32] = v1;
    d[i + 64] = v2;
    d[i + 96] = v3;
  }
  for (; i < n; i += 32) d[i] = __ldg(s + i);
}

/// A warp copies `n` floats (no alignment beyond 4 bytes).
__device__ inline void warpCopyFloats(float* dst, const float* src, int n, int lane) {
  for (int i = lane; i < n; i += 32) dst[i] = src[i];
}

}  // namespace gdx::ep::detail
