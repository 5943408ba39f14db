// What the low-latency kernels and their host side share: the layout of the windows, the device state, the kernel
// arguments (the launchers: ep/launchers.hpp). The public side is include/gdx/ep/low_latency.hpp.
//
// Each rank's GPU window (IPC-mapped by the same-host ranks):
//   LlCtrl | dispatch messages [2][R][T] slots | combine rows [2][T][K] rows of 2H | combine weights [2][R][T][K]
//   tagged words (epoch tag << 32 | f32 bits) | combine rows' chunk stamps [2][T][K][chunks]
// and, with ranks on other hosts, one window of pinned host memory:
//   LlCtrl | dispatch messages [2][S][T] | combine rows [2][T][K] | combine weights [2][S][T][K]   the receive mirror
//   | dispatch staging [2][T] slots | count staging [2][kMaxRanks][L + 1] | combine staging [2][S][T] rows of 2H
//   | weight staging [2][T][K]                                                                       (those ranks put
//   into)
// (S: most ranks on other hosts any rank has; a remote source has a compact slot among them). Call n (dispatches
// and combines counted together, from 1: its epoch, below) uses buffer n % 2 of every area.
//
// Synchronisation. A call's send phase has epoch e = sendSeq + 1, its receive phase e = recvSeq + 1 (device counters,
// each advanced by the last block of its phase: a replayed CUDA graph advances them). Both phases are one kernel per
// operation (gdx::ep::ll::dispatch / combine, a phase argument): a launch of both phases (no hook) has each block do
// its sends, then its share of the receive, and is as large as fits on the GPU at once (LlTeam::bothBlocks), since a
// block's receive waits for data that other blocks of the same launch send. A dispatch's counts are dispCount words
// ((tag of e << 32) | n, the tag never 0 and never wrapping onto a recent epoch) per (source, local expert: its rows;
// and entry L: its messages). They follow from the top-k alone, so one block of the send phase (the last) counts them
// and publishes them to every rank of this host at its start, before it waits for the buffer (the counts have four
// slots, LlCtrl), each word tagged with e and taken once its tag reads e; each message there then carries its own stamp
// (e, released after the message's bytes, LlLayout::stampOffset), and the receiver copies a message as soon as its
// stamp reads e, while other blocks may still be sending. To a rank of another host the counts go after the messages:
// one put of the L + 1 words with the signal sent[sender] = e on the ring of the data puts, once every block's puts are
// out. A combine stamps each chunk of each row it sends a rank of this host (LlLayout::gpuCombStamp: e, released after
// the chunk's bytes), so that the receiver sums a chunk as soon as it lands; to a rank of another host it sends the
// signal sent[sender] = e after all its rows' puts. First, from its start, it sends its top-k weights: to a rank of
// this host as words (tag of e << 32) | weight, each taken once its tag reads e; to a rank of another host with the
// signal weights[sender] after them. When a receive phase is done with buffer b it tells every source freed[receiver]
// = e (a store, or the signal freed[receiver]); a send phase of epoch e first waits for freed >= e - 2 from every rank,
// so nobody overwrites a buffer its receiver still reads. Waits that time out mask the rank (see low_latency.hpp).
//
// Messages. A token goes to each rank that one of its top-k experts lives on once, whatever the number of those
// experts there: one message (the token, FP8 with scales or BF16) in that rank's area of the source, at a position
// the sender reserves per (source, destination). Its meta names, per top-k slot, the expert and the row the sender
// reserved for the token among those it sends that expert (-1: nothing sent for that slot); the receiver copies the
// message into the row of each slot naming one of its experts. Slots naming one expert twice get consecutive rows.
//
// Combine. Each rank sums, per message it received, the experts' outputs of that token's slots here, weighted by the
// source's top-k weights (which the source sends every rank at the start of its combine), and sends the source one row
// per (token, rank), into the combine row of the token's first slot naming this rank: the source adds at most one row
// per rank, and a token crosses each link once on the way back too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ep/protocol.hpp"
#include "gdx/ep/low_latency.hpp"

