// gdx::ep::LowLatencyBuffer, host side: the windows, the checks made before anything is launched, the launches and
// their hooks (double buffering), the masked ranks and the errors the kernels report.
#include "gdx/ep/low_latency.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/cuda_check.hpp"
#include "base/log.hpp"
#include "ep/launchers.hpp"
#include "ep/low_latency_protocol.hpp"
#include "ep/network_path.hpp"
#include "ep/report.hpp"
#include "ep/teardown.hpp"
#include "gdx/context.hpp"
#include "gdx/device/channel.hpp"
#include "gdx/device/impl/atomic.hpp"

namespace gdx::ep {

using namespace detail;

namespace {

[[noreturn]] void invalid(int rank, const std::string& what) {
  throwInvalid({BufferMode::kLowLatency, rank}, what);
}

// The larger message, then the stamp's 16 bytes (LlLayout::stampOffset), which no message's bytes reach.
uint64_t slotBytesOf(const LowLatencyConfig& c) {
  return std::max(llMessage(c.hidden, c.maxTopk, false).bytes, llMessage(c.hidden, c.maxTopk, true).bytes) + 16;
}

// Signal ids: the 3 x kMaxRanks at the top belong to ep::Buffer, these 3 x kMaxRanks just below.
constexpr uint32_t kLlSignals = 3 * kMaxRanks;
constexpr uint32_t kBufferSignals = 3 * kMaxRanks;

}  // namespace

namespace detail {
LlLayout llLayout(const LowLatencyConfig& c, int numRanks, int remoteSlots) {
  LlLayout y{};
  y.L = c.numExperts / numRanks;
  y.T = c.maxTokensPerRank;
  y.H = c.hidden;
  y.K = c.maxTopk;
  y.E = c.numExperts;
  y.R = numRanks;
  y.S = remoteSlots;
  y.slotBytes = slotBytesOf(c);
  y.combRowBytes = uint64_t(c.hidden) * 2;
  const uint64_t combBytes = 2 * uint64_t(y.T) * y.K * y.combRowBytes;
  const uint64_t weightBytes = uint64_t(y.T) * y.K * 4;        // one source's weights of one buffer, f32 (host window)
  const uint64_t taggedWeightBytes = uint64_t(y.T) * y.K * 8;  // the same as tagged words (GPU window)
  y.gpuComb = kLlCtrlBytes + 2 * uint64_t(y.R) * y.T * y.slotBytes;
  y.gpuWeights = y.gpuComb + combBytes;
  y.gpuCombStamps = y.gpuWeights + 2 * uint64_t(y.R) * taggedWeightBytes;
  y.gpuBytes = y.gpuCombStamps + 2 * uint64_t(y.T) * y.K * y.combChunks() * 8;
  if (remoteSlots == 0) return y;
  y.mirrorComb = kLlCtrlBytes + 2 * uint64_t(y.S) * y.T * y.slotBytes;
  y.mirrorWeights = y.mirrorComb + combBytes;
  y.dispStage = (y.mirrorWeights + 2 * uint64_t(y.S) * weightBytes + 15) / 16 * 16;  // messages 16-byte aligned
  y.countStage = y.dispStage + 2 * uint64_t(y.T) * y.slotBytes;
  y.combStage = y.countStage + 2 * uint64_t(kMaxRanks) * (y.L + 1) * 8;
  y.weightStage = y.combStage + 2 * uint64_t(y.S) * y.T * y.combRowBytes;
  y.hostBytes = y.weightStage + 2 * weightBytes;
  return y;
}
}  // namespace detail

LowLatencyBytes lowLatencyBytesHint(const LowLatencyConfig& config, int numRanks, int numRemoteRanks) {
  const LlLayout y = llLayout(config, numRanks, numRemoteRanks);
  return LowLatencyBytes{y.gpuBytes, y.hostBytes};
}

struct LowLatencyBuffer::Impl {
  Window window;
  void* memory = nullptr;  // GPU window
  LlState* state = nullptr;
  HostReport report;
  uint32_t* maskHost = nullptr;
  HostWindowMemory network;  // pinned: receive mirror and staging
  ChannelDeviceHandle* net = nullptr;
  LlTeam team{};
  uint64_t calls = 0;     // sends launched
  uint64_t received = 0;  // receive halves launched (hooks run in call order)
  // [r]: `calls` when updateMask masked rank r (it may come back only before the next call), -1: not masked by it.
  int64_t userMaskedAt[kMaxRanks];

