// What the EP kernels and their host side share: the layout of each rank's buffer window, the per-Buffer state,
// the error report, and the kernels' arguments (the launchers: ep/launchers.hpp).
//
// Every rank's window (GPU memory, IPC-mapped by every peer) is laid out alike:
//   [0, kCtrlBytes)   Ctrl: flags and counts the peers store into
//   [kCtrlBytes, nvlBytes) rows: dispatch rows (x | scales | meta) or combine rows (x | weights), each 16-byte aligned
// and, when some ranks are on other hosts, a second window of host memory holds what goes over the network (Team):
//   [0, nvlBytes)     the receive mirror: Ctrl as above (the fields ranks on other hosts put), then one slot of
//                     slotBytes per source rank: a 16-byte header (dispatch: the row count) and rows
//   [nvlBytes, end)   send staging (rdmaBytes): one area per rank on another host, Ctrl-shaped, then header and rows
//
// The relay. A token crosses the network once per destination *host*: rank s sends it to one rank of each other
// host it is needed on, the relay relayOf[s][h] (the rank of host h with s's local index), in a relay row that names
// its position at every rank of that host; the relay's dispatch kernel forwards it over NVLink into each of those
// ranks' rows, where it lands as if s had stored it (and raises dataDone[s] there). Combine goes back the same way:
// each rank stores the rows of source s into the relay's buffer, the relay sums them per token (f32) and sends one
// row per token back to s, which sums the hosts' rows with those of its own host.
//
// Synchronisation. Every operation (a prepare, a dispatch, a combine) has an epoch e = state.seq + 1, the same on
// every rank because the ranks make the same calls in the same order; its last kernel bumps state.seq. Its first
// kernel starts with a barrier: rank r stores arrive[r] = e into every peer's Ctrl and waits until its own
// arrive[s] >= e for every s. A rank arrives only once its previous operations on the stream ended, so after the
// barrier nobody still reads the rows or counts that the new operation overwrites. Data is pushed (the sender
// stores into the receiver's rows); when all blocks of a sender finished, its last block stores dataDone[sender] = e
// into each receiver's Ctrl with a system-scope release, and the receiver acquires it before reading the rows.
//
// Row stamps. Between ranks of one host a dispatch does not wait for dataDone when the sender stores whole rows
// (sendParts == 1, many tokens): the warp that stored a token's rows fences (system-scope release) and stamps each
// row with e; the receiver's warps copy a row into the outputs as soon as its stamp reads e, interleaved with their
// own sending, so receiving overlaps sending instead of following it. The stamp is read with a relaxed load and the
// row after it with loads that skip L1 (LoadPath in device_common.cuh says why there is no acquire). Rows of a
// sender that split rows across warps (few tokens), and rows that came through a relay, are still read after
// dataDone. The combine does the same when every rank is on this host and every sender stores whole rows: a token is
// summed once the stamps of all its rows read e. Whether a sender stamps follows from the counts matrix and the
// kernel shape, which every rank shares (the Buffer refuses ranks of different Configs). The rows area is shared with
// the combine, whose rows leave arbitrary bytes where a stamp goes: a stamp is rowStamp(e), a tagged value the
// receiver compares for equality, never an order; and a new Buffer zeroes its rows, since its epochs start over
// where an old one's stamps may still be.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gdx/device.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/ep/buffer.hpp"

