// What the low-latency kernels and their host side share: the layout of the windows, the device state, the kernel
// arguments and launchers (ep/low_latency.cu). The public side is include/gdx/ep/low_latency.hpp.
//
// Each rank's GPU window (IPC-mapped by the same-host ranks):
//   LlCtrl | dispatch rows [2][L][R][T] slots | combine rows [2][T][K] rows of 2H
// and, with ranks on other hosts, one window of pinned host memory:
//   LlCtrl | dispatch rows [2][L][S][T] | combine rows [2][T][K]       the receive mirror those ranks put into
//   | dispatch staging [2][T] slots | count staging [2][kMaxRanks][L] | combine staging [2][L][S][T] rows of 2H
// (S: most ranks on other hosts any rank has; a remote source has a compact slot among them). Call n (dispatches
// and combines counted together) uses buffer n % 2 of every area.
//
// Synchronisation. A call's send kernel has epoch e = sendSeq + 1, its receive kernel e = recvSeq + 1 (device
// counters: a replayed CUDA graph advances them). Senders publish, after their rows, dispCount words
// ((e << 32) | rows) per (source, local expert) and then one release store dispDone[b][sender] = e, or (remote) one
// put of the L words with the signal sent[sender] = e on the ring of the data puts; a combine publishes
// combDone[b][sender] = e (or the signal). When a receive kernel is done with buffer b it tells every source
// freed[receiver] = e (a store, or the signal freed[receiver]); a send kernel of epoch e first waits for freed >= e - 2
// from every rank, so nobody overwrites a buffer its receiver still reads. Waits that time out mask the rank (see
// low_latency.hpp).
//
// Slots. A dispatch message carries its token and the token's whole top-k, and a row's slot at its source is the
// top-k entry naming the receiving expert. A token naming that expert in m slots sends m rows: the sender reserves
// m consecutive positions at once and gives the n-th slot naming it the n-th, so the receiver tells which of the m a
// row is by counting the rows just before it with the same token. Combine rows are kept per (token, slot).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ep/protocol.hpp"
#include "gdx/ep/low_latency.hpp"

namespace gdx::ep::detail {

struct LlCtrl {
  uint64_t dispCount[2][kMaxRanks][kMaxExperts];  // [b][source][local expert]: (epoch << 32) | rows
  uint64_t dispDone[2][kMaxRanks];                // [b][source]: epoch, once its dispCount words of b are written
  uint64_t combDone[2][kMaxRanks];                // [b][source]: epoch
  uint64_t freed[kMaxRanks];                      // [receiver]: the last epoch it finished reading
};
constexpr uint64_t kLlCtrlBytes = (sizeof(LlCtrl) + 4095) / 4096 * 4096;

/// Device state of a LowLatencyBuffer.
struct LlState {
  State common;  // reportClaim (the first error, protocol.hpp's report())
  uint64_t sendSeq;
  uint64_t recvSeq;
  uint32_t sendBlocks;
  uint32_t recvBlocks;
  uint32_t mask;                    // bit r: rank r is masked
  uint64_t recvVerdict[kMaxRanks];  // [source]: (receive epoch << 1) | whether its rows count in that dispatch
  int32_t sendCount[2][kMaxExperts];
};

/// Byte layout of one dispatch message: x (FP8 H or BF16 2H), scales (FP8), meta (int32 token, int32 top-k ids).
struct LlMessage {
  uint32_t xBytes, scaleOffset, metaOffset, bytes;
};
inline LlMessage llMessage(int hidden, int maxTopk, bool fp8) {
  LlMessage m;
  m.xBytes = align16(uint64_t(hidden) * (fp8 ? 1 : 2));
  m.scaleOffset = m.xBytes;
  m.metaOffset = m.xBytes + (fp8 ? align16(uint64_t(hidden / kFp8ScaleBlock) * 4) : 0);
  m.bytes = m.metaOffset + align16(4 + 4 * uint64_t(maxTopk));
  return m;
}

/// Sizes and offsets of the areas (the same on every rank).
struct LlLayout {
  int L, T, H, K, E, R, S;
  uint64_t slotBytes;     // a dispatch slot: the larger of the BF16 and FP8 messages
  uint64_t combRowBytes;  // 2H
  uint64_t gpuComb;       // offset of the combine rows in the GPU window
  uint64_t gpuBytes;
  uint64_t mirrorComb, dispStage, countStage, combStage, hostBytes;  // offsets in the host window