  ~Impl() {
    window = Window();
    network.window = Window();
    if (memory) cudaFree(memory);
    if (state) cudaFree(state);
    if (maskHost) cudaFreeHost(maskHost);
    if (network.host) cudaFreeHost(network.host);
    if (net) cudaFree(net);
  }
};

// A receive half waiting for its hook: which kernel, with what.
struct HookArgs {
  bool dispatch;
  LlDispatchArgs d;
  LlCombineArgs c;
  // Dispatch: the handle's memory the receive writes into, kept until the hook ran, and its received flag.
  std::shared_ptr<void> memory;
  std::shared_ptr<bool> received;
};

LowLatencyBuffer::LowLatencyBuffer(Context& context, const LowLatencyConfig& config)
    : context_(context.ref()),
      config_(config),
      rank_(context.rank()),
      numRanks_(context.worldSize()),
      impl_(std::make_unique<Impl>()) {
  const LowLatencyConfig& c = config;
  if (!context.gpu().present()) invalid(rank_, "needs a GPU");
  if (numRanks_ > kMaxRanks) invalid(rank_, std::to_string(numRanks_) + " ranks, at most " + std::to_string(kMaxRanks));
  if (c.maxTokensPerRank < 1 || c.maxTokensPerRank > 4096)
    invalid(rank_, "maxTokensPerRank " + std::to_string(c.maxTokensPerRank) + " outside [1, 4096]");
  if (c.hidden <= 0 || c.hidden % kFp8ScaleBlock != 0 || c.hidden > 65536)
    invalid(rank_, "hidden size " + std::to_string(c.hidden) + " not supported (a multiple of 128, <= 65536)");
  if (c.numExperts <= 0 || c.numExperts > kMaxExperts || c.numExperts % numRanks_ != 0)
    invalid(rank_, std::to_string(c.numExperts) + " experts, not a positive multiple of the " +
                       std::to_string(numRanks_) + " ranks (at most " + std::to_string(kMaxExperts) + ")");
  if (c.maxTopk < 1 || c.maxTopk > kMaxTopk)
    invalid(rank_, "maxTopk " + std::to_string(c.maxTopk) + " outside [1, " + std::to_string(kMaxTopk) + "]");
  if (c.numSms < 1 || c.numThreads < 64 || c.numThreads > 1024 || c.numThreads % 32 != 0)
    invalid(rank_, "config: numSms " + std::to_string(c.numSms) + ", numThreads " + std::to_string(c.numThreads) +
                       " (numThreads: a multiple of 32 in [64, 1024])");
  Impl& m = *impl_;
  LlTeam& lt = m.team;
  GDX_CUDA_CHECK(cudaSetDevice(context.gpu().device));
  // Who is on the direct path: every rank's view, so that a sender knows its slot in each receiver's mirror.
  uint32_t remoteMask = 0;
  for (int p = 0; p < numRanks_; ++p)
    if (p != rank_ && !context.isDirect(p)) remoteMask |= 1u << p;
  CollectiveTag tag;
  tag.kind = "ep::LowLatencyBuffer: shapes and reach";
  tag.size = uint64_t(c.maxTokensPerRank) << 40 ^ uint64_t(c.hidden) << 20 ^ uint64_t(c.numExperts) << 4 ^ c.maxTopk;
  tag.sameSize = true;
  const std::vector<std::string> all = context.allGather(std::to_string(remoteMask), tag);
  std::vector<uint32_t> masks(numRanks_);
  int slots = 0;
  for (int r = 0; r < numRanks_; ++r) {
    masks[r] = uint32_t(std::stoul(all[r]));
    slots = std::max(slots, __builtin_popcount(masks[r]));
  }
  for (int r = 0; r < numRanks_; ++r) {
    lt.mirrorSlot[r] = int8_t(__builtin_popcount(masks[r] & ((1u << rank_) - 1)));
    lt.remoteSlot[r] = int8_t(__builtin_popcount(remoteMask & ((1u << r) - 1)));
  }
  lt.lay = llLayout(c, numRanks_, slots);
  GDX_CUDA_CHECK(cudaMalloc(&m.memory, lt.lay.gpuBytes));
  // All of it, not only LlCtrl: a message's stamp must read 0 until a call writes it (LlLayout::stampOffset), and
  // cudaMalloc may hand back the memory of a buffer freed before, stamps and all.
  GDX_CUDA_CHECK(cudaMemset(m.memory, 0, lt.lay.gpuBytes));
  GDX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m.state), sizeof(LlState)));
  GDX_CUDA_CHECK(cudaMemset(m.state, 0, sizeof(LlState)));
  m.report.allocate();
  GDX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&m.maskHost), kMaxRanks * 4, cudaHostAllocMapped));
  std::memset(m.maskHost, 0, kMaxRanks * 4);
  GDX_CUDA_CHECK(cudaDeviceSynchronize());
  m.window = context.registerWindow(m.memory, lt.lay.gpuBytes, MemoryKind::kCuda, "gdx::ep::LowLatencyBuffer");
  Team& t = lt.t;
  for (int p = 0; p < numRanks_; ++p) t.base[p] = static_cast<char*>(m.window.peerData(p));
  t.rank = rank_;
  t.numRanks = numRanks_;
  t.state = &m.state->common;
  t.report = m.report.device();
  GDX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&lt.maskHost), m.maskHost, 0));
  t.failure = context.deviceFailureWord();  // any peer failed (waits on one rank read that rank's own word)
  t.timeoutNs = context.options().timeoutNs;
  t.remoteMask = remoteMask;
  t.window = m.window.id();
  lt.ll = m.state;
  for (int p = 0; p < numRanks_; ++p)
    if (p != rank_) lt.peerFailure[p] = context.deviceChannel(p).failure;
  lt.blocks = c.numSms;
  int major = 0;  // programmatic launch needs sm_90, and kernels built for it (llKernelsWaitForPrevious)
  GDX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, context.gpu().device));
  lt.programmaticLaunch = c.programmaticLaunch && major >= 9 && llKernelsWaitForPrevious();
  lt.nextKernelEarly = lt.programmaticLaunch && c.nextKernelEarly;
  lt.threads = c.numThreads;
  // A launch of both phases: every block must be running at once (a block's receive waits for other blocks' sends).
  const int resident = llMaxResidentBlocks(c.numThreads);
  if (resident < 1) invalid(rank_, "no block of " + std::to_string(c.numThreads) + " threads fits on this GPU");
  lt.bothBlocks = std::min(c.numSms, resident);
  std::fill(std::begin(m.userMaskedAt), std::end(m.userMaskedAt), int64_t(-1));
  if (slots > 0) {
    if (context.numSignals() < kBufferSignals + kLlSignals + 1)
      invalid(rank_, "ranks on other hosts need signal ids below the top " + std::to_string(kBufferSignals) +
                         ", GDX_NUM_SIGNALS is " + std::to_string(context.numSignals()));
    lt.sentSignal = context.numSignals() - kBufferSignals - kLlSignals;
    lt.freedSignal = lt.sentSignal + kMaxRanks;
    lt.weightsSignal = lt.freedSignal + kMaxRanks;
    for (uint32_t i = 0; i < kLlSignals; ++i) context.setSignal(lt.sentSignal + i, 0);
    // Pinned host memory the kernels write and read over PCIe: the proxy never issues a CUDA copy (ep/buffer.hpp).
    mapHostWindow(context, lt.lay.hostBytes, kLlCtrlBytes, "gdx::ep::LowLatencyBuffer network", &m.network);
    t.mirror = m.network.device;
    t.stageWindow = m.network.window.id();
    // One ring per destination: the count signal must follow that destination's data puts on their ring.
    m.net = uploadNetChannels(context, remoteMask, numRanks_, &t.netSignals);
    t.net = m.net;
  }
  GDX_INFO("gdx::ep low-latency rank " << rank_ << ": " << lt.lay.gpuBytes << " GPU bytes, " << lt.lay.hostBytes
                                       << " pinned host bytes, " << __builtin_popcount(remoteMask)
                                       << " rank(s) through the proxy");
  context.barrier();
}