namespace gdx::ep::detail {

struct Ctrl {
  uint64_t arrive[kMaxRanks];
  uint64_t countsReady[kMaxRanks];
  uint64_t dataDone[kMaxRanks];
  uint32_t status[kMaxRanks];  // a sender's ErrorKind for this epoch (kNone: fine)
  int64_t statusValue[kMaxRanks];
  int32_t counts[kMaxRanks][kMaxRanks];          // counts[s][d]: tokens s sends to d (every sender sends its whole row)
  int32_t expertCounts[kMaxRanks][kMaxExperts];  // [s][j]: tokens s sends to this rank's local expert j
  int32_t tokens[kMaxRanks][2];                  // [s]: s's token count and its handle's relayCap
};
constexpr uint64_t kCtrlBytes = (sizeof(Ctrl) + 4095) / 4096 * 4096;

/// Why an operation failed (Report::kind).
enum ErrorKind : uint32_t {
  kNone = 0,
  kBadExpert = 1,      // value: the expert id, value2: the number of experts
  kRecvCapacity = 2,   // value: rows to receive, value2: the outputs' capacity
  kPeerError = 3,      // peer: the rank that found the error, value: its kind, value2: its value
  kTimeout = 4,        // peer, value: the epoch waited for, value2: the value seen; where: the wait
  kPeerFailed = 5,     // the context's failure word was set while waiting on `peer`
  kBadHandle = 6,      // the handle's routing is not valid (its prepare failed)
  kRelayCapacity = 7,  // peer: the relay, value: the source's tokens, value2: the relay rows its handle holds
  kExpertRows = 8,  // low-latency: value: the expert, value2: the top-k entries naming it; token: one naming it twice
  kBadExpertCount = 9,  // by-rank dispatch: value: packBadCount(expert, its negative count in numTokensPerExpert)
  kUnmaskRefused = 10,  // low-latency: peer: the rank an unmask left masked (a wait had masked it: it missed a call)
};
/// A negative count of numTokensPerExpert and its expert in one int64 (what a rank's status value carries).
GDX_HOST_DEVICE_INLINE int64_t packBadCount(int expert, int32_t count) {
  return int64_t(uint64_t(uint32_t(expert)) << 32 | uint32_t(count));
}

/// Which wait timed out (Report::where). kWaitRow: Report::token is the received row; kWaitReturnedRow (a combine's
/// row sent back to this rank): it is the token.
enum WaitKind : uint32_t { kWaitArrive = 1, kWaitCounts = 2, kWaitData = 3, kWaitRow = 4, kWaitReturnedRow = 5 };

/// The first error of a Buffer, in host-mapped memory (kind written last, with a release).
struct Report {
  uint32_t kind;
  uint32_t where;
  int32_t peer;
  int32_t token;  // the token the error is about, -1: none
  int64_t value;
  int64_t value2;
  uint64_t epoch;
};

/// Device state of a Buffer.
struct State {
  uint64_t seq;                     // epochs finished
  uint32_t opBlocks;                // blocks of the current operation's last kernel that finished
  uint32_t sendBlocks;              // blocks of the current kernel that finished sending
  uint32_t relayBlocks[kMaxRanks];  // blocks that finished relaying source s's rows (the last one resets it)
  uint32_t reportClaim;             // 1 once a kernel wrote the Report (the host clears it with the Report)
};

/// The flags of an operation: which Ctrl field a peer on the direct path stores, and which signal (kSet to the
/// epoch) a peer on another host raises instead.
enum FlagKind : int { kFlagArrive = 0, kFlagCounts = 1, kFlagData = 2 };

/// What the kernels of one rank need to reach the others.
///
/// Ranks on other hosts (remoteMask) are reached through the proxy: whatever this rank would store into such a
/// peer's window (its Ctrl fields, its rows) it stores into its own staging area for that peer instead (stage[r]: a
/// Ctrl-shaped block, then rows from 0), and one thread then puts the area's bytes to where they belong in the
/// peer's window, with the flag as the put's signal (signal id signalBase + kind * kMaxRanks + sender, set to the
/// epoch). A signal is never seen before the data of the channel's earlier puts (gdx/device/channel.hpp), so the peer
/// that sees the flag sees the rows. The staging area is free again at the next operation: its barrier is passed
/// only once every peer received (and so the transport finished reading) what the previous operation sent.
struct Team {
  char* base[kMaxRanks];  // each rank's window as this process addresses it (own one included); null: remote
  int rank;
  int numRanks;
  State* state;
  Report* report;           // host-mapped
  const uint32_t* failure;  // the context's failure word (a Status), host-mapped
  uint64_t timeoutNs;
  uint32_t remoteMask;              // bit r: rank r is on another host (through the proxy)
  uint32_t window;                  // the Buffer's window id (the same on every rank)
  uint32_t stageWindow;             // the staging window's id (host memory, the same on every rank)
  uint32_t signalBase;              // first of the 3 * kMaxRanks signal ids the flags of remote peers use
  char* mirror;                     // the receive mirror (host-mapped), null without remote ranks
  char* stage[kMaxRanks];           // remote r: this rank's staging area for r (host-mapped)
  uint64_t stageOffset[kMaxRanks];  // its offset in the staging window
  const ChannelDeviceHandle* net;   // device array [kMaxRanks]: the proxied channel to each remote rank
  const uint64_t* netSignals;       // this rank's signal array (what remote peers' signals raise)
  // Hosts and relays (see the top of this file). A host's id is its lowest rank.
  int8_t hostOf[kMaxRanks];
  int8_t relayOf[kMaxRanks][kMaxRanks];  // [s][host id]: the rank of that host that relays s's tokens
  uint32_t localMask;                    // ranks on this rank's host, this one included
  uint32_t relayedFrom;                  // remote sources whose tokens this rank relays to its host
  uint32_t relayMask;                    // the relays this rank sends its tokens to (one per other host)
  uint64_t slotBytes;                    // the mirror's slot per source rank
};

/// A handle's device memory, carved from one allocation.
struct HandleView {
  int32_t* sendPos;    // [maxTokens, kMaxRanks]: row of token t among those sent to rank d, -1: not sent there
  int32_t* hostPos;    // [maxTokens, kMaxRanks]: row of token t among those sent to (the relay of) host h, or -1
  int32_t* relayPos;   // [kMaxRanks, relayCap, kMaxRanks]: relay side, [s][i][d]: relay row i of s is at d's pos
  int32_t* matrix;     // [R, R] counts[s][d]
  int32_t* hostCount;  // [kMaxRanks]: tokens sent to host h
  int32_t* relayRows;  // [kMaxRanks]: relay side, relay rows received from s (the dispatch that filled it)
  int32_t* numRecv;    // [1]
  int32_t* valid;      // [1]: 1 when the prepare that filled it succeeded on every rank
  int maxTokens;
  int relayCap;  // relay rows relayPos holds per source (a separate allocation, grown by dispatchPrepare)
};
inline HandleView carveHandle(void* memory, int maxTokens, void* relayMemory, int relayCap) {
  char* p = static_cast<char*>(memory);
  const size_t perToken = size_t(maxTokens) * kMaxRanks * 4;
  HandleView h;
  h.sendPos = reinterpret_cast<int32_t*>(p);
  p += perToken;
  h.hostPos = reinterpret_cast<int32_t*>(p);
  p += perToken;
  h.relayPos = static_cast<int32_t*>(relayMemory);
  h.relayCap = relayMemory ? relayCap : 0;
  h.matrix = reinterpret_cast<int32_t*>(p);
  p += kMaxRanks * kMaxRanks * 4;
  h.hostCount = reinterpret_cast<int32_t*>(p);
  h.relayRows = h.hostCount + kMaxRanks;
  h.numRecv = h.relayRows + kMaxRanks;
  h.valid = h.numRecv + 1;
  h.maxTokens = maxTokens;
  return h;
}
inline size_t handleBytes(int maxTokens) {
  return size_t(maxTokens) * kMaxRanks * 4 * 2 + kMaxRanks * kMaxRanks * 4 + 2 * kMaxRanks * 4 + 16;
}
inline size_t relayBytes(int relayCap) {
  return size_t(relayCap) * kMaxRanks * kMaxRanks * 4;
}
/// hostCounts (host-mapped, written by the prepare): numRecv, the aligned counts per local expert, then every
/// rank's token count.
constexpr int kHostCountsTokens = 1 + kMaxExperts;
constexpr int kHostCountsSize = kHostCountsTokens + kMaxRanks;
/// The header in front of the rows of a mirror slot or a staging area (dispatch: int32 row count).
constexpr uint32_t kSlotHeaderBytes = 16;

/// Bytes of one dispatch row: x, then scales, then meta (int32 src index, int32 local expert ids, f32 weights, and
/// at stampOffset the uint64 epoch of the dispatch that last stored the row whole: see "Row stamps" above).
struct RowLayout {
  uint32_t xBytes, scaleBytes, metaBytes, rowBytes;
  uint32_t scaleOffset, metaOffset, stampOffset;
};
GDX_HOST_DEVICE_INLINE uint32_t align16(uint64_t b) {
  return static_cast<uint32_t>((b + 15) / 16 * 16);
}
inline RowLayout dispatchRow(int hidden, int numTopk, DType dtype) {
  RowLayout r;
  r.xBytes = align16(uint64_t(hidden) * (dtype == DType::kBFloat16 ? 2 : 1));
  r.scaleBytes = dtype == DType::kFloat8E4M3 ? align16(uint64_t(hidden / kFp8ScaleBlock) * 4) : 0;
  const uint32_t stampAt = (4 + 8 * uint32_t(numTopk) + 7) / 8 * 8;  // after the weights, 8-byte aligned
  r.metaBytes = align16(stampAt + 8);
  r.scaleOffset = r.xBytes;
  r.metaOffset = r.xBytes + r.scaleBytes;
  r.stampOffset = r.metaOffset + stampAt;
  r.rowBytes = r.xBytes + r.scaleBytes + r.metaBytes;
  return r;
}
/// Bytes of one relay row: x, scales, then meta: int32 src index, int32 position at each rank [kMaxRanks] (-1: not
/// there), then per top-k slot the int32 rank of its expert (-1: none), the int32 local expert id and the f32 weight.
inline RowLayout relayRow(int hidden, int numTopk, DType dtype) {
  RowLayout r = dispatchRow(hidden, numTopk, dtype);
  r.metaBytes = align16(4 + 4 * uint64_t(kMaxRanks) + 12 * uint64_t(numTopk));
  r.stampOffset = 0;  // relay rows carry no stamp: their receiver waits for the whole put
  r.rowBytes = r.xBytes + r.scaleBytes + r.metaBytes;
  return r;
}
/// What a dispatch row's stamp holds once epoch e stored it (protocol.hpp, "Row stamps").
GDX_HOST_DEVICE_INLINE uint64_t rowStamp(uint64_t e) {
  return e ^ 0xa5c396e1'00000000ull;
}
/// Where a combine row's stamp is: after x BF16 and the f32 weights (protocol.hpp, "Row stamps").
GDX_HOST_DEVICE_INLINE uint32_t combineStampOffset(int hidden, int numTopk) {
  return align16(uint64_t(hidden) * 2) + (uint32_t(numTopk) * 4 + 7) / 8 * 8;
}
/// Bytes of one combine row: x BF16, then the weights, then the stamp.
GDX_HOST_DEVICE_INLINE uint32_t combineRowBytes(int hidden, int numTopk) {
  return align16(uint64_t(combineStampOffset(hidden, numTopk)) + 8);
}

struct PrepareArgs {
  const int64_t* topkIdx;
  // The by-rank form (buffer.hpp, DispatchInputs) when numTokensPerExpert is not null; both null in the top-k form.
  const uint8_t* isTokenInRank;       // [numTokens, numRanks] bool (a nonzero byte: true)
  const int32_t* numTokensPerExpert;  // [numExperts]
  int numTokens, numTopk, numExperts, alignment;
  int relayCap;  // relay rows this rank's handle holds per source; INT32_MAX: the host grows it after the prepare
  HandleView handle;
  int32_t* perExpertOut;  // device, optional
  int32_t* numRecvOut;    // device, optional
  int32_t* hostCounts;    // host-mapped [kHostCountsSize]
};

struct DispatchArgs {
  const char* x;
  const float* xScales;
  const int64_t* topkIdx;
  const float* topkWeights;
  int numTokens, hidden, numTopk, numExperts;
  RowLayout row;
  RowLayout relay;  // rows to and from relays
  HandleView handle;
  DispatchOutputs out;
};

struct CombineArgs {
  const char* x;
  const float* topkWeights;
  const char* bias0;
  const char* bias1;
  char* out;
  float* outWeights;
  int numTokens, hidden, numTopk;
  HandleView handle;
};

struct LayoutArgs {
  const int64_t* topkIdx;
  int numTokens, numTopk, numExperts, numRanks;
  int32_t* perRank;
  int32_t* perExpert;
  bool* inRank;
};

}  // namespace gdx::ep::detail
