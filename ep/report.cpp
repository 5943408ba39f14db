// The Report both Buffers' kernels write, on the host: its record, its words in a message, and when a call throws it
// (ep/report.hpp).
#include "ep/report.hpp"

#include <cstring>

#include "base/cuda_check.hpp"
#include "gdx/device/impl/atomic.hpp"

namespace gdx::ep::detail {

namespace {

const char* waitName(uint32_t where) {
  switch (where) {
    case kWaitArrive: return "the barrier that opens the operation";
    case kWaitCounts: return "the counts exchange";
    case kWaitData: return "the rows";
    case kWaitRow: return "a received row's stamp";
    case kWaitReturnedRow: return "the stamp of a row sent back";
  }
  return "?";
}

// kBadExpertCount's value (packBadCount).
std::string badCount(int64_t packed) {
  return "numTokensPerExpert[" + std::to_string(int32_t(uint64_t(packed) >> 32)) + "] is " +
         std::to_string(int32_t(uint32_t(uint64_t(packed)))) + ", a negative count";
}

}  // namespace

std::string messagePrefix(const ReportSource& who) {
  return std::string(who.mode == BufferMode::kLowLatency ? "gdx::ep low-latency rank " : "gdx::ep rank ") +
         std::to_string(who.rank) + ": ";
}

void throwInvalid(const ReportSource& who, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, messagePrefix(who) + what);
}

std::string describeReport(const Report& r, const ReportSource& who) {
  const bool ll = who.mode == BufferMode::kLowLatency;
  const std::string v = std::to_string(r.value), v2 = std::to_string(r.value2), token = std::to_string(r.token);
  switch (r.kind) {
    case kBadExpert:  // normal mode: the prepare stops (or the layout skips it); low-latency: the entry is skipped
      return ll ? "token " + token + ": expert id " + v + " outside [-1, " + v2 + "): that top-k entry was skipped"
                : "expert id " + v + " outside [-1, " + v2 + ")";
    case kBadExpertCount: return badCount(r.value);
    case kRecvCapacity:  // low-latency: a row past a rank's share, which the send phase's reservation rules out
      return ll ? "internal error: row " + v + " for one expert from token " + token + ", past maxTokensPerRank " + v2
                : v + " rows to receive but the outputs hold " + v2;
    case kBadHandle: return "the handle's routing is not valid (its prepare failed)";
    case kRelayCapacity:
      return "rank " + std::to_string(r.peer) + " relays a rank's " + v + " tokens to its host but its handle holds " +
             v2 + " (with ranks on other hosts, dispatchWorst's handles must hold as many tokens as any rank sends)";
    case kTimeout:
      return "timed out waiting for rank " + std::to_string(r.peer) + " in " + waitName(r.where) +
             (r.where == kWaitRow           ? " (row " + token + ", epoch "
              : r.where == kWaitReturnedRow ? " (token " + token + ", epoch "
                                            : " (epoch ") +
             v + ", seen " + v2 + ")";
    case kPeerFailed:
      return "a peer failed while waiting for rank " + std::to_string(r.peer) + " in " + waitName(r.where);
    case kPeerError:
      return "rank " + std::to_string(r.peer) + " found bad input (" +
             (r.value == kBadExpert        ? "expert id " + v2
              : r.value == kBadExpertCount ? badCount(r.value2)
                                           : "error " + v + ", value " + v2) +
             "), so no rank sent anything";
    case kExpertRows:
      return "low_latency_dispatch refused, nothing sent: token " + token + " names expert " + v +
             " in more than one top-k slot, and the top-k entries naming expert " + v + " (" + v2 +
             ") are more rows than a rank may send one expert (maxTokensPerRank " +
             std::to_string(who.maxTokensPerRank) + ")";
    case kUnmaskRefused:
      return "unmask refused: rank " + std::to_string(r.peer) + " stays masked (ranks bitmask " + v +
             "): a call's wait masked it before the unmask ran, so it missed " +
             "a call and its epochs are not this rank's";
  }
  return (ll ? "error " : "unknown error ") + std::to_string(r.kind);
}

ErrorCode reportCode(uint32_t kind) {
  switch (kind) {
    case kTimeout: return ErrorCode::kTimeout;
    case kPeerFailed: return ErrorCode::kPeerFailed;
    default: return ErrorCode::kInvalidArgument;
  }
}

Error reportError(const Report& r, const ReportSource& who) {
  // A low-latency call's epoch is its number: the message says which call the kernel stopped.
  const std::string call = who.mode == BufferMode::kLowLatency ? " (call " + std::to_string(r.epoch) + ")" : "";
  return Error(reportCode(r.kind), messagePrefix(who) + describeReport(r, who) + call);
}

HostReport::~HostReport() {
  if (host_) cudaFreeHost(host_);
}

void HostReport::allocate() {
  GDX_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(Report), cudaHostAllocMapped));
  std::memset(host_, 0, sizeof(Report));
  GDX_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

uint32_t HostReport::kind() const {
  return atomicLoad(&host_->kind, kAcquire);
}

Report HostReport::take(uint32_t* claim, cudaStream_t stream) {
  const Report r = *host_;
  std::memset(host_, 0, sizeof(Report));
  GDX_CUDA_CHECK(cudaMemsetAsync(claim, 0, sizeof(uint32_t), stream));
  return r;
}

bool throwAfterLaunch(bool earlier, cudaStream_t stream) {
  if (!earlier) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  GDX_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture == cudaStreamCaptureStatusNone;
}

}  // namespace gdx::ep::detail