LowLatencyBuffer::~LowLatencyBuffer() {
  detail::teardownBarrier(context_, rank_, "ep::LowLatencyBuffer");
  impl_.reset();
}

LowLatencyHandle LowLatencyBuffer::newHandle() const {
  const LlLayout& y = impl_->team.lay;
  const size_t rows = size_t(y.L) * y.T * y.R, messages = size_t(y.R) * y.T;
  const size_t bytes = rows * 8 + size_t(y.L) * y.R * 8 + 16 + (kMaxRanks + 1 + messages * (1 + y.K)) * 4;
  void* p = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&p, bytes));
  GDX_CUDA_CHECK(cudaMemset(p, 0, bytes));
  LowLatencyHandle h;
  h.memory_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  h.received_ = std::make_shared<bool>(false);
  h.owner_ = this;
  h.layoutRange_ = static_cast<int64_t*>(p);
  h.srcInfo_ = reinterpret_cast<int32_t*>(h.layoutRange_ + size_t(y.L) * y.R);
  h.srcSlot_ = h.srcInfo_ + rows;
  h.refused_ = h.srcSlot_ + rows;
  h.msgFirst_ = h.refused_ + 4;
  h.msgToken_ = h.msgFirst_ + kMaxRanks + 1;
  h.msgRows_ = h.msgToken_ + messages;
  return h;
}