namespace gdx::ep::detail {

/// A dispatch's counts live in slot e % 4 (countSlot): they are published before the send's buffer wait, and the
/// receive of e - 2 may still be reading slot (e - 2) % 4 then; slot e % 4 was last read by the receive of e - 4, which
/// the send of e - 2 waited for.
constexpr int kCountSlots = 4;
GDX_HOST_DEVICE_INLINE int countSlot(uint64_t e) {
  return int(e % kCountSlots);
}

struct LlCtrl {
  uint64_t dispCount[kCountSlots][kMaxRanks]
                    [kMaxExperts + 1];  // [e % 4][source][local expert, L: messages]: (tag << 32) | n
  uint64_t freed[kMaxRanks];            // [receiver]: the last epoch it finished reading
};
constexpr uint64_t kLlCtrlBytes = (sizeof(LlCtrl) + 4095) / 4096 * 4096;

/// Device state of a LowLatencyBuffer.
struct LlState {
  State common;  // reportClaim (the first error, protocol.hpp's report())
  uint64_t sendSeq;
  uint64_t recvSeq;
  uint32_t sendBlocks;
  uint32_t recvBlocks;
  uint32_t mask;                      // bit r: rank r is masked (what the kernels go by)
  uint32_t failedMask;                // bit r: a kernel masked rank r (a wait, a refused put): it can never be unmasked
  uint64_t recvVerdict[kMaxRanks];    // [source]: (receive epoch << 1) | whether it counts in that receive
  uint64_t recvZeroed[kMaxRanks];     // [source]: the last receive epoch that zeroed its rows (a message never came)
  uint32_t combUnmaskedAtStart;       // the running combine receive: ranks some block started without masked
  int32_t sendCount[2][kMaxExperts];  // [b][expert]: rows reserved in this call
  int32_t sendMsgs[2][kMaxRanks];     // [b][destination]: messages reserved in this call
};

/// Byte layout of one dispatch message: x (FP8 H or BF16 2H), scales (FP8), meta (LlMeta).
struct LlMessage {
  uint32_t xBytes, scaleOffset, metaOffset, bytes;
};
/// A message's meta: the token, then per top-k slot (maxTopk of them) the expert and the row reserved for the token
/// among those sent that expert (both -1 when nothing was sent for the slot).
struct LlMeta {
  static GDX_HOST_DEVICE_INLINE uint32_t expertAt(int k) { return 4 + 4 * uint32_t(k); }
  static GDX_HOST_DEVICE_INLINE uint32_t rowAt(int maxTopk, int k) { return 4 + 4 * uint32_t(maxTopk + k); }
  static GDX_HOST_DEVICE_INLINE uint32_t bytes(int maxTopk) { return uint32_t(align16(4 + 8 * uint64_t(maxTopk))); }
};
inline LlMessage llMessage(int hidden, int maxTopk, bool fp8) {
  LlMessage m;
  m.xBytes = align16(uint64_t(hidden) * (fp8 ? 1 : 2));
  m.scaleOffset = m.xBytes;
  m.metaOffset = m.xBytes + (fp8 ? align16(uint64_t(hidden / kFp8ScaleBlock) * 4) : 0);
  m.bytes = m.metaOffset + LlMeta::bytes(maxTopk);
  return m;
}

/// A combine row's chunk (LlLayout::gpuCombStamp): the unit in which rows are announced, and so the smallest piece of a
/// row a warp sums on either side.
constexpr uint32_t kCombChunkBytes = 512;

/// Sizes and offsets of the areas (the same on every rank).
struct LlLayout {
  int L, T, H, K, E, R, S;
  uint64_t slotBytes;      // a dispatch message slot: the larger of the BF16 and FP8 messages, then 16 bytes (stamp)
  uint64_t combRowBytes;   // 2H
  uint64_t gpuComb;        // offset of the combine rows in the GPU window
  uint64_t gpuWeights;     // offset of the combine weights in the GPU window
  uint64_t gpuCombStamps;  // offset of the combine rows' chunk stamps in the GPU window
  uint64_t gpuBytes;
  uint64_t mirrorComb, mirrorWeights, dispStage, countStage, combStage, weightStage, hostBytes;  // in the host window

