// gdx::ep::Buffer, host side: the window every peer stores into, the checks made before anything is launched, the
// launches, and turning what the kernels report into exceptions.
#include "gdx/ep/buffer.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "base/cuda_check.hpp"
#include "base/log.hpp"
#include "ep/launchers.hpp"
#include "ep/network_path.hpp"
#include "ep/protocol.hpp"
#include "ep/report.hpp"
#include "ep/teardown.hpp"
#include "gdx/device/impl/atomic.hpp"

namespace gdx::ep {

using namespace detail;

namespace {

[[noreturn]] void invalid(int rank, const std::string& what) {
  throwInvalid({BufferMode::kNormal, rank}, what);
}

}  // namespace

Config Config::forRanks(int numRanks) {
  Config c;
  c.numSms = 24;
  c.numThreads = numRanks <= 2 ? 768 : 1024;
  return c;
}

struct Buffer::Impl {
  Window window;
  void* memory = nullptr;
  State* state = nullptr;
  HostReport report;
  int32_t* hostCounts = nullptr;
  int32_t* hostCountsDev = nullptr;
  Team team{};
  ChannelDeviceHandle* net = nullptr;  // device copy of the handles to remote ranks (team.net)
  HostWindowMemory network;            // the receive mirror, then what this rank sends (protocol.hpp)
  bool broken = false;

  // Frees what the constructor got so far too (it may throw half-way).
  ~Impl() {
    window = Window();
    network.window = Window();
    if (memory) cudaFree(memory);
    if (network.host) cudaFreeHost(network.host);
    if (state) cudaFree(state);
    if (hostCounts) cudaFreeHost(hostCounts);
    if (net) cudaFree(net);
  }

  // Throws the recorded error, if any. Recoverable ones (bad input, found before anything was sent) are cleared so
  // the Buffer goes on; a timeout or a failed peer leaves it unusable.
  // Throws kShutdown first when the Context is gone: every operation calls this (or earlierError()) before it launches
  // a kernel, whose rings and signals would be freed memory.
  void raise(int rank, const ContextRef& link, cudaStream_t stream) {
    if (!earlierError(rank, link)) return;
    throw reportError(report.take(&state->reportClaim, stream), {BufferMode::kNormal, rank});
  }