void* LowLatencyBuffer::localMemory() const {
  return impl_->memory;
}
size_t LowLatencyBuffer::localBytes() const {
  return impl_->team.lay.gpuBytes;
}

std::vector<int> LowLatencyBuffer::maskedRanks() const {
  std::vector<int> v;
  for (int r = 0; r < numRanks_; ++r)
    if (atomicLoad(&impl_->maskHost[r], kAcquire) != 0) v.push_back(r);
  return v;
}

void LowLatencyBuffer::updateMask(int rank, bool masked, cudaStream_t stream) {
  requireContext("updateMask");
  if (rank < 0 || rank >= numRanks_)
    invalid(rank_, "updateMask: rank " + std::to_string(rank) + " outside [0, " + std::to_string(numRanks_) + ")");
  if (rank == rank_) invalid(rank_, "updateMask: a rank cannot mask itself");
  Impl& m = *impl_;
  if (masked) {
    GDX_CUDA_CHECK(launchLlSetMask(m.team, 1u << rank, 0, stream));
    if (m.userMaskedAt[rank] < 0) m.userMaskedAt[rank] = int64_t(m.calls);
    return;
  }
  requireUnmaskable(rank, "updateMask");
  GDX_CUDA_CHECK(launchLlSetMask(m.team, 0, 1u << rank, stream));
  m.userMaskedAt[rank] = -1;
}

void LowLatencyBuffer::queryMask(int32_t* out, cudaStream_t stream) const {
  requireContext("queryMask");
  if (!out) invalid(rank_, "queryMask: no output (int32 [numRanks] in device memory)");
  GDX_CUDA_CHECK(launchLlQueryMask(impl_->team, out, stream));
}

void LowLatencyBuffer::cleanMask(cudaStream_t stream) {
  requireContext("cleanMask");
  uint32_t all = 0;
  for (int r = 0; r < numRanks_; ++r) {
    if (r == rank_) continue;
    requireUnmaskable(r, "cleanMask");
    all |= 1u << r;
  }
  GDX_CUDA_CHECK(launchLlSetMask(impl_->team, 0, all, stream));
  std::fill(std::begin(impl_->userMaskedAt), std::end(impl_->userMaskedAt), int64_t(-1));
}

// A rank may come back only while it and this rank are at the same call (low_latency.hpp, updateMask).
void LowLatencyBuffer::requireUnmaskable(int r, const char* op) const {
  const Impl& m = *impl_;
  const std::string who = std::string(op) + ": rank " + std::to_string(r);
  if (atomicLoad(&m.maskHost[r], kAcquire) == kMaskedByKernel)
    invalid(rank_, who + " was masked by a call (dead, timed out or unreachable): it missed that call and cannot " +
                       "come back (its epochs are not this rank's); make a new buffer on every rank");
  if (m.userMaskedAt[r] >= 0 && uint64_t(m.userMaskedAt[r]) != m.calls)
    invalid(rank_, who + " was masked by updateMask before call " + std::to_string(m.userMaskedAt[r]) + " and " +
                       std::to_string(m.calls - uint64_t(m.userMaskedAt[r])) +
                       " call(s) were made since without it: it cannot come back (its epochs are not this rank's); " +
                       "make a new buffer on every rank");
}

void LowLatencyBuffer::checkErrors() const {
  Impl& m = *impl_;
  if (m.report.kind() == kNone) return;
  throw reportError(m.report.take(&m.state->common.reportClaim, nullptr),
                    {BufferMode::kLowLatency, rank_, config_.maxTokensPerRank});
}

