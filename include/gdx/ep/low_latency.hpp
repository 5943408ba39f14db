// gdx::ep::LowLatencyBuffer: MoE dispatch and combine for decoding (few tokens per rank, latency is all that counts),
// DeepEP's low-latency mode on gdx's public API. A thin Python layer gives it DeepEP's names: low_latency_dispatch,
// low_latency_combine, get_low_latency_rdma_size_hint, the recv hook.
//
// The kernel itself sends each token once to every rank one of its top-k experts lives on, straight there (no relay),
// with the token's top-k and the row it takes at each of that rank's experts; the receiving kernel copies it into
// each of those rows. A token whose experts share a rank crosses the link once, not once per expert.
//  * same host (direct path): the block stores the message into the rank's IPC-mapped GPU window over NVLink;
//  * other hosts: the block writes the token once into pinned host staging and issues one put per (token, rank)
//    through the device channel to that rank (proxy, RDMA or TCP), into the receiver's receive mirror in pinned
//    host memory, which its kernels read over PCIe. The proxy never issues a CUDA copy (see ep/buffer.hpp for why).
// Combine sends one row per (token, rank) back: the sum of the outputs of that token's experts on the rank, weighted by
// the source's top-k weights (which each source first sends every rank). A dispatch's counts per (local expert, source
// rank), and its number of messages, follow from the top-k alone: on the direct path one block publishes them at the
// start of the send, each word tagged with the call, and every message carries a stamp released after its bytes, so
// the receiving kernel (launched beside the send when there is no hook) copies each message as it lands; to other
// hosts the counts follow the data as a put-with-signal on the same ring (the channel's ordering makes the signal
// imply the rows). Combine announces each 512-byte chunk of a row it returns on the direct path with a stamp released
// after it, so that the receive (beside the send when every rank is on this host) sums each chunk as it lands; to
// other hosts its rows are followed by a signal on the data's ring.
// No host synchronisation anywhere: every call can be captured in a CUDA graph and replayed.
//
//   ep::LowLatencyConfig cfg{/*maxTokensPerRank=*/128, /*hidden=*/7168, /*numExperts=*/288, /*maxTopk=*/8};
//   ep::LowLatencyBuffer buf(ctx, cfg);                       // collective
//   ep::LowLatencyHandle h = buf.newHandle();
//   buf.lowLatencyDispatch(in, out, h, stream);                // out.recvX [L, T*R, H] per local expert
//   ... experts run on out.recvX[j][0 .. recvCount[j]) ...
//   buf.lowLatencyCombine(cin, h, combined, stream);           // weighted sum back into [N, H]
//
// Kernels: one per operation, gdx::ep::ll::dispatch and gdx::ep::ll::combine, with a phase argument (send, receive
// or both), so that a profiler shows one line for each (as DeepEP's). A call without a hook is one launch: each block
// does its share of the sends and then its share of the receive, which waits for the data by stamps and counts (the
// launch takes at most as many blocks as fit on the GPU at once, so that no block waits for one not yet running).
// Send/receive split: pass a LowLatencyHook*; the call then launches only the send phase and the hook
// (hook.run(stream)) launches the same kernel's receive phase later, so no SM waits while the data is in flight. Two
// calls may be in flight (double buffering: consecutive calls use the two buffers in turn); a third before the oldest
// hook ran throws kInvalidArgument, and hooks run in the order of their calls. Ranks make the same calls in the same
// order.
//
// Dead peers: every wait is bounded by GDX_TIMEOUT_MS. A rank whose data does not arrive in time, that the Context
// knows failed (its connection broke: at once, without waiting out the timeout) or that cannot be reached (its put is
// refused) is masked: the call completes on the others, that rank's tokens count as not sent
// (received counts exclude them, their combine contributions are zero), later calls skip it at once, and
// maskedRanks() names it. Bad input the host can see throws before anything is launched; an expert id outside
// [-1, numExperts) is skipped by the kernel and thrown by checkErrors() or by the next call once that call was
// launched (its results are valid and its hook set: the ranks stay in step; not from a call being captured).
//
// A token may name one expert in several top-k slots: every slot is its own (token, expert) pair, so the expert
// receives the token once per slot (the counts include each), and combine weights each slot's row by that slot's
// weight (handle.srcSlot() says which slot a row fills). A rank may send one expert at most maxTokensPerRank rows,
// which only such tokens can exceed: a dispatch whose top-k would is refused whole by its kernel before anything is
// sent (the others receive no rows from that rank, its combine sums nothing), and checkErrors() or the next call
// (once launched, as above) throws kInvalidArgument naming the rank, a token and the expert.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/ep/buffer.hpp"
#include "gdx/window.hpp"