  // What a collective call checks before its launch: throws when the Buffer cannot be used (its Context gone, an
  // earlier timeout or lost peer); else says whether an earlier call left a recoverable error (bad input a kernel
  // found on this rank alone, such as getDispatchLayout's). The call throws that one with raise() once it was
  // launched: thrown before, this rank would skip a call the others make and wait for, breaking the Buffer for all.
  bool earlierError(int rank, const ContextRef& link) {
    ContextRef::Use ctx = link.use();
    if (!ctx) link.throwGone("gdx::ep::Buffer");
    const uint32_t kind = report.kind();
    if (kind == kNone) return false;
    if (kind == kTimeout || kind == kPeerFailed) {
      broken = true;
      const ReportSource who{BufferMode::kNormal, rank};
      std::string msg = messagePrefix(who) + describeReport(report.recorded(), who);
      const std::string f = ctx->failure();
      if (!f.empty()) msg += " (" + f + ")";
      msg += "; this Buffer is unusable now";
      throw Error(reportCode(kind), msg);
    }
    return true;
  }
};

Buffer::Buffer(Context& context, size_t nvlBytes, size_t rdmaBytes, const Config& config)
    : context_(context.ref()),
      config_(config),
      rank_(context.rank()),
      numRanks_(context.worldSize()),
      nvlBytes_(nvlBytes),
      impl_(std::make_unique<Impl>()) {
  if (!context.gpu().present()) invalid(rank_, "needs a GPU");
  if (numRanks_ > kMaxRanks) invalid(rank_, std::to_string(numRanks_) + " ranks, at most " + std::to_string(kMaxRanks));
  if (nvlBytes <= kCtrlBytes + 4096 || nvlBytes % 16 != 0)
    invalid(rank_, "nvlBytes " + std::to_string(nvlBytes) + " is too small or not a multiple of 16");
  if (config.numSms < 1 || config.numThreads < 64 || config.numThreads > 1024 || config.numThreads % 32 != 0)
    invalid(rank_, "config: numSms " + std::to_string(config.numSms) + ", numThreads " +
                       std::to_string(config.numThreads) + " (numThreads: a multiple of 32 in [64, 1024])");
  int coResident = 0;
  GDX_CUDA_CHECK(detail::maxCoResidentBlocks(context.gpu().device, config.numThreads, &coResident));
  if (config.numSms > coResident)
    invalid(rank_, "config: numSms " + std::to_string(config.numSms) + " blocks of " +
                       std::to_string(config.numThreads) + " threads, but GPU " + std::to_string(context.gpu().device) +
                       " runs at most " + std::to_string(coResident) +
                       " of them at once, and the dispatch's and combine's blocks wait for each other");
  Impl& m = *impl_;
  GDX_CUDA_CHECK(cudaSetDevice(context.gpu().device));
  GDX_CUDA_CHECK(cudaMalloc(&m.memory, nvlBytes));
  // All of it, not only the Ctrl: a Buffer made again in the same process often gets the same memory back, and the
  // row stamps left there by the old one would read as this one's (the epochs start over; protocol.hpp).
  GDX_CUDA_CHECK(cudaMemset(m.memory, 0, nvlBytes));
  GDX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m.state), sizeof(State)));
  GDX_CUDA_CHECK(cudaMemset(m.state, 0, sizeof(State)));
  m.report.allocate();
  GDX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&m.hostCounts), kHostCountsSize * 4, cudaHostAllocMapped));
  GDX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.hostCountsDev), m.hostCounts, 0));
  GDX_CUDA_CHECK(cudaDeviceSynchronize());
  m.window = context.registerWindow(m.memory, nvlBytes, MemoryKind::kCuda, "gdx::ep::Buffer");
  // Ranks this one does not reach on the direct path are reached through the proxy (its staging areas).
  for (int p = 0; p < numRanks_; ++p) {
    m.team.base[p] = static_cast<char*>(m.window.peerData(p));
    if (!m.team.base[p]) m.team.remoteMask |= 1u << p;
  }
  numRemote_ = __builtin_popcount(m.team.remoteMask);
  // Peers store at the same offsets of every rank's buffer: the sizes must match, which the tag checks.
  CollectiveTag tag;
  tag.kind = "ep::Buffer: sizes and reach";
  tag.size = nvlBytes;
  tag.sameSize = true;
  // The kernel shape too: a receiver works out from it whether a sender stamps its rows (protocol.hpp, "Row stamps").
  const std::string shape = std::to_string(config.numSms) + " x " + std::to_string(config.numThreads);
  const std::string mine = std::to_string(rdmaBytes) + "/" + std::to_string(m.team.remoteMask) + "/" + shape;
  std::vector<std::string> all = context.allGather(mine, tag);
  std::vector<uint32_t> remoteMasks(numRanks_);
  for (int r = 0; r < numRanks_; ++r) {
    const size_t slash = all[r].find('/'), slash2 = all[r].find('/', slash + 1);
    if (all[r].substr(0, slash) != std::to_string(rdmaBytes))
      invalid(rank_, "rank " + std::to_string(r) + " made its Buffer with rdmaBytes " + all[r].substr(0, slash) +
                         ", this rank with " + std::to_string(rdmaBytes));
    if (all[r].substr(slash2 + 1) != shape)
      invalid(rank_, "rank " + std::to_string(r) + " made its Buffer with a Config of " + all[r].substr(slash2 + 1) +
                         " (numSms x numThreads), this rank with " + shape + ": every rank must use the same");
    remoteMasks[r] = static_cast<uint32_t>(std::stoul(all[r].substr(slash + 1, slash2 - slash - 1)));
  }
  assignHostsAndRelays(remoteMasks);
  m.team.rank = rank_;
  m.team.numRanks = numRanks_;
  m.team.state = m.state;
  m.team.report = m.report.device();
  m.team.failure = context.deviceFailureWord();  // any peer failed: a collective cannot go on
  m.team.timeoutNs = context.options().timeoutNs;
  m.team.window = m.window.id();
  if (numRemote_ > 0) connectRemote(context, rdmaBytes);
  context.barrier();
}