// Double buffering: at most two calls whose receive halves were not launched yet.
bool LowLatencyBuffer::beginCall(LowLatencyHook* hook, const char* op) {
  requireContext(op);
  Impl& m = *impl_;
  const uint64_t inFlight = m.calls - m.received;
  if (inFlight >= 2)
    invalid(rank_, std::string(op) + ": two calls are in flight (their receive hooks not run): a third would reuse " +
                       "the buffer of call " + std::to_string(m.received) +
                       " before it is consumed; run the oldest hook first");
  if (!hook && inFlight > 0)
    invalid(rank_, std::string(op) + " without a hook while " + std::to_string(inFlight) +
                       " hook(s) are pending: receive halves run in call order, run them first");
  if (hook && hook->pending())
    invalid(rank_, std::string(op) + ": the hook passed still holds the receive half of call " +
                       std::to_string(hook->call_) + "; run it first");
  // Only an error recorded before this call is thrown by it: one its own kernels record while the host is still in
  // the call would make whether the call throws a race.
  return impl_->report.kind() != kNone;
}

// An error a kernel recorded (a skipped expert id, a refused dispatch) is thrown once the call that finds it was
// launched (ep/report.hpp, throwAfterLaunch): thrown before, it would leave the other ranks waiting for a call this
// rank never made, masking it, and this rank's epochs one behind theirs.
void LowLatencyBuffer::raiseAfterLaunch(bool earlier, cudaStream_t stream) const {
  if (throwAfterLaunch(earlier, stream)) checkErrors();
}

void LowLatencyBuffer::lowLatencyDispatch(const LowLatencyDispatchInputs& in, const LowLatencyDispatchOutputs& out,
                                          LowLatencyHandle& handle, cudaStream_t stream, LowLatencyHook* hook) {
  const LlLayout& y = impl_->team.lay;
  const std::string o = "low_latency_dispatch: ";
  if (handle.owner_ != this) invalid(rank_, o + "the handle was not made by this buffer (newHandle)");
  if (in.numTokens < 0 || in.numTokens > y.T)
    invalid(rank_, o + std::to_string(in.numTokens) + " tokens, the buffer was made for at most " +
                       std::to_string(y.T) + " per rank");
  if (in.numTopk < 1 || in.numTopk > y.K)
    invalid(rank_, o + "numTopk " + std::to_string(in.numTopk) + " outside [1, maxTopk " + std::to_string(y.K) + "]");
  if (in.numTokens > 0 && (!in.x || reinterpret_cast<uintptr_t>(in.x) % 16 != 0 || !in.topkIdx))
    invalid(rank_, o + "x (16-byte aligned BF16) and topkIdx are needed");
  if (!out.recvX || reinterpret_cast<uintptr_t>(out.recvX) % 16 != 0 || !out.recvCount)
    invalid(rank_, o + "recvX (16-byte aligned) and recvCount are needed");
  if (in.useFp8 && !out.recvXScales) invalid(rank_, o + "FP8 needs recvXScales (LowLatencyDispatchOutputs)");
  if (in.useUe8m0 && (!in.useFp8 || !in.roundScale))
    invalid(rank_, o + "use_ue8m0 needs FP8 with round_scale (the scales must be powers of two)");
  const bool earlier = beginCall(hook, "low_latency_dispatch");
  LlDispatchArgs a{};
  a.x = static_cast<const char*>(in.x);
  a.topkIdx = in.topkIdx;
  a.numTokens = in.numTokens;
  a.numTopk = in.numTopk;
  a.fp8 = in.useFp8;
  a.roundScale = in.roundScale;
  a.msg = llMessage(y.H, y.K, in.useFp8);
  a.out = out;
  a.srcInfo = handle.srcInfo_;
  a.srcSlot = handle.srcSlot_;
  a.layoutRange = handle.layoutRange_;
  a.refused = handle.refused_;
  a.msgs = LlMessages{handle.msgFirst_, handle.msgToken_, handle.msgRows_};
  a.ue8m0 = in.useUe8m0;
  // Without a hook, one launch of both phases; with one, the send phase now and the receive phase from the hook.
  GDX_CUDA_CHECK(launchLlDispatch(impl_->team, a, hook ? kLlSend : kLlBoth, stream));
  ++impl_->calls;
  handle.numTokens_ = in.numTokens;
  handle.numTopk_ = in.numTopk;
  *handle.received_ = !hook;
  if (hook) {
    hook->owner_ = this;
    hook->call_ = impl_->calls - 1;
    hook->args_ = std::make_shared<HookArgs>(HookArgs{true, a, {}, handle.memory_, handle.received_});
  } else {
    ++impl_->received;
  }
  raiseAfterLaunch(earlier, stream);
}