namespace gdx::ep {

/// Shapes fixed at creation (the same on every rank). T = maxTokensPerRank, L = numExperts / ranks.
struct LowLatencyConfig {
  int maxTokensPerRank = 128;  ///< T: most tokens one rank dispatches per call (<= 4096)
  int hidden = 7168;           ///< H: a multiple of 128
  int numExperts = 288;        ///< E: a multiple of the ranks, <= kMaxExperts
  int maxTopk = 8;             ///< most top-k entries per token (<= kMaxTopk)
  /// Blocks of every kernel. No block waits for another of its kernel, so more blocks than SMs are safe; on 2 x H200 at
  /// T = 128, 128 blocks took dispatch / combine from 49 / 54 us (32 blocks) to 35 / 43 us.
  int numSms = 128;
  int numThreads = 512;  ///< threads per block (a multiple of 32 in [64, 1024])
  /// Launch each kernel with programmatic stream serialization: it may be launched before the kernel ahead of it in
  /// the stream has ended, and waits for that kernel's end (griddepcontrol.wait) before it reads anything. The kernel
  /// ahead may be any kernel. A kernel of the caller's launched after one of these with programmatic serialization
  /// must itself wait (cudaGridDependencySynchronize) before reading recvX or the combined output; a plainly launched
  /// one needs nothing. Used only where the kernels were compiled for sm_90 or later (which have the wait); false:
  /// plain launches.
  bool programmaticLaunch = true;
  /// With programmaticLaunch, when each kernel lets the next one of the stream start. false: at its end, so a
  /// profiler's time for each kernel is that kernel's own (DeepEP's bench_kineto reads those). true: at its start, so
  /// the next kernel's blocks are already resident and waiting when this one ends, which hides its launch when the
  /// host is ahead, but a profiler then counts that wait (most of this kernel) in the next kernel's time.
  bool nextKernelEarly = false;
};

/// Memory a LowLatencyBuffer takes (DeepEP's get_low_latency_rdma_size_hint): GPU bytes (the window the same-host
/// ranks store into), pinned host bytes (the receive mirror and staging for ranks on other hosts; 0 without them).
struct LowLatencyBytes {
  size_t gpu = 0;
  size_t host = 0;
};
LowLatencyBytes lowLatencyBytesHint(const LowLatencyConfig& config, int numRanks, int numRemoteRanks);

/// What lowLatencyDispatch sends. x: BF16 [numTokens, hidden]; topkIdx int64 [numTokens, numTopk] (-1: none).
struct LowLatencyDispatchInputs {
  const void* x = nullptr;
  const int64_t* topkIdx = nullptr;
  int numTokens = 0;
  int numTopk = 0;
  bool useFp8 = true;       ///< FP8 e4m3 with an f32 scale per 128 elements; false: BF16 as given
  bool roundScale = false;  ///< FP8: scales rounded up to powers of two
  /// FP8 with roundScale: the scales are written as UE8M0 (each power-of-two scale's 8-bit exponent, the f32's bits 23
  /// to 30), four to an int32 (LowLatencyDispatchOutputs::recvXScales). DeepEP's use_ue8m0.
  bool useUe8m0 = false;
};

/// Where lowLatencyDispatch writes. Rows of local expert j: [0, recvCount[j]), grouped by source rank in rank order
/// (handle.layoutRange says where each source's rows are); rows past the count are not written.
struct LowLatencyDispatchOutputs {
  void* recvX = nullptr;  ///< [L, T * R, H]: FP8 e4m3 bytes or BF16
  /// FP8 scales, column-major per local expert as DeepEP's packed_recv_x_scales (rows = T * R, row r of expert e):
  ///  * f32 (useUe8m0 false): memory [L, H / 128, rows]; the scale of block k at ((e * (H / 128) + k) * rows + r) * 4;
  ///  * UE8M0: memory [L, G, rows] int32, G = ceil(H / 512); block 4g + j's exponent byte at byte
  ///    ((e * G + g) * rows + r) * 4 + j (the bytes of a last partial group are not written).
  /// DeepEP hands either out as the transposed view [L, rows, H / 128] (resp. [L, rows, G]).
  void* recvXScales = nullptr;
  int32_t* recvCount = nullptr;  ///< [L]
  /// Optional int32 [L]: each dispatch adds the rows local expert j received (DeepEP's
  /// cumulative_local_expert_recv_stats); the rows of masked ranks are not counted.
  int32_t* cumulativeRecvStats = nullptr;
  /// Optional int64 [R]: each dispatch adds, per source rank, the clock64() cycles its receive spent waiting for that
  /// rank's counts, summed over the grid's blocks (every block waits for every source's counts; DeepEP sums over the
  /// local experts' waiters). Diagnostic: a rank that arrives late shows up large. Nothing is added for a masked rank.
  int64_t* waitRecvCostStats = nullptr;
};

/// Combine: x BF16 [L, T * R, H], the experts' outputs in the rows dispatch wrote; topkIdx / topkWeights of the
/// tokens this rank dispatched ([numTokens, numTopk], the same top-k as the dispatch).
struct LowLatencyCombineInputs {
  const void* x = nullptr;
  const int64_t* topkIdx = nullptr;
  const float* topkWeights = nullptr;
  /// Optional int64 [R]: each combine adds, per rank, the clock64() cycles its receive spent waiting for the rows that
  /// rank sends back (summed over the warps that waited, and for a rank on another host over the blocks waiting for
  /// its signal; DeepEP's combine_wait_recv_cost_stats). Nothing is added for a masked rank or one no token went to.
  int64_t* waitRecvCostStats = nullptr;
};

class LowLatencyBuffer;
namespace detail {
/// For tests: the epoch of the buffer's first call is `epoch` + 1 instead of 1, so that a test can cross 2^32 calls
/// (the tagged words' wrap). Every rank sets the same before any call, then a barrier; ranks of one host only.
void startEpochsAt(LowLatencyBuffer& buffer, uint64_t epoch);
}  // namespace detail

/// The routing a dispatch received (DeepEP's handle): device memory made once by newHandle (outside any capture),
/// filled by each dispatch's receive half.
class LowLatencyHandle {
 public:
  LowLatencyHandle() = default;
  /// [L, T * R] int32: the source token of each received row.
  const int32_t* srcInfo() const { return srcInfo_; }
  /// [L, T * R] int32: the top-k slot at its source that each received row fills (a token naming the expert in two
  /// slots arrives as two rows, one per slot; combine weights each by its slot's weight).
  const int32_t* srcSlot() const { return srcSlot_; }
  /// [L, R] int64: (first row << 32) | rows, per local expert and source rank.
  const int64_t* layoutRange() const { return layoutRange_; }
  /// Tokens and top-k of the dispatch that filled it (-1 before).
  int numTokens() const { return numTokens_; }
  int numTopk() const { return numTopk_; }