// Hosts from every rank's reach: a host is a set of ranks that reach each other on the direct path (its id: its
// lowest rank). The relay of source s on host h is the rank of h whose index among h's ranks is s's index among its
// own host's (modulo h's size), so each GPU of a host relays for the same-index GPUs of the others.
void Buffer::assignHostsAndRelays(const std::vector<uint32_t>& remoteMasks) {
  Team& t = impl_->team;
  const int R = numRanks_;
  std::vector<int> localIndex(R), hostSize(R, 0);
  for (int r = 0; r < R; ++r) {
    int h = 0;
    while (h < r && ((remoteMasks[r] >> h) & 1u)) ++h;  // the lowest rank r reaches directly (r itself at the latest)
    t.hostOf[r] = static_cast<int8_t>(h);
    localIndex[r] = hostSize[h]++;
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < R; ++q)
      if ((((remoteMasks[r] >> q) & 1u) != 0) != (t.hostOf[r] != t.hostOf[q]))
        invalid(rank_, "rank " + std::to_string(r) + (((remoteMasks[r] >> q) & 1u) ? " does not reach" : " reaches") +
                           " rank " + std::to_string(q) +
                           " on the direct path, unlike the rest of their hosts: the ranks do not split into hosts");
  for (int s = 0; s < R; ++s)
    for (int h = 0; h < R; ++h) {
      t.relayOf[s][h] = -1;
      if (hostSize[h] == 0) continue;
      const int want = localIndex[s] % hostSize[h];
      for (int r = 0; r < R; ++r)
        if (t.hostOf[r] == h && localIndex[r] == want) t.relayOf[s][h] = static_cast<int8_t>(r);
    }
  // A relay's buffer holds, in a combine, the rows of its own tokens and of each source it relays for, from every
  // rank of its host (combineRelayRow): the largest such count bounds the tokens a rank may send.
  rowsPerToken_ = R;
  for (int rho = 0; rho < R; ++rho) {
    int relayed = 0;
    for (int s = 0; s < R; ++s)
      if (t.hostOf[s] != t.hostOf[rho] && t.relayOf[s][t.hostOf[rho]] == rho) ++relayed;
    rowsPerToken_ = std::max(rowsPerToken_, hostSize[t.hostOf[rho]] * (1 + relayed));
  }
  const int mine = t.hostOf[rank_];
  for (int r = 0; r < R; ++r) {
    if (t.hostOf[r] == mine) t.localMask |= 1u << r;
    if (t.hostOf[r] == r && r != mine) t.relayMask |= 1u << t.relayOf[rank_][r];
    if (t.hostOf[r] != mine && t.relayOf[r][mine] == rank_) t.relayedFrom |= 1u << r;
  }
}