void LowLatencyBuffer::lowLatencyCombine(const LowLatencyCombineInputs& in, const LowLatencyHandle& handle,
                                         void* combined, cudaStream_t stream, LowLatencyHook* hook) {
  const std::string o = "low_latency_combine: ";
  if (handle.owner_ != this || handle.numTokens_ < 0)
    invalid(rank_, o + "the handle is not one a dispatch of this buffer filled");
  if (!*handle.received_) invalid(rank_, o + "the handle's dispatch was not received yet (run its hook first)");
  if (!in.x || reinterpret_cast<uintptr_t>(in.x) % 16 != 0) invalid(rank_, o + "x must be a 16-byte aligned pointer");
  if (handle.numTokens_ > 0 &&
      (!in.topkIdx || !in.topkWeights || !combined || reinterpret_cast<uintptr_t>(combined) % 16 != 0))
    invalid(rank_, o + "topkIdx, topkWeights and a 16-byte aligned output are needed");
  const bool earlier = beginCall(hook, "low_latency_combine");
  LlCombineArgs a{};
  a.x = static_cast<const char*>(in.x);
  a.topkIdx = in.topkIdx;
  a.topkWeights = in.topkWeights;
  a.out = static_cast<char*>(combined);
  a.numTokens = handle.numTokens_;
  a.numTopk = handle.numTopk_;
  a.refused = handle.refused_;
  a.msgs = LlMessages{handle.msgFirst_, handle.msgToken_, handle.msgRows_};
  a.waitCost = in.waitRecvCostStats;
  GDX_CUDA_CHECK(launchLlCombine(impl_->team, a, hook ? kLlSend : kLlBoth, stream));
  ++impl_->calls;
  if (hook) {
    hook->owner_ = this;
    hook->call_ = impl_->calls - 1;
    hook->args_ = std::make_shared<HookArgs>(HookArgs{false, {}, a, nullptr, nullptr});
  } else {
    ++impl_->received;
  }
  raiseAfterLaunch(earlier, stream);
}

// The kernels read the Context's rings and failure words: none is launched once it is gone.
void LowLatencyBuffer::requireContext(const char* op) const {
  if (!context_.use()) context_.throwGone(std::string("gdx::ep::LowLatencyBuffer ") + op);
}

void LowLatencyBuffer::runHook(LowLatencyHook& hook, cudaStream_t stream) {
  requireContext("receive hook");
  Impl& m = *impl_;
  if (hook.call_ != m.received)
    invalid(rank_, "receive hook of call " + std::to_string(hook.call_) + " run before that of call " +
                       std::to_string(m.received) + ": hooks run in the order of their calls");
  const HookArgs& h = *static_cast<const HookArgs*>(hook.args_.get());
  if (h.dispatch) {
    GDX_CUDA_CHECK(launchLlDispatch(m.team, h.d, kLlRecv, stream));
    *h.received = true;
  } else {
    GDX_CUDA_CHECK(launchLlCombine(m.team, h.c, kLlRecv, stream));
  }
  ++m.received;
  hook.owner_ = nullptr;
  hook.args_.reset();
}

void detail::startEpochsAt(LowLatencyBuffer& buffer, uint64_t epoch) {
  LowLatencyBuffer::Impl& m = *buffer.impl_;
  if (m.team.t.remoteMask) invalid(buffer.rank_, "startEpochsAt: ranks on other hosts (their signals start at 0)");
  if (m.calls) invalid(buffer.rank_, "startEpochsAt: the buffer already made calls");
  GDX_CUDA_CHECK(cudaMemcpy(&m.state->sendSeq, &epoch, sizeof(epoch), cudaMemcpyHostToDevice));
  GDX_CUDA_CHECK(cudaMemcpy(&m.state->recvSeq, &epoch, sizeof(epoch), cudaMemcpyHostToDevice));
  // As if every receiver had freed this rank's buffers up to `epoch` (the first calls wait for epoch - 1 and epoch).
  const std::vector<uint64_t> freed(kMaxRanks, epoch);
  GDX_CUDA_CHECK(cudaMemcpy(static_cast<char*>(m.memory) + offsetof(LlCtrl, freed), freed.data(), kMaxRanks * 8,
                            cudaMemcpyHostToDevice));
}

void LowLatencyHook::run(cudaStream_t stream) {
  if (!owner_) throw Error(ErrorCode::kInvalidArgument, "gdx::ep low-latency hook: nothing to receive (run twice?)");
  owner_->runHook(*this, stream);
}

}  // namespace gdx::ep
