// What both Buffers (normal and low-latency mode) do with the Report their kernels write (protocol.hpp): the
// host-mapped record itself, its words turned into a gdx::Error message (the rank, the peer, the operation or wait,
// the values seen), and the one rule of when a collective call throws what a kernel recorded before it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "ep/protocol.hpp"
#include "gdx/error.hpp"

namespace gdx::ep::detail {

/// Which Buffer speaks: it names itself in every message, and a few kinds mean something else in each mode (an
/// expert id out of range stops a normal-mode prepare but only skips its top-k entry in a low-latency dispatch).
enum class BufferMode { kNormal, kLowLatency };

/// Who reports: the Buffer's mode and rank, and the low-latency shape a message may quote.
struct ReportSource {
  BufferMode mode;
  int rank;
  int maxTokensPerRank = 0;  // low-latency mode: LowLatencyConfig::maxTokensPerRank
};

/// "gdx::ep rank R: " or "gdx::ep low-latency rank R: ", the start of every message of that Buffer.
std::string messagePrefix(const ReportSource& who);

/// An argument the host checks before anything is launched: gdx::Error(kInvalidArgument) with the prefix.
[[noreturn]] void throwInvalid(const ReportSource& who, const std::string& what);

/// The words of a recorded Report (no prefix): its kind, the peer and the wait it names, the values seen.
std::string describeReport(const Report& r, const ReportSource& who);

/// The error code of a Report's kind: a timeout and a failed peer keep theirs, bad input is an invalid argument.
ErrorCode reportCode(uint32_t kind);

/// The gdx::Error a recorded Report becomes: prefix, description and, in low-latency mode, the call it stopped.
Error reportError(const Report& r, const ReportSource& who);

/// A Buffer's Report in host-mapped memory (its kernels write it, the host reads it without synchronising): the
/// first error of the Buffer, kept until the host takes it, and State::reportClaim, which lets one kernel write it.
class HostReport {
 public:
  HostReport() = default;
  HostReport(const HostReport&) = delete;
  HostReport& operator=(const HostReport&) = delete;
  ~HostReport();

  /// Allocates the record, zeroed (throws on a CUDA error).
  void allocate();
  /// Its address as kernels see it (Team::report).
  Report* device() const { return device_; }
  /// The kind recorded (kNone: nothing); an acquire, so that the other fields a kernel wrote before it are seen.
  uint32_t kind() const;
  const Report& recorded() const { return *host_; }
  /// Copies the Report out and clears it: the record here, and the kernels' claim `claim` (State::reportClaim) on
  /// `stream` (null: the legacy default stream), so that the next error can be recorded.
  Report take(uint32_t* claim, cudaStream_t stream);

 private:
  Report* host_ = nullptr;
  Report* device_ = nullptr;
};

/// The rule both Buffers follow for an error a kernel recorded before a collective call (`earlier`: the Report held
/// one when the call began, before its checks could throw): the call launches its kernels first and throws it after,
/// where this says so. Thrown before the launch, it would leave the other ranks waiting for a call this rank never
/// made. One its own kernels record meanwhile is left to the next call (whether this call threw would be a race). Not
/// while `stream` is being captured: taking the Report clears it, which a capture would defer to the graph's launch
/// (the next call outside the capture, or checkErrors(), throws it).
bool throwAfterLaunch(bool earlier, cudaStream_t stream);

}  // namespace gdx::ep::detail
