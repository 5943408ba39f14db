// gdx::ep::Buffer: MoE expert-parallel dispatch and combine, normal (high-throughput) mode, on gdx's public API.
// Raw device pointers and a cudaStream_t, no framework: a thin Python layer gives it DeepEP's `Buffer` names
// (get_dispatch_layout, dispatch, combine) and tensor shapes. Every rank of the job holds one Buffer, created
// collectively from its Context; its GPU memory is registered as a window once, and kernels store tokens straight
// into the peers' IPC-mapped copies of it (the direct path, NVLink) with 16-byte vector stores, no proxy. Ranks on
// other hosts are reached through the proxy: the kernels store their rows for such a rank into a staging area in
// pinned host memory, one put-with-signal per remote rank and operation carries them (RDMA or TCP) into the
// receiver's mirror of its window, also in host memory: no CUDA copy is ever issued by the proxy, so it cannot wait
// behind the application's queued kernels. A token crosses the network once per destination host, as DeepEP's
// internode mode: it goes to the relay there (the rank with the sender's local index), whose dispatch kernel forwards
// it over NVLink to each rank of that host that needs it; combine sums a token's rows per host at the relay and sends
// one row back.
//
// One call sequence per step, the same on every rank and on one stream per rank (each call's kernels start with a
// barrier among the ranks, which is what lets a rank reuse its buffer):
//
//   ep::Buffer buf(ctx, /*nvlBytes=*/1 << 30);
//   ep::DispatchHandle h = buf.newHandle(maxTokens);
//   buf.getDispatchLayout(topkIdx, n, k, numExperts, perRank, perExpert, inRank, stream);  // optional, as DeepEP
//   ep::DispatchCounts c = buf.dispatchPrepare(in, h, /*expertAlignment=*/1, stream);    // host sync: counts
//   ... allocate outputs of c.numRecvTokens rows ...
//   buf.dispatch(in, h, out, stream);          // the cached form is this call alone, with an earlier handle
//   ... experts run on out.recvX ...
//   buf.combine(cin, h, cout, stream);         // rows back to their source token, summed
//
// or, without any host synchronisation (CUDA-graph capturable), `dispatchWorst(in, h, out, numWorstTokens, ...)`
// with outputs of numWorstTokens rows; the received count is then only on the device (out.numRecvTokens).
//
// Without top-k, as DeepEP's dispatch without topk_idx: DispatchInputs::isTokenInRank (which ranks each token goes
// to) and numTokensPerExpert (the counts each expert's rank reports; both from getDispatchLayout) replace topkIdx,
// with numTopk 0; rows, order, counts matrix, cached form and combine are those of the top-k form with that routing.
//
// A token whose top-k names one expert in several slots is still sent once to that expert's rank: recvTopkIdx and
// recvTopkWeights list the expert in each such slot with that slot's weight, and the per-expert counts count each
// slot (as DeepEP's num_tokens_per_expert); combine adds the one row that rank returns for the token (weighting the
// slots' outputs into it is the caller's, before combine).
//
// Errors, never hangs: arguments the host can check (expert count not a multiple of the ranks, hidden size, dtype,
// top-k or its absence, more tokens than the buffer holds) throw gdx::Error(kInvalidArgument) before anything is
// launched. An expert id >= E or < -1 in a dispatch's top-k, or a negative count in a by-rank dispatch's
// numTokensPerExpert, is exchanged among the ranks before any token is sent, so every rank skips the data phase alike
// and dispatchPrepare throws it on every rank. What a kernel finds on one rank alone (getDispatchLayout's bad ids,
// more received rows than a worst-form dispatch's outputs hold) is kept in host-mapped memory and thrown by
// checkErrors() or by the next call once that call was launched, so that this rank still makes the collective calls
// the others make and wait for. Every wait inside the kernels is bounded by GDX_TIMEOUT_MS and ends on a peer's
// failure; the error names the rank, the peer, the wait and the values seen. After a timeout the Buffer is unusable
// (every later call throws).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/window.hpp"