// The staging areas, the proxied channels and the flag signals of the ranks on other hosts.
void Buffer::connectRemote(Context& context, size_t rdmaBytes) {
  Impl& m = *impl_;
  // Every remote rank gets a staging copy of its Ctrl fields (counts, flags); rows go only to this rank's relays on
  // the other hosts (dispatch) and back to the sources it relays for (combine), so those share the rest.
  const uint32_t rowMask = m.team.relayMask | m.team.relayedFrom;
  const int rowRanks = __builtin_popcount(rowMask);
  const uint64_t ctrlOnly = uint64_t(numRemote_ - rowRanks) * kCtrlBytes;
  stageBytes_ = rdmaBytes > ctrlOnly ? (rdmaBytes - ctrlOnly) / rowRanks / 16 * 16 : 0;
  if (stageBytes_ < kCtrlBytes + 4096)
    invalid(rank_, std::to_string(numRemote_) + " ranks are on other hosts (reached through the proxy), " +
                       std::to_string(rowRanks) + " of them relays of this rank's rows or sources it relays for: " +
                       "rdmaBytes " + std::to_string(rdmaBytes) + " must hold " + std::to_string(kCtrlBytes) +
                       " bytes of counts for each and a staging area of at least " + std::to_string(kCtrlBytes + 4096) +
                       " bytes for each of the " + std::to_string(rowRanks));
  const uint32_t flagSignals = 3 * kMaxRanks;
  if (context.numSignals() < flagSignals + 1)
    invalid(rank_, "ranks on other hosts need the top " + std::to_string(flagSignals) +
                       " signal ids, GDX_NUM_SIGNALS is " + std::to_string(context.numSignals()));
  m.team.signalBase = context.numSignals() - flagSignals;
  for (uint32_t i = 0; i < flagSignals; ++i) context.setSignal(m.team.signalBase + i, 0);  // a previous Buffer's
  // The send staging and the receive mirror the ranks on other hosts store into, both in pinned host memory: the
  // kernels write and read it over PCIe, the proxy moves it without a CUDA copy.
  mapHostWindow(context, nvlBytes_ + rdmaBytes, kCtrlBytes, "gdx::ep::Buffer network", &m.network);
  m.team.stageWindow = m.network.window.id();
  m.team.mirror = m.network.device;
  m.team.slotBytes = (nvlBytes_ - kCtrlBytes) / numRanks_ / 16 * 16;
  uint64_t offset = nvlBytes_;
  for (int r = 0; r < numRanks_; ++r) {
    if (!((m.team.remoteMask >> r) & 1u)) continue;
    m.team.stage[r] = m.network.device + offset;
    m.team.stageOffset[r] = offset;
    offset += (rowMask >> r) & 1u ? stageBytes_ : kCtrlBytes;
  }
  m.net = uploadNetChannels(context, m.team.remoteMask, numRanks_, &m.team.netSignals);
  m.team.net = m.net;
  GDX_INFO("gdx::ep rank " << rank_ << ": " << numRemote_ << " rank(s) on other hosts through the proxy, relays 0x"
                           << std::hex << m.team.relayMask << ", relaying for 0x" << m.team.relayedFrom << std::dec
                           << ", " << stageBytes_ << " bytes of staging for each of 0x" << std::hex << rowMask
                           << std::dec << ", flag signals " << m.team.signalBase << "..");
}

Buffer::~Buffer() {
  detail::teardownBarrier(context_, rank_, "ep::Buffer");
  impl_.reset();
}

int Buffer::maxTokensPerRank(int hidden, int numTopk, DType dtype) const {
  uint64_t row = std::max<uint64_t>(dispatchRow(hidden, numTopk, dtype).rowBytes, combineRowBytes(hidden, numTopk));
  if (numRemote_ > 0) row = std::max<uint64_t>(row, relayRow(hidden, numTopk, dtype).rowBytes);
  uint64_t rows = (nvlBytes_ - kCtrlBytes) / row / static_cast<uint64_t>(rowsPerToken_);
  // Every rank sending all its tokens to one rank still fits (dispatch); a rank's rows coming back from its host's
  // ranks and the rows of the sources its relays fit the same buffer (combine; rowsPerToken_ counts both). Through the
  // network, a rank stages at most one row per token for each relay (dispatch) and a relay one per relayed token
  // (combine), each into a mirror slot per source.
  if (numRemote_ > 0) {
    rows = std::min<uint64_t>(rows, (stageBytes_ - kCtrlBytes - kSlotHeaderBytes) / row);
    rows = std::min<uint64_t>(rows, (impl_->team.slotBytes - kSlotHeaderBytes) / row);
  }
  return static_cast<int>(rows);
}