  GDX_HOST_DEVICE_INLINE uint64_t gpuDispRow(int b, int j, int s, int pos) const {
    return kLlCtrlBytes + ((uint64_t(b * L + j) * R + s) * T + pos) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t gpuCombRow(int b, int t, int k) const {
    return gpuComb + ((uint64_t(b) * T + t) * K + k) * combRowBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t mirrorDispRow(int b, int j, int slot, int pos) const {
    return kLlCtrlBytes + ((uint64_t(b * L + j) * S + slot) * T + pos) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t mirrorCombRow(int b, int t, int k) const {
    return mirrorComb + ((uint64_t(b) * T + t) * K + k) * combRowBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t dispStageRow(int b, int t) const {
    return dispStage + (uint64_t(b) * T + t) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t countStageOf(int b, int d) const {
    return countStage + (uint64_t(b) * kMaxRanks + d) * L * 8;
  }
  GDX_HOST_DEVICE_INLINE uint64_t combStageRow(int b, int j, int slot, int pos) const {
    return combStage + ((uint64_t(b * L + j) * S + slot) * T + pos) * combRowBytes;
  }
};
LlLayout llLayout(const LowLatencyConfig& c, int numRanks, int remoteSlots);

/// What the kernels of one rank need: the normal mode's Team (windows, channels, error report, timeout) plus the
/// low-latency state, layout and slots.
struct LlTeam {
  Team t;              // t.state points at ll->common; t.mirror: the host window's device address
  LlState* ll;         // device
  uint32_t* maskHost;  // host-mapped [kMaxRanks]: 1 once the rank is masked (what maskedRanks() reads)
  LlLayout lay;
  int8_t mirrorSlot[kMaxRanks];  // remote d: this rank's slot in d's mirror
  int8_t remoteSlot[kMaxRanks];  // remote s: s's slot in this rank's mirror
  uint32_t sentSignal;           // signal ids: sentSignal + sender, freedSignal + receiver
  uint32_t freedSignal;
  int blocks, threads;      // of every kernel (LowLatencyConfig)
  bool programmaticLaunch;  // LowLatencyConfig::programmaticLaunch
};

struct LlDispatchArgs {
  const char* x;
  const int64_t* topkIdx;
  int numTokens, numTopk;
  bool fp8, roundScale;
  LlMessage msg;
  LowLatencyDispatchOutputs out;
  int32_t* srcInfo;
  int32_t* srcSlot;
  int64_t* layoutRange;
  int32_t* refused;  // the handle's: set by the send kernel, 1 when it refused the top-k
};

struct LlCombineArgs {
  const char* x;
  const int64_t* topkIdx;
  const float* topkWeights;
  char* out;
  int numTokens, numTopk;
  const int32_t* srcInfo;
  const int32_t* srcSlot;
  const int64_t* layoutRange;
  const int32_t* refused;  // the dispatch refused this rank's top-k: nothing came back, every sum is zero
};

cudaError_t launchLlDispatchSend(const LlTeam& team, const LlDispatchArgs& a, cudaStream_t stream);
cudaError_t launchLlDispatchRecv(const LlTeam& team, const LlDispatchArgs& a, cudaStream_t stream);
cudaError_t launchLlCombineSend(const LlTeam& team, const LlCombineArgs& a, cudaStream_t stream);
cudaError_t launchLlCombineRecv(const LlTeam& team, const LlCombineArgs& a, cudaStream_t stream);

}  // namespace gdx::ep::detail