namespace gdx::ep {

/// Most ranks one Buffer spans (peers reached on the direct path), most experts, most top-k entries per token.
constexpr int kMaxRanks = 8;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 16;
/// FP8 scales: one f32 per this many elements of a row.
constexpr int kFp8ScaleBlock = 128;

enum class DType : int { kBFloat16 = 0, kFloat8E4M3 = 1 };

/// Kernel shape. The defaults keep every kernel at <= 24 SMs (one block per SM).
struct Config {
  int numSms = 24;       ///< blocks of the dispatch and combine kernels
  int numThreads = 768;  ///< threads per block (a multiple of 32, <= 1024)
  /// Defaults for a Buffer over `numRanks` GPUs (2, 4, 8): more ranks spread the same bytes over more links.
  static Config forRanks(int numRanks);
};

/// What dispatch sends. x: [numTokens, hidden] BF16, or FP8 e4m3 bytes with xScales f32 [numTokens, hidden / 128].
///
/// The routing comes in one of two forms (every rank of a call uses the same one):
/// - top-k: topkIdx int64 [numTokens, numTopk] (-1: no expert), topkWeights f32 [numTokens, numTopk] (optional);
///   numTopk in [1, kMaxTopk]. The tokens go to the ranks of their experts, the per-expert counts are counted from
///   topkIdx; isTokenInRank and numTokensPerExpert are ignored. A rank with no tokens may leave topkIdx null.
/// - by rank (DeepEP's dispatch without top-k): topkIdx and topkWeights null, numTopk 0; isTokenInRank bool
///   [numTokens, numRanks] says which ranks each token goes to (may be null only with no tokens) and
///   numTokensPerExpert int32 [numExperts] (required; get_dispatch_layout's) is what this rank reports to each
///   expert's rank, which sums them over the sources into its numRecvTokensPerExpert. Nothing else differs: the same
///   rows in the same order, counts matrix, cached form and combine (no top-k outputs are written). A negative count
///   is bad input, refused on every rank alike as a bad expert id is.
/// The cached form takes its routing from the handle: it may leave all four null (then the received top-k outputs
/// are not written).
struct DispatchInputs {
  const void* x = nullptr;
  const float* xScales = nullptr;
  const int64_t* topkIdx = nullptr;
  const float* topkWeights = nullptr;
  int numTokens = 0;
  int hidden = 0;
  int numTopk = 0;
  int numExperts = 0;
  DType dtype = DType::kBFloat16;
  const bool* isTokenInRank = nullptr;          ///< [numTokens, numRanks]: the by-rank form's routing
  const int32_t* numTokensPerExpert = nullptr;  ///< [numExperts]: the by-rank form's per-expert counts
};

/// Where dispatch writes; rows in source-rank order, each source's rows in its token order (as DeepEP). Pointers
/// other than recvX may be null (not written). `capacity`: rows the outputs hold (numRecvTokens from
/// dispatchPrepare, or numWorstTokens).
struct DispatchOutputs {
  void* recvX = nullptr;                      ///< [capacity, hidden] BF16 or FP8 bytes
  float* recvXScales = nullptr;               ///< [capacity, hidden / 128] (FP8)
  int64_t* recvTopkIdx = nullptr;             ///< [capacity, numTopk]: local expert id, -1 where not local
  float* recvTopkWeights = nullptr;           ///< [capacity, numTopk]: 0 where the expert is not local
  int32_t* recvSrcIdx = nullptr;              ///< [capacity]: the row's token index on its source rank
  int32_t* numRecvTokensPerExpert = nullptr;  ///< [numExperts / ranks], aligned (prepare / worst forms)
  int32_t* numRecvTokens = nullptr;           ///< [1] rows received (worst form; optional)
  int capacity = 0;
};

/// What dispatchPrepare returns (host side, DeepEP's num_recv_tokens_per_expert_list).
struct DispatchCounts {
  int numRecvTokens = 0;
  std::vector<int> numRecvTokensPerExpert;  ///< per local expert, rounded up to the expert alignment
};

/// Combine: x BF16 [numRecvTokens, hidden] in the received order; topkWeights f32 [numRecvTokens, numTopk]
/// (optional, summed back per token like DeepEP's combined weights); bias0 / bias1 BF16 [numTokens, hidden]
/// (optional, added to the sum).
struct CombineInputs {
  const void* x = nullptr;
  const float* topkWeights = nullptr;
  const void* bias0 = nullptr;
  const void* bias1 = nullptr;
};
struct CombineOutputs {
  void* combinedX = nullptr;             ///< [numTokens, hidden] BF16
  float* combinedTopkWeights = nullptr;  ///< [numTokens, numTopk] (when CombineInputs::topkWeights is given)
};

class Buffer;
namespace detail {
struct HandleView;
}

/// The routing of one dispatch (which token went to which rank at which row, the counts matrix): filled by
/// dispatchPrepare / dispatchWorst, reused by the cached dispatch and by combine. Device memory, sized for up to
/// maxTokens tokens; made by Buffer::newHandle (outside any graph capture).
class DispatchHandle {
 public:
  DispatchHandle() = default;
  int maxTokens() const { return maxTokens_; }
  /// Tokens of the dispatch that filled it, hidden size and top-k; -1 until filled.
  int numTokens() const { return numTokens_; }
  int hidden() const { return hidden_; }
  int numTopk() const { return numTopk_; }
  /// Rows received: known on the host after dispatchPrepare, -1 after dispatchWorst (device only).
  int numRecvTokens() const { return numRecvTokens_; }