DispatchHandle Buffer::newHandle(int maxTokens) const {
  if (maxTokens < 0) invalid(rank_, "newHandle: maxTokens " + std::to_string(maxTokens));
  DispatchHandle h;
  void* p = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&p, handleBytes(maxTokens)));
  GDX_CUDA_CHECK(cudaMemset(p, 0, handleBytes(maxTokens)));
  h.memory_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  h.owner_ = this;
  h.maxTokens_ = maxTokens;
  if (impl_->team.relayedFrom) growRelay(h, maxTokens);
  return h;
}

// The relay rows a handle keeps (per source this rank relays), reallocated larger when a prepare needs more.
void Buffer::growRelay(DispatchHandle& h, int rows) const {
  if (rows <= h.relayCap_ && h.relayMemory_) return;
  void* p = nullptr;
  GDX_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(relayBytes(rows), 16)));
  h.relayMemory_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  h.relayCap_ = rows;
}

HandleView Buffer::viewOf(const DispatchHandle& h) const {
  return carveHandle(h.memory_.get(), h.maxTokens_, h.relayMemory_.get(), h.relayCap_);
}

const int32_t* Buffer::countsMatrix(const DispatchHandle& handle) const {
  if (handle.owner_ != this || handle.numTokens_ < 0)
    invalid(rank_, "countsMatrix: the handle was not made by this Buffer or no dispatch filled it");
  return viewOf(handle).matrix;
}

void* Buffer::localMemory() const {
  return impl_->memory;
}

void Buffer::checkErrors() const {
  impl_->raise(rank_, context_, nullptr);
}

void Buffer::checkDispatchInputs(const DispatchInputs& in, const DispatchHandle& handle, const char* op) const {
  const std::string o = std::string(op) + ": ";
  if (impl_->broken) invalid(rank_, o + "an earlier operation timed out or lost a peer; this Buffer is unusable");
  if (handle.owner_ != this) invalid(rank_, o + "the handle was not made by this Buffer (newHandle)");
  if (in.dtype != DType::kBFloat16 && in.dtype != DType::kFloat8E4M3)
    invalid(rank_, o + "dtype " + std::to_string(static_cast<int>(in.dtype)) + " not supported (BF16, FP8 e4m3)");
  if (in.hidden <= 0 || in.hidden % kFp8ScaleBlock != 0 || in.hidden > 65536)
    invalid(rank_, o + "hidden size " + std::to_string(in.hidden) + " not supported (a multiple of 128, <= 65536)");
  if (in.numTokens < 0 || in.numTokens > handle.maxTokens_)
    invalid(rank_, o + std::to_string(in.numTokens) + " tokens, the handle holds " + std::to_string(handle.maxTokens_));
  const int k = std::max(in.numTopk, 1);
  const int maxTokens = maxTokensPerRank(in.hidden, k, in.dtype);
  if (in.numTokens > maxTokens)
    invalid(rank_, o + std::to_string(in.numTokens) + " tokens, more than the buffer holds (" +
                       std::to_string(maxTokens) + " per rank with hidden " + std::to_string(in.hidden) + ", " +
                       std::to_string(numRanks_) + " ranks, nvlBytes " + std::to_string(nvlBytes_) +
                       (numRemote_ ? ", staging " + std::to_string(stageBytes_) + " per relay" : "") + ")");
  if (in.numTokens > 0 && (!in.x || reinterpret_cast<uintptr_t>(in.x) % 16 != 0))
    invalid(rank_, o + "x must be a 16-byte aligned device pointer");
  if (in.numTokens > 0 && in.dtype == DType::kFloat8E4M3 && !in.xScales)
    invalid(rank_, o + "FP8 needs xScales [numTokens, hidden / 128]");
}

