// Post-mortem trace of the proxy (GDX_TRACE=path). Every command a proxy thread takes from a ring, every transport
// operation it posts and every completion it reaps is recorded with its time, ring, peer, window, offset, bytes and
// ring position, in a bounded buffer per proxy thread (GDX_TRACE_EVENTS, the newest events win), and written as
// Chrome/Perfetto trace JSON (chrome://tracing, ui.perfetto.dev) when the proxy stops. A wait that times out logs
// the last events to each peer, so a hang can be read from the log and the file rather than from a debugger.
// With GDX_TRACE unset nothing is recorded and the proxy pays one predictable branch per command.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace gdx {

enum class TraceKind : uint8_t { kPickup, kPost, kComplete, kReject };

struct TraceEvent {
  uint64_t ns = 0;  ///< steady clock
  TraceKind kind = TraceKind::kPickup;
  uint8_t opcode = 0;  ///< the command's Opcode (pick-up, reject); 0xff: a transport operation
  uint16_t ring = 0;   ///< the ring's index in its proxy thread
  int32_t peer = -1;
  uint32_t window = 0;  ///< destination window (pick-up, post)
  uint32_t status = 0;  ///< a Status (completion)
  uint64_t offset = 0;  ///< destination offset
  uint64_t bytes = 0;
  uint64_t position = 0;  ///< ring position (pick-up, reject) or the operation's cookie (post, completion)
};

/// One proxy thread's events: written by that thread, read by whoever writes the file or logs a timeout.
class TraceBuffer {
 public:
  explicit TraceBuffer(size_t capacity) : events_(capacity ? capacity : 1) {}
  void record(const TraceEvent& e) {
    std::lock_guard<std::mutex> lock(mutex_);  // uncontended but for the rare reader
    events_[next_ % events_.size()] = e;
    ++next_;
  }
  /// The events kept, oldest first.
  std::vector<TraceEvent> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
  uint64_t next_ = 0;
};

/// Where this rank's trace goes: GDX_TRACE with "%r" replaced by the rank (without "%r", ".rank<r>" is put before
/// the extension so that ranks sharing a file system do not overwrite each other's trace). Empty when not tracing.
std::string tracePath(const std::string& pattern, int rank);

/// Throws gdx::Error(kInvalidArgument) naming GDX_TRACE, `path` and errno when the file cannot be created or written
/// (checked when the proxy starts, not first found when it stops). An empty path is not tracing: no check.
void checkTraceWritable(const std::string& path);

/// Writes the threads' events as Chrome trace JSON (one process per rank, one track per proxy thread).
void writeChromeTrace(const std::string& path, int rank, const std::vector<const TraceBuffer*>& threads);

/// The last `perPeer` events to each peer, a line each, for the log of a wait that timed out.
std::string recentByPeer(const std::vector<const TraceBuffer*>& threads, size_t perPeer);

}  // namespace gdx