 private:
  friend class LowLatencyBuffer;
  std::shared_ptr<void> memory_;
  const LowLatencyBuffer* owner_ = nullptr;
  int32_t* srcInfo_ = nullptr;
  int32_t* srcSlot_ = nullptr;
  int64_t* layoutRange_ = nullptr;
  int32_t* refused_ = nullptr;   // [1]: 1 when the dispatch's kernel refused its top-k (nothing sent, nothing to sum)
  int32_t* msgFirst_ = nullptr;  // the messages the dispatch received, for the combine (ep/low_latency_protocol.hpp)
  int32_t* msgToken_ = nullptr;
  int32_t* msgRows_ = nullptr;
  int numTokens_ = -1;
  int numTopk_ = -1;
  // The receive half of its dispatch was launched; shared by copies of the handle and by the pending hook, which
  // sets it (the hook may run after this handle was copied or destroyed).
  std::shared_ptr<bool> received_;
};

/// The receive half of a call made with a hook: run(stream) launches it (once, in the order of the calls).
class LowLatencyHook {
 public:
  LowLatencyHook() = default;
  bool pending() const { return owner_ != nullptr; }
  void run(cudaStream_t stream);

 private:
  friend class LowLatencyBuffer;
  LowLatencyBuffer* owner_ = nullptr;
  uint64_t call_ = 0;  // which call's receive half
  std::shared_ptr<void> args_;
};

class LowLatencyBuffer {
 public:
  /// Collective over every rank of `context`. With ranks on other hosts it uses the 2 x kMaxRanks signal ids just
  /// below those of ep::Buffer (the top of GDX_NUM_SIGNALS): leave them to it.
  LowLatencyBuffer(Context& context, const LowLatencyConfig& config);
  ~LowLatencyBuffer();
  LowLatencyBuffer(const LowLatencyBuffer&) = delete;
  LowLatencyBuffer& operator=(const LowLatencyBuffer&) = delete;