void Buffer::launchPrepare(const DispatchInputs& in, DispatchHandle& handle, int expertAlignment, int32_t* perExpert,
                           int32_t* numRecv, bool growOnHost, cudaStream_t stream) {
  checkDispatchInputs(in, handle, "dispatch");
  if (in.numExperts <= 0 || in.numExperts > kMaxExperts || in.numExperts % numRanks_ != 0)
    invalid(rank_, "dispatch: " + std::to_string(in.numExperts) + " experts, not a positive multiple of the " +
                       std::to_string(numRanks_) + " ranks (at most " + std::to_string(kMaxExperts) + ")");
  // The by-rank form (DispatchInputs): no top-k at all. Else the top-k form, whose topkIdx only a rank without
  // tokens may leave null.
  const bool byRank = !in.topkIdx && in.numTopk == 0;
  if (byRank) {
    if (in.topkWeights) invalid(rank_, "dispatch: topkWeights without topkIdx (the by-rank form has no top-k)");
    if (in.numTokens > 0 && !in.isTokenInRank)
      invalid(rank_, "dispatch: without topkIdx, isTokenInRank [numTokens, numRanks] routes the tokens and is needed");
    if (!in.numTokensPerExpert)
      invalid(rank_, "dispatch: without topkIdx, numTokensPerExpert [numExperts] (get_dispatch_layout's) is needed");
  } else {
    if (in.numTopk < 1 || in.numTopk > kMaxTopk)
      invalid(rank_, "dispatch: numTopk " + std::to_string(in.numTopk) + " outside [1, " + std::to_string(kMaxTopk) +
                         "] (0 without topkIdx: the by-rank form)");
    if (in.numTokens > 0 && !in.topkIdx)
      invalid(rank_,
              "dispatch: topkIdx is needed (it routes the tokens); without it numTopk must be 0, and "
              "isTokenInRank and numTokensPerExpert route them");
  }
  if (expertAlignment < 1) invalid(rank_, "dispatch: expert alignment " + std::to_string(expertAlignment));
  impl_->earlierError(rank_, context_);  // the callers throw an earlier call's error once the prepare was launched
  PrepareArgs a{};
  a.topkIdx = in.topkIdx;
  a.isTokenInRank = byRank ? reinterpret_cast<const uint8_t*>(in.isTokenInRank) : nullptr;
  a.numTokensPerExpert = byRank ? in.numTokensPerExpert : nullptr;  // non-null: the kernel routes by rank
  a.numTokens = in.numTokens;
  a.numTopk = in.numTopk;
  a.numExperts = in.numExperts;
  a.alignment = expertAlignment;
  a.relayCap = growOnHost ? INT32_MAX : handle.relayCap_;
  a.handle = viewOf(handle);
  a.perExpertOut = perExpert;
  a.numRecvOut = numRecv;
  a.hostCounts = impl_->hostCountsDev;
  GDX_CUDA_CHECK(detail::launchPrepare(impl_->team, a, stream));
  handle.numTokens_ = in.numTokens;
  handle.hidden_ = in.hidden;
  handle.numTopk_ = in.numTopk;
  handle.numRecvTokens_ = -1;
}