  /// The stamp of a message slot of the GPU window (a message of this host): the epoch of the call that wrote the
  /// message, released after its bytes. It has the slot's last 8 bytes to itself, whatever the message's format, and
  /// the window is zeroed at creation, so it only ever holds 0 or the epoch of a call that wrote this slot: no byte of
  /// a token, and nothing a freed allocation left behind, can pass for it.
  GDX_HOST_DEVICE_INLINE uint64_t stampOffset() const { return slotBytes - 8; }
  GDX_HOST_DEVICE_INLINE uint64_t gpuDispMsg(int b, int s, int m) const {
    return kLlCtrlBytes + ((uint64_t(b) * R + s) * T + m) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t gpuCombRow(int b, int t, int k) const {
    return gpuComb + ((uint64_t(b) * T + t) * K + k) * combRowBytes;
  }
  /// A combine row of the GPU window is announced in chunks of kCombChunkBytes: chunk c's stamp is the epoch of the
  /// call that wrote it, released after its bytes by the warp that summed it (the window is zeroed at creation).
  GDX_HOST_DEVICE_INLINE int combChunks() const { return int((combRowBytes + kCombChunkBytes - 1) / kCombChunkBytes); }
  GDX_HOST_DEVICE_INLINE uint64_t gpuCombStamp(int b, int t, int k, int c) const {
    return gpuCombStamps + (((uint64_t(b) * T + t) * K + k) * combChunks() + c) * 8;
  }
  /// Source s's weights of buffer b in the GPU window, [T][K] tagged words ((epoch << 32) | the f32's bits).
  GDX_HOST_DEVICE_INLINE uint64_t gpuWeightsOf(int b, int s) const {
    return gpuWeights + (uint64_t(b) * R + s) * T * K * 8;
  }
  /// Remote slot `slot`'s weights of buffer b in the host mirror, [T][K] floats (they come with a signal).
  GDX_HOST_DEVICE_INLINE uint64_t mirrorWeightsOf(int b, int slot) const {
    return mirrorWeights + (uint64_t(b) * S + slot) * T * K * 4;
  }
  GDX_HOST_DEVICE_INLINE uint64_t weightStageOf(int b) const { return weightStage + uint64_t(b) * T * K * 4; }
  GDX_HOST_DEVICE_INLINE uint64_t mirrorDispMsg(int b, int slot, int m) const {
    return kLlCtrlBytes + ((uint64_t(b) * S + slot) * T + m) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t mirrorCombRow(int b, int t, int k) const {
    return mirrorComb + ((uint64_t(b) * T + t) * K + k) * combRowBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t dispStageRow(int b, int t) const {
    return dispStage + (uint64_t(b) * T + t) * slotBytes;
  }
  GDX_HOST_DEVICE_INLINE uint64_t countStageOf(int b, int d) const {
    return countStage + (uint64_t(b) * kMaxRanks + d) * (L + 1) * 8;
  }
  /// The staged combine row of message m from remote slot `slot` (the row that goes back to that source).
  GDX_HOST_DEVICE_INLINE uint64_t combStageRow(int b, int slot, int m) const {
    return combStage + ((uint64_t(b) * S + slot) * T + m) * combRowBytes;
  }
};
LlLayout llLayout(const LowLatencyConfig& c, int numRanks, int remoteSlots);

/// What the kernels of one rank need: the normal mode's Team (windows, channels, error report, timeout) plus the
/// low-latency state, layout and slots.
struct LlTeam {
  Team t;              // t.state points at ll->common; t.mirror: the host window's device address
  LlState* ll;         // device
  uint32_t* maskHost;  // host-mapped [kMaxRanks]: kMaskedByKernel / kMaskedByUser once masked (maskedRanks())
  /// Each peer's failure word (host-mapped, the Context's: set once its connection broke or it died; null for this
  /// rank): a wait on a dead peer of this host ends as soon as the Context knows, not after GDX_TIMEOUT_MS.
  const uint32_t* peerFailure[kMaxRanks];
  LlLayout lay;
  int8_t mirrorSlot[kMaxRanks];  // remote d: this rank's slot in d's mirror
  int8_t remoteSlot[kMaxRanks];  // remote s: s's slot in this rank's mirror
  uint32_t sentSignal;           // signal ids: sentSignal + sender, freedSignal + receiver, weightsSignal + sender
  uint32_t freedSignal;
  uint32_t weightsSignal;
  int blocks, threads;      // of every kernel (LowLatencyConfig)
  int bothBlocks;           // of a launch doing both phases: blocks, or fewer, so that all of them fit on the GPU
  bool programmaticLaunch;  // LowLatencyConfig::programmaticLaunch
  bool nextKernelEarly;     // LowLatencyConfig::nextKernelEarly
};

/// The messages a dispatch received, kept in its handle for the combine (flattened over the sources in rank order):
/// first[s] the first of source s's (first[R]: how many), and per message its token and, per top-k slot, the row of
/// recvX it filled (-1: none). Combine sums each message's rows into the one row that goes back.
struct LlMessages {
  int32_t* first;  // [kMaxRanks + 1]
  int32_t* token;  // [R * T]
  int32_t* rows;   // [R * T][K]
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
  int32_t* refused;  // the handle's: set by the send phase, 1 when it refused the top-k
  LlMessages msgs;   // the handle's: written by the receive phase
  bool ue8m0;        // LowLatencyDispatchInputs::useUe8m0 (the scales' layout: LowLatencyDispatchOutputs)
};

struct LlCombineArgs {
  const char* x;
  const int64_t* topkIdx;
  const float* topkWeights;
  char* out;
  int numTokens, numTopk;
  const int32_t* refused;  // the dispatch refused this rank's top-k: nothing came back, every sum is zero
  LlMessages msgs;         // what its dispatch received
  int64_t* waitCost;       // LowLatencyCombineInputs::waitRecvCostStats (null: none)
};

/// LlTeam::maskHost values.
constexpr uint32_t kMaskedByKernel = 1;  // a wait timed out, the peer failed, or a put to it was refused
constexpr uint32_t kMaskedByUser = 2;    // LowLatencyBuffer::updateMask

/// The phases of a launch of gdx::ep::ll::dispatch / combine (a bit each): a call without a hook does both in one
/// launch, a call with one launches kLlSend and its hook kLlRecv.
enum LlPhase : int { kLlSend = 1, kLlRecv = 2, kLlBoth = 3 };

}  // namespace gdx::ep::detail