  int rank() const { return rank_; }
  int numRanks() const { return numRanks_; }
  int numLocalExperts() const { return config_.numExperts / numRanks_; }
  const LowLatencyConfig& config() const { return config_; }

  LowLatencyHandle newHandle() const;

  /// Sends every (token, expert) pair of `in` to the expert's rank and (without a hook) receives into `out`.
  void lowLatencyDispatch(const LowLatencyDispatchInputs& in, const LowLatencyDispatchOutputs& out,
                          LowLatencyHandle& handle, cudaStream_t stream, LowLatencyHook* hook = nullptr);
  /// Sends every row of `handle`'s dispatch back to its source token, which sums them weighted by topkWeights into
  /// `combined` (BF16 [numTokens, hidden], caller-given). Without a hook the sum is done before it returns (on the
  /// stream); with one, by the hook.
  void lowLatencyCombine(const LowLatencyCombineInputs& in, const LowLatencyHandle& handle, void* combined,
                         cudaStream_t stream, LowLatencyHook* hook = nullptr);

  /// Ranks masked so far (dead, unreachable, or by updateMask), read from host-mapped memory: no synchronisation.
  std::vector<int> maskedRanks() const;

  /// Shrink mode (DeepEP's low_latency_update_mask_buffer / _query_mask_buffer / _clean_mask_buffer): each is a small
  /// kernel ordered on `stream` with the calls, and can be captured in a CUDA graph. What a rank's mask means is this
  /// rank's view only; every rank masks on its own (as in DeepEP), by updateMask or by a wait that timed out.
  ///
  /// updateMask(r, true): the calls that follow treat rank r as dead: nothing is sent to it or waited for, its tokens
  /// count as not sent (received counts exclude them, its combine contributions are zero), maskedRanks() names it. r
  /// must not be this rank.
  /// updateMask(r, false), and cleanMask() for every masked rank: unmasks, which is safe only while rank r and this
  /// rank are still at the same call: every call carries its epoch (the count of calls the buffer made), and a rank
  /// that missed a call (it was masked meanwhile) would take another call's messages, stamps and "freed" words for its
  /// own. So a rank comes back only if it was masked by updateMask and this buffer launched no call since; a rank
  /// masked by a wait (dead, timed out, unreachable) or by updateMask before a call never comes back (make a new
  /// buffer on every rank instead). These throw kInvalidArgument on the host, before anything is launched, when the
  /// host already knows; a rank that a call still in flight masks by a timeout before the unmask kernel runs stays
  /// masked, and checkErrors() or the next call throws (kUnmaskRefused). Unmasking a rank that is not masked does
  /// nothing.
  void updateMask(int rank, bool masked, cudaStream_t stream);
  /// Writes int32 [numRanks] to device memory `out` (1: masked, 0: not), ordered on `stream` after the calls before.
  void queryMask(int32_t* out, cudaStream_t stream) const;
  void cleanMask(cudaStream_t stream);
  /// Throws the first error a kernel recorded (an expert id out of range, a refused top-k), naming rank and values;
  /// no sync.
  void checkErrors() const;
  /// This rank's GPU window (DeepEP's RDMA buffer, get_local_buffer_tensor): device memory the kernels own between
  /// calls.
  void* localMemory() const;
  size_t localBytes() const;

 private:
  friend class LowLatencyHook;
  friend void detail::startEpochsAt(LowLatencyBuffer& buffer, uint64_t epoch);
  struct Impl;
  /// Checks a call may start; true when an earlier call left an error for it to throw (raiseAfterLaunch).
  bool beginCall(LowLatencyHook* hook, const char* op);
  void raiseAfterLaunch(bool earlier, cudaStream_t stream) const;
  void requireContext(const char* op) const;
  void requireUnmaskable(int rank, const char* op) const;
  void runHook(LowLatencyHook& hook, cudaStream_t stream);

  // The Context's link, not a reference: a call after the Context is gone throws kShutdown instead of launching
  // kernels that read its freed rings and failure words, and the destructor then skips the teardown barrier.
  ContextRef context_;
  LowLatencyConfig config_;
  int rank_ = 0;
  int numRanks_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::ep