void Buffer::getDispatchLayout(const int64_t* topkIdx, int numTokens, int numTopk, int numExperts,
                               int32_t* numTokensPerRank, int32_t* numTokensPerExpert, bool* isTokenInRank,
                               cudaStream_t stream) {
  if (numExperts <= 0 || numExperts > kMaxExperts || numExperts % numRanks_ != 0)
    invalid(rank_, "get_dispatch_layout: " + std::to_string(numExperts) + " experts, not a positive multiple of the " +
                       std::to_string(numRanks_) + " ranks");
  if (numTopk < 1 || numTopk > kMaxTopk || numTokens < 0 || (numTokens > 0 && !topkIdx))
    invalid(rank_,
            "get_dispatch_layout: numTopk " + std::to_string(numTopk) + ", numTokens " + std::to_string(numTokens));
  if (!numTokensPerRank || !numTokensPerExpert || !isTokenInRank)
    invalid(rank_, "get_dispatch_layout: every output is needed");
  impl_->raise(rank_, context_, stream);
  GDX_CUDA_CHECK(cudaMemsetAsync(numTokensPerRank, 0, numRanks_ * 4, stream));
  GDX_CUDA_CHECK(cudaMemsetAsync(numTokensPerExpert, 0, size_t(numExperts) * 4, stream));
  LayoutArgs a{topkIdx, numTokens, numTopk, numExperts, numRanks_, numTokensPerRank, numTokensPerExpert, isTokenInRank};
  GDX_CUDA_CHECK(launchLayout(impl_->team, a, stream));
}

DispatchCounts Buffer::dispatchPrepare(const DispatchInputs& in, DispatchHandle& handle, int expertAlignment,
                                       cudaStream_t stream, int32_t* numRecvTokensPerExpert) {
  const bool earlier = impl_->earlierError(rank_, context_);
  launchPrepare(in, handle, expertAlignment, numRecvTokensPerExpert, nullptr, true, stream);
  GDX_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!earlier) impl_->raise(rank_, context_, stream);  // this prepare's own error, found alike on every rank
  // The relay keeps where each relayed row goes: room for every token of the sources it relays.
  int relayed = 0;
  for (int s = 0; s < numRanks_; ++s)
    if ((impl_->team.relayedFrom >> s) & 1u) relayed = std::max(relayed, impl_->hostCounts[kHostCountsTokens + s]);
  if (impl_->team.relayedFrom) growRelay(handle, relayed);
  DispatchCounts c;
  c.numRecvTokens = impl_->hostCounts[0];
  c.numRecvTokensPerExpert.assign(impl_->hostCounts + 1, impl_->hostCounts + 1 + in.numExperts / numRanks_);
  handle.numRecvTokens_ = c.numRecvTokens;
  // The handle is filled: the next calls go on in step.
  if (throwAfterLaunch(earlier, stream)) impl_->raise(rank_, context_, stream);
  return c;
}

void Buffer::dispatch(const DispatchInputs& in, const DispatchHandle& handle, const DispatchOutputs& out,
                      cudaStream_t stream) {
  checkDispatchInputs(in, handle, "dispatch");
  if (handle.numTokens_ < 0) invalid(rank_, "dispatch: the handle was never filled (dispatchPrepare)");
  if (in.numTokens != handle.numTokens_ || in.hidden != handle.hidden_)
    invalid(rank_, "dispatch: " + std::to_string(in.numTokens) + " tokens of hidden " + std::to_string(in.hidden) +
                       ", the handle routes " + std::to_string(handle.numTokens_) + " of hidden " +
                       std::to_string(handle.hidden_));
  if (in.topkIdx && in.numTopk != handle.numTopk_)
    invalid(rank_,
            "dispatch: numTopk " + std::to_string(in.numTopk) + ", the handle's is " + std::to_string(handle.numTopk_));
  checkDispatchOutputs(in, out);
  const bool earlier = impl_->earlierError(rank_, context_);
  launchDispatchKernel(in, handle, out, stream);
  if (throwAfterLaunch(earlier, stream)) impl_->raise(rank_, context_, stream);
}

void Buffer::checkDispatchOutputs(const DispatchInputs& in, const DispatchOutputs& out) const {
  if (out.capacity < 0 || (out.capacity > 0 && (!out.recvX || reinterpret_cast<uintptr_t>(out.recvX) % 16 != 0)))
    invalid(rank_,
            "dispatch: recvX must be a 16-byte aligned device pointer for " + std::to_string(out.capacity) + " rows");
  if (in.dtype == DType::kFloat8E4M3 && out.capacity > 0 && !out.recvXScales)
    invalid(rank_, "dispatch: FP8 needs recvXScales");
}