 private:
  friend class Buffer;
  std::shared_ptr<void> memory_;       // device: routing, counts (ep/protocol.hpp, HandleView)
  std::shared_ptr<void> relayMemory_;  // device: where the rows this rank relays go (ranks on other hosts only)
  const Buffer* owner_ = nullptr;
  int maxTokens_ = 0;
  int relayCap_ = 0;
  int numTokens_ = -1;
  int hidden_ = -1;
  int numTopk_ = -1;
  int numRecvTokens_ = -1;
};

class Buffer {
 public:
  /// Collective over every rank of `context` (one GPU may serve several ranks). `nvlBytes`: GPU memory each rank
  /// lends its peers' stores (the rows it receives, from every rank). `rdmaBytes`: staging for the ranks on other
  /// hosts (those not reached on the direct path), in pinned host memory together with a host copy of the nvlBytes
  /// layout that those ranks store into: 36 KiB of counts for each remote rank, the rest split evenly among the ones
  /// rows go to (this rank's relay on each other host, and the ranks of other hosts it relays for: one of each per
  /// other host with equal GPUs per host); 0 when every rank is on the direct path. Both, and `config`, must be the
  /// same on every rank (a mismatch is refused here). With ranks on other hosts the Buffer uses the top 3 x kMaxRanks
  /// signal ids of the Context (GDX_NUM_SIGNALS) for its flags: leave them to it.
  Buffer(Context& context, size_t nvlBytes, size_t rdmaBytes = 0, const Config& config = Config());
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int rank() const { return rank_; }
  int numRanks() const { return numRanks_; }
  const Config& config() const { return config_; }
  /// Most tokens one rank may dispatch with these shapes (every rank sending all of them to one rank still fits).
  int maxTokensPerRank(int hidden, int numTopk, DType dtype) const;

  DispatchHandle newHandle(int maxTokens) const;

  /// DeepEP's get_dispatch_layout: tokens per rank [R], tokens per expert [E], is_token_in_rank [N, R] (bool), on
  /// `stream`. An expert id out of range is recorded (thrown by checkErrors() or, once launched, by the next call).
  void getDispatchLayout(const int64_t* topkIdx, int numTokens, int numTopk, int numExperts, int32_t* numTokensPerRank,
                         int32_t* numTokensPerExpert, bool* isTokenInRank, cudaStream_t stream);
  /// Computes the routing of `in` (from its top-k, or by rank from isTokenInRank: DispatchInputs) into `handle` and
  /// exchanges the counts; waits for them on the host and returns them. Throws for bad input on any rank (naming the
  /// rank and the value), before any token is sent.
  DispatchCounts dispatchPrepare(const DispatchInputs& in, DispatchHandle& handle, int expertAlignment,
                                 cudaStream_t stream, int32_t* numRecvTokensPerExpert = nullptr);
  /// Sends the tokens along `handle`'s routing (of a dispatchPrepare on the same token count, or any earlier
  /// dispatch: the cached form) into `out`. No host synchronisation.
  void dispatch(const DispatchInputs& in, const DispatchHandle& handle, const DispatchOutputs& out,
                cudaStream_t stream);
  /// dispatchPrepare and dispatch without the host synchronisation: outputs hold `numWorstTokens` rows, the
  /// received count and per-expert counts are written to out.numRecvTokens / out.numRecvTokensPerExpert. With ranks
  /// on other hosts, `handle` must have been made for at least as many tokens as any rank dispatches (a relay keeps
  /// per-row routing for the tokens it forwards; dispatchPrepare grows it on the host instead): otherwise every rank
  /// fails the call alike, naming the relay and the numbers.
  void dispatchWorst(const DispatchInputs& in, DispatchHandle& handle, const DispatchOutputs& out, int numWorstTokens,
                     int expertAlignment, cudaStream_t stream);
  /// Sends every received row back to its source token, where they are summed (+ bias); uses `handle`'s routing.
  void combine(const CombineInputs& in, const DispatchHandle& handle, const CombineOutputs& out, cudaStream_t stream);

  /// `handle`'s counts matrix in device memory, int32 [R, R] row-major: at [s * R + d] the tokens rank s sent to rank d
  /// in the dispatch that filled the handle (written on that call's stream). DeepEP's rank_prefix_matrix is its prefix
  /// sum over s. Throws for a handle this Buffer did not make or that no dispatch filled.
  const int32_t* countsMatrix(const DispatchHandle& handle) const;

  /// Throws the first error a kernel of this Buffer recorded (gdx::Error naming rank, peer, value); no sync.
  void checkErrors() const;

  /// This rank's NVLink buffer (the nvlBytes its peers store into; DeepEP's get_local_buffer_tensor): device memory
  /// whose bytes the kernels own between calls.
  void* localMemory() const;
  size_t localBytes() const { return nvlBytes_; }

 private:
  struct Impl;
  void checkDispatchInputs(const DispatchInputs& in, const DispatchHandle& handle, const char* op) const;
  void checkDispatchOutputs(const DispatchInputs& in, const DispatchOutputs& out) const;
  void launchDispatchKernel(const DispatchInputs& in, const DispatchHandle& handle, const DispatchOutputs& out,
                            cudaStream_t stream);
  void launchPrepare(const DispatchInputs& in, DispatchHandle& handle, int expertAlignment, int32_t* perExpert,
                     int32_t* numRecv, bool growOnHost, cudaStream_t stream);
  void growRelay(DispatchHandle& handle, int rows) const;
  detail::HandleView viewOf(const DispatchHandle& handle) const;
  void assignHostsAndRelays(const std::vector<uint32_t>& remoteMasks);
  void connectRemote(Context& context, size_t rdmaBytes);

  // The Context's link, not a reference: a Buffer used after its Context is gone throws kShutdown (checked before
  // every launch) and its destruction skips the teardown barrier.
  ContextRef context_;
  Config config_;
  int rank_ = 0;
  int numRanks_ = 1;
  size_t nvlBytes_ = 0;
  size_t stageBytes_ = 0;  // per rank on another host that rows go to (relayMask | relayedFrom)
  int numRemote_ = 0;      // ranks on other hosts
  // Rows per token of a rank that one buffer may have to hold: numRanks_ for a dispatch; for a combine at a relay,
  // its host's size times (1 + the sources it relays for), which exceeds numRanks_ when hosts differ in size.
  int rowsPerToken_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gdx::ep