void Buffer::launchDispatchKernel(const DispatchInputs& in, const DispatchHandle& handle, const DispatchOutputs& out,
                                  cudaStream_t stream) {
  DispatchArgs a{};
  a.x = static_cast<const char*>(in.x);
  a.xScales = in.xScales;
  a.topkIdx = in.topkIdx;
  a.topkWeights = in.topkWeights;
  a.numTokens = in.numTokens;
  a.hidden = in.hidden;
  a.numTopk = handle.numTopk_;
  a.numExperts = in.topkIdx ? in.numExperts : 0;
  a.row = dispatchRow(in.hidden, handle.numTopk_, in.dtype);
  a.relay = relayRow(in.hidden, handle.numTopk_, in.dtype);
  a.handle = viewOf(handle);
  a.out = out;
  GDX_CUDA_CHECK(launchDispatch(impl_->team, a, config_, stream));
}

void Buffer::dispatchWorst(const DispatchInputs& in, DispatchHandle& handle, const DispatchOutputs& out,
                           int numWorstTokens, int expertAlignment, cudaStream_t stream) {
  if (numWorstTokens < 0) invalid(rank_, "dispatch: numWorstTokens " + std::to_string(numWorstTokens));
  DispatchOutputs o = out;
  o.capacity = numWorstTokens;
  checkDispatchOutputs(in, o);  // before the prepare: once it was launched, every rank must go on to the dispatch
  const bool earlier = impl_->earlierError(rank_, context_);
  launchPrepare(in, handle, expertAlignment, out.numRecvTokensPerExpert, out.numRecvTokens, false, stream);
  launchDispatchKernel(in, handle, o, stream);
  if (throwAfterLaunch(earlier, stream)) impl_->raise(rank_, context_, stream);
}

void Buffer::combine(const CombineInputs& in, const DispatchHandle& handle, const CombineOutputs& out,
                     cudaStream_t stream) {
  if (impl_->broken) invalid(rank_, "combine: an earlier operation timed out or lost a peer; this Buffer is unusable");
  if (handle.owner_ != this || handle.numTokens_ < 0)
    invalid(rank_, "combine: the handle is not one a dispatch of this Buffer filled");
  if (handle.numTokens_ > 0 && (!out.combinedX || reinterpret_cast<uintptr_t>(out.combinedX) % 16 != 0))
    invalid(rank_, "combine: combinedX must be a 16-byte aligned device pointer");
  if (!in.x && handle.numRecvTokens_ != 0) invalid(rank_, "combine: x is needed");
  if (in.x && reinterpret_cast<uintptr_t>(in.x) % 16 != 0) invalid(rank_, "combine: x must be 16-byte aligned");
  // The combine reads the biases with 16-byte loads, as it reads x: a misaligned one would trap the kernel.
  if (reinterpret_cast<uintptr_t>(in.bias0) % 16 != 0 || reinterpret_cast<uintptr_t>(in.bias1) % 16 != 0)
    invalid(rank_, "combine: bias0 and bias1 must be 16-byte aligned");
  const bool earlier = impl_->earlierError(rank_, context_);
  CombineArgs a{};
  a.x = static_cast<const char*>(in.x);
  a.topkWeights = in.topkWeights;
  a.bias0 = static_cast<const char*>(in.bias0);
  a.bias1 = static_cast<const char*>(in.bias1);
  a.out = static_cast<char*>(out.combinedX);
  a.outWeights = out.combinedTopkWeights;
  a.numTokens = handle.numTokens_;
  a.hidden = handle.hidden_;
  a.numTopk = handle.numTopk_;
  a.handle = viewOf(handle);
  GDX_CUDA_CHECK(launchCombine(impl_->team, a, config_, stream));
  if (throwAfterLaunch(earlier, stream)) impl_->raise(rank_, context_, stream);
}

}  // namespace gdx::ep
